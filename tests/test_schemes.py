"""Every scheme (hierarchical centralization, the baselines, auto) on real ranks against a
float64 dense sum, bitwise identical across ranks. Few launches: each runs all cases."""
import pytest

from conftest import mpirun


@pytest.mark.parametrize("ranks,transport", [(1, "mpi4py"), (3, "mpi4py"), (4, "mpi4py"),
                                             (2, "horovod"), (5, "horovod"), (3, "torch")])
def test_scheme_cases(ranks, transport):
    proc = mpirun(ranks, "scheme_cases.py", "--transport", transport, "--examples", 4)
    assert "all cases passed" in proc.stdout


def test_scheme_cases_on_two_levels():
    # 2 emulated hosts x 2 ranks, two levels forced: every scheme runs across hosts on the
    # shares, exact against float64, bitwise identical, every unit of the union kept.
    proc = mpirun(4, "scheme_cases.py", "--transport", "mpi4py", "--examples", 4,
                  env={"ZEN_HVD_RANKS_PER_HOST": "2", "ZEN_HVD_TWO_LEVEL": "on"})
    assert "all cases passed" in proc.stdout

