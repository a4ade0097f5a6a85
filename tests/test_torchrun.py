"""zen_hvd without Horovod: under torchrun (torch.distributed's default group, gloo), as a DDP
comm hook, and with Horovod made unimportable (tests/no_horovod), on real processes."""
import pytest

from conftest import NO_HOROVOD, mpirun, torchrun


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_sync_cases_torchrun(ranks):
    # Every case of sync_cases.py (every scheme, errors, bytes, random workloads) against a
    # float64 sum, through the torch transport on torchrun's group.
    proc = torchrun(ranks, "sync_cases.py", "--examples", 6, env=NO_HOROVOD)
    assert "all cases passed" in proc.stdout and "torch transport" in proc.stdout


def test_every_scheme_torchrun():
    proc = torchrun(3, "scheme_cases.py", "--examples", 3, env=NO_HOROVOD)
    assert "all cases passed on 3 ranks" in proc.stdout


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_ddp_hook_matches_ddp_and_resumes_exactly(ranks):
    proc = torchrun(ranks, "ddp_cases.py", env=NO_HOROVOD)
    assert f"ddp_cases: all cases passed on {ranks} ranks (cpu tensors)" in proc.stdout


def test_ddp_hook_on_two_levels():
    # 2 emulated hosts x 2 ranks, two levels forced: the hook's sparse buckets run them (the
    # cases assert it), equal to DDP's own reduction, and the checkpoint resumes exactly.
    proc = torchrun(4, "ddp_cases.py", env={**NO_HOROVOD, "ZEN_HVD_RANKS_PER_HOST": "2", "ZEN_HVD_TWO_LEVEL": "on"})
    assert "ddp_cases: all cases passed on 4 ranks (cpu tensors)" in proc.stdout


def test_ddp_hook_models_that_differ_raise_on_every_rank():
    proc = torchrun(3, "ddp_cases.py", "--case", "mismatch", env=NO_HOROVOD)
    for r in range(3):
        assert f"rank {r}: raised zen_hvd.ddp.zen_hook: the ranks' DDP buckets differ" in proc.stdout


@pytest.mark.parametrize("case, text", [
    ("exit", "lost rank 2: rank 2 left after 2 syncs"),
    ("stall", "gave up waiting for rank 2 after the stall shutdown time")])
def test_ddp_hook_a_rank_that_exits_or_stalls_ends_the_job_naming_it(case, text):
    proc = torchrun(3, "ddp_cases.py", "--case", case, check=False, timeout=240,
                    env=dict(NO_HOROVOD, ZEN_HVD_STALL_SHUTDOWN_TIME_SECONDS="10"))
    assert proc.returncode != 0
    assert text in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


def test_mpirun_without_horovod():
    # zen_hvd.init() under mpirun with Horovod unimportable: torch.distributed among the MPI
    # ranks, and the mpi4py transport (the default in an MPI job).
    proc = mpirun(3, "sync_cases.py", "--examples", 3, env=NO_HOROVOD)
    assert "all cases passed on 3 ranks (mpi4py transport)" in proc.stdout


def test_import_without_horovod_and_its_names_say_why():
    import subprocess
    import sys

    code = ("import zen_hvd, sys; assert 'horovod' not in sys.modules; print(zen_hvd.Sum, zen_hvd.Average)\n"
            "try:\n    zen_hvd.allgather\nexcept AttributeError as e:\n    print(e)\n"
            "try:\n    zen_hvd.DistributedOptimizer(None)\nexcept ImportError as e:\n    print(e)\n")
    import os
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, **NO_HOROVOD), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("1 0")
    assert "zen_hvd.allgather is Horovod's allgather, and Horovod cannot be imported" in proc.stdout
    assert "zen_hvd.ddp.zen_hook" in proc.stdout


def test_ddp_hook_says_which_bucket_it_cannot_handle():
    import torch

    from zen_hvd import ddp

    class Bucket:   # what DDP hands a hook: a complex-valued bucket, which zen_hvd does not sum
        def buffer(self):
            return torch.zeros(4, dtype=torch.complex64)

        def index(self):
            return 3

        def parameters(self):
            return [torch.zeros(4, dtype=torch.complex64)]

    with pytest.raises(TypeError, match="bucket 3 holds torch.complex64 gradients"):
        ddp.zen_hook(ddp.ZenState(), Bucket())
    with pytest.raises(ValueError, match="start_dgc_iter must be an integer >= 1"):
        ddp.ZenState(dgc=0.1, start_dgc_iter=0)
    with pytest.raises(TypeError, match="dgc must be None, a ratio"):
        ddp.ZenState(dgc="5%")


def test_demo_under_torchrun_without_horovod():
    import os
    import sys

    from conftest import HERE, _run, _free_port

    demo = os.path.join(HERE, "..", "examples", "demo.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(_free_port()), demo, "--rows", "20000", "--tokens", "2000", "--repeats", "2"]
    proc = _run(cmd, dict(os.environ, OMP_NUM_THREADS="1", **NO_HOROVOD), 300)
    assert "gloo sparse allgather" in proc.stdout
    assert "All three results are equal" in proc.stdout
