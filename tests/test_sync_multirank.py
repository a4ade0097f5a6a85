"""sparse_allreduce on real ranks: 1 to 5 ranks under mpirun, every transport, and under
horovodrun --gloo. The cases themselves are in tests/mpi/sync_cases.py."""
import pytest

from conftest import horovodrun_gloo, mpirun


@pytest.mark.parametrize("transport", ["mpi4py", "horovod"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5])
def test_sync_cases_mpirun(ranks, transport):
    proc = mpirun(ranks, "sync_cases.py", "--transport", transport,
                  "--examples", 20 if ranks in (2, 4) else 8)
    assert "all cases passed" in proc.stdout


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_sync_cases_torch_transport_mpirun(ranks):
    proc = mpirun(ranks, "sync_cases.py", "--transport", "torch", "--examples", 8)
    assert "all cases passed" in proc.stdout and "torch transport" in proc.stdout


@pytest.mark.parametrize("transport,ranks", [("mpi4py", 4), ("torch", 3), ("horovod", 3)])
def test_sync_cases_with_one_rank_delayed_at_random(transport, ranks):
    # Rank 1's messages leave late and in a changing order: the same bits, the same errors.
    proc = mpirun(ranks, "sync_cases.py", "--transport", transport, "--delay", "--examples", 6)
    assert "all cases passed" in proc.stdout


@pytest.mark.parametrize("transport,ranks", [("mpi4py", 4), ("mpi4py", 5), ("torch", 3)])
def test_sync_cases_with_the_pull_around_a_ring(transport, ranks):
    # The Pull's route between hosts (Transport.pull_route), here on one machine: the same
    # sums, the same bits on every rank, the same errors, the bytes counted as forwarded.
    proc = mpirun(ranks, "sync_cases.py", "--transport", transport, "--examples", 6,
                  env={"ZEN_HVD_PULL": "ring"})
    assert "all cases passed" in proc.stdout


@pytest.mark.parametrize("transport,ranks,per_host", [("mpi4py", 4, 2), ("mpi4py", 6, 3), ("torch", 6, 2)])
def test_sync_cases_on_two_levels(transport, ranks, per_host):
    # Hosts of several ranks, emulated on one machine (consecutive ranks to a host): 2 x 2,
    # 2 x 3 and 3 x 2. The whole battery runs the two-level sync where it applies: exact,
    # bitwise identical on every rank, the same errors everywhere (a mismatch across hosts
    # too), the bytes inside the host exact, and flat's bytes from other hosts exact.
    proc = mpirun(ranks, "sync_cases.py", "--transport", transport, "--examples", 4,
                  env={"ZEN_HVD_RANKS_PER_HOST": str(per_host)}, timeout=900)
    assert "all cases passed" in proc.stdout


def test_hosts_that_disagree_on_their_grouping_raise_on_every_rank():
    # ZEN_HVD_RANKS_PER_HOST set on one rank only: every rank raises at the transport's
    # construction, naming the setting, instead of running different rounds.
    proc = mpirun(3, "grouping_case.py", timeout=240, check=False)
    assert proc.returncode == 0 and proc.stdout.count("raised: zen_hvd: the ranks hold different") == 3, \
        proc.stdout[-3000:] + proc.stderr[-3000:]


def test_sync_cases_horovodrun_gloo():
    # No MPI job: the default transport is torch.distributed point to point.
    proc = horovodrun_gloo(3, "sync_cases.py", "--examples", 5)
    assert "all cases passed" in proc.stdout and "torch transport" in proc.stdout


def test_sync_cases_horovodrun_gloo_horovod_transport():
    proc = horovodrun_gloo(3, "sync_cases.py", "--transport", "horovod", "--examples", 5)
    assert "all cases passed" in proc.stdout and "horovod transport" in proc.stdout


def test_gpu_partitioner_in_real_syncs_under_cuda_simulator():
    proc = mpirun(2, "gpu_partition_cases.py",
                  env={"NUMBA_ENABLE_CUDASIM": "1", "ZEN_HVD_PARTITIONER": "gpu"})
    assert "all cases passed" in proc.stdout


def test_device_data_path_under_cuda_simulator():
    # Every step of a balanced sync as a device kernel (balanced.py on backend.Device), simulated on
    # CPU tensors, against the host path bit for bit and a float64 sum.
    proc = mpirun(3, "device_path_cases.py", "--examples", 6, env={"NUMBA_ENABLE_CUDASIM": "1"})
    assert "all cases passed" in proc.stdout


@pytest.mark.parametrize("transport", ["torch", "mpi4py", "horovod"])
def test_device_data_path_with_buffers_moved_as_tensors(transport):
    # ZEN_HVD_DEVICE_BUFFERS=1: the transports move the device path's buffers as tensors, the
    # route CUDA tensors take over NCCL (torch: sizes first, then exact-size point-to-point
    # batches, here over gloo), CUDA-aware MPI (mpi4py) and Horovod's GPU operations. Under
    # the sized protocol, ranks whose tensors sit on different kinds of device raise instead
    # of waiting.
    proc = mpirun(3, "device_path_cases.py", "--transport", transport, "--examples", 3,
                  env={"NUMBA_ENABLE_CUDASIM": "1", "ZEN_HVD_DEVICE_BUFFERS": "1"})
    assert "device buffers moved as tensors" in proc.stdout
    assert transport != "torch" or "mixed devices raised on every rank" in proc.stdout


def test_memory_follows_nnz_on_a_3e9_row_table():
    proc = mpirun(3, "memory_cases.py")
    assert "all cases passed" in proc.stdout


def test_soak_a_few_hundred_random_cases():
    # The soak command itself (python -m zen_hvd.soak runs 10,000): random schemes, shapes,
    # densities, dtypes and layouts on 1 and 3 ranks, each against a float64 reference.
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "zen_hvd.soak", "--cases", "240", "--ranks", "1,3",
                           "--transports", "mpi4py,horovod"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and "0 pairs had differences" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]
