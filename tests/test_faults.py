"""A rank that leaves or runs ahead ends the job with an error naming the tensor and the rank,
instead of a hang (tests/mpi/fault_cases.py). The subprocess timeout is only a guard: the
assertion is mpirun's non-zero exit and the message."""
import pytest

from conftest import mpirun

STALL = {"ZEN_HVD_STALL_SHUTDOWN_TIME_SECONDS": "3", "ZEN_HVD_STALL_CHECK_TIME_SECONDS": "1"}


@pytest.mark.parametrize("mode, expected", [
    # the survivors wait for rank 1's Push; rank 1 said farewell at exit
    ("exit", ["tensor 'fault.second' (Push): rank 1 left after 1 syncs (this rank is in sync 2)"]),
    # rank 1 waits for the others' Push; they finished their 3 steps and left
    ("extra_step", ["tensor 'weight' (Push): ranks [0, 2] left after 3 syncs (this rank is in sync 4)"]),
])
def test_departed_or_extra_rank_ends_the_job(mode, expected):
    # The stall deadline is far: the farewell of the ranks that left ends the wait at once.
    env = {"ZEN_HVD_STALL_SHUTDOWN_TIME_SECONDS": "120"}
    proc = mpirun(3, "fault_cases.py", mode, env=env, timeout=240, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "PeerLeftError" in out and all(e in out for e in expected), out[-3000:]
    assert "returned" not in out


@pytest.mark.parametrize("route", ["direct", "ring"])
def test_a_rank_that_exits_in_the_pull_ends_the_job(route):
    # Direct: every survivor waits for rank 1's Pull message. Ring: only rank 2 (its right
    # neighbour) does; rank 0 waits for rank 2, which raises, and its abort ends the job.
    env = {"ZEN_HVD_STALL_SHUTDOWN_TIME_SECONDS": "120", "ZEN_HVD_PULL": route}
    proc = mpirun(3, "fault_cases.py", "exit_in_pull", env=env, timeout=240, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "PeerLeftError" in out and "tensor 'fault.pull' (Pull): rank 1 left after" in out, out[-3000:]
    assert "returned" not in out


def test_a_rank_that_exits_in_the_sync_across_hosts_ends_the_job():
    # Two levels on 2 emulated hosts x 2 ranks: the last rank exits after the Push inside its
    # host; its peers across hosts and inside its host raise, and so does the other host.
    env = {"ZEN_HVD_STALL_SHUTDOWN_TIME_SECONDS": "120", "ZEN_HVD_RANKS_PER_HOST": "2",
           "ZEN_HVD_TWO_LEVEL": "on"}
    proc = mpirun(4, "fault_cases.py", "exit_across", env=env, timeout=240, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "PeerLeftError" in out and "tensor 'fault.across'" in out, out[-3000:]
    assert "returned" not in out


@pytest.mark.parametrize("transport", ["mpi4py", "horovod"])
def test_a_second_step_without_backward_raises_on_every_rank(transport):
    # Rank 1's extra step() would add its synchronized gradient to the others' next one.
    proc = mpirun(3, "fault_cases.py", "step_again", transport, env=STALL, timeout=240, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    each = ("tensor '0.weight': ranks are out of step (rank 0: optimizer step 3 with a new "
            "gradient, rank 1: optimizer step 3 with its last step's gradient again")
    assert all(f"rank {r} raised: zen_hvd: {each}" in out for r in range(3)), out[-3000:]
    assert "finished" not in out


def test_a_silent_rank_ends_the_job_at_the_stall_deadline():
    # Rank 1 stays alive but stops syncing: no farewell, so the deadline ends the wait.
    proc = mpirun(3, "fault_cases.py", "hang", env=STALL, timeout=240, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "StallError" in out and "tensor 'fault.second'" in out and "rank 1" in out, out[-3000:]
    assert "returned" not in out


def test_ranks_on_different_transports_agree_first():
    # Rank 1 syncs over Horovod's collectives, the others over mpi4py: the agreement at the
    # first use raises on every rank, without waiting for the stall deadline (none is set;
    # nor is the abort on an uncaught error, so each rank's own error shows).
    env = {"ZEN_HVD_STALL_SHUTDOWN_TIME_SECONDS": "0", "ZEN_HVD_ABORT_ON_ERROR": "0"}
    proc = mpirun(3, "fault_cases.py", "transport", env=env, timeout=240, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    each = "rank 0: 'mpi4py', rank 1: 'horovod', rank 2: 'mpi4py'"
    assert out.count(each) == 3 and "TensorMismatchError" in out, out[-3000:]
    assert "over mixed transports returned" not in out


def test_uncaught_error_on_one_rank_ends_the_job():
    # No stall deadline: only the abort of the failing rank (stall.abort_on_uncaught) ends it.
    env = {"ZEN_HVD_STALL_SHUTDOWN_TIME_SECONDS": "0"}
    proc = mpirun(3, "fault_cases.py", "raise", env=env, timeout=240, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "rank 1 fails between syncs" in out, out[-3000:]
    assert "returned" not in out
