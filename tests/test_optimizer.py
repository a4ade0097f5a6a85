"""zen_hvd.DistributedOptimizer on real ranks, against horovod.torch.DistributedOptimizer and a
one-process reference: 2 and 4 ranks under mpirun (mpi4py transport) and horovodrun --gloo
(torch.distributed transport). The cases are in tests/mpi/optimizer_cases.py."""
import pytest

from conftest import horovodrun_gloo, mpirun


@pytest.mark.parametrize("ranks", [2, 4])
def test_optimizer_cases_mpirun(ranks):
    proc = mpirun(ranks, "optimizer_cases.py", timeout=300)
    assert "all cases passed (" in proc.stdout
    assert f" cases, {ranks} ranks, mpi, transport mpi4py)" in proc.stdout


def test_optimizer_cases_on_two_levels():
    # 2 emulated hosts x 2 ranks, two levels forced: the optimizer's syncs run them (the
    # cases assert it) and still match Horovod's optimizer and the one-process reference.
    proc = mpirun(4, "optimizer_cases.py", timeout=300,
                  env={"ZEN_HVD_RANKS_PER_HOST": "2", "ZEN_HVD_TWO_LEVEL": "on"})
    assert "all cases passed (17 cases, 4 ranks, mpi, transport mpi4py)" in proc.stdout


@pytest.mark.parametrize("ranks", [2, 4])
def test_optimizer_cases_horovodrun_gloo(ranks):
    proc = horovodrun_gloo(ranks, "optimizer_cases.py", timeout=300)
    assert "all cases passed (" in proc.stdout
    assert f" cases, {ranks} ranks, gloo, transport torch)" in proc.stdout
