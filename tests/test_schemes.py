"""Every scheme (hierarchical centralization, the baselines, auto) on real ranks against a
float64 dense sum, bitwise identical across ranks. Few launches: each runs all cases."""
import pytest

from conftest import mpirun


@pytest.mark.parametrize("ranks,transport", [(1, "mpi4py"), (3, "mpi4py"), (4, "mpi4py"),
                                             (2, "horovod"), (5, "horovod"), (3, "torch")])
def test_scheme_cases(ranks, transport):
    proc = mpirun(ranks, "scheme_cases.py", "--transport", transport, "--examples", 4)
    assert "all cases passed" in proc.stdout
