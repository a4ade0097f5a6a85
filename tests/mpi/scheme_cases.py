"""Multi-rank cases for every scheme of zen_hvd.sparse_allreduce, run under mpirun or torchrun.

    mpirun -np N python tests/mpi/scheme_cases.py [--transport mpi4py|horovod] [--examples K]
    torchrun --nproc-per-node N tests/mpi/scheme_cases.py [--examples K]   (no Horovod needed)

Every rank builds all ranks' inputs from a shared seed and checks, for every scheme (and
"auto"): the result against a float64 sum of all inputs (what dense allreduce computes), that
it is bitwise identical on all ranks, that schemes which keep units exactly return the union,
and that bytes sent equal bytes received over all ranks. Exits non-zero at the first failure.
"""
import argparse
import logging
import os

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from common import digest, make_sparse, same_on_all_ranks

import zen_hvd
from zen_hvd import auto, runtime, workloads
from zen_hvd.sync import SCHEMES

parser = argparse.ArgumentParser()
parser.add_argument("--transport", default=None)
parser.add_argument("--examples", type=int, default=6)
args = parser.parse_args()

zen_hvd.init()
n, me = zen_hvd.size(), zen_hvd.rank()
T = args.transport
tr = runtime.get_transport(T)
zen_hvd.set_seed(4321)
ALL = list(SCHEMES) + ["auto"]
EXACT_UNION = {"balanced", "hierarchical", "agsparse", "sparse_ps"}








def rows(M, D, density, overlap, skew, seed, shape=None, dtype=np.float32):
    units = workloads.rank_units(M, n, density, overlap, skew, seed)
    return [make_sparse(u, workloads.rank_values(u, D, r, seed, dtype), shape or (M, D))
            for r, u in enumerate(units)]


def check(name, inputs, schemes=ALL, op=zen_hvd.Sum, rtol=1e-5):
    dense = [t.to_dense() if t.is_sparse else t for t in inputs]
    ref = sum(d.double() for d in dense)
    if op == zen_hvd.Average:
        ref = ref / n
    union = None
    if inputs[me].is_sparse:
        union = torch.cat([t.coalesce().indices() for t in inputs], dim=1)
        union = torch.unique(union, dim=1) if union.numel() else union
    for scheme in schemes:
        tag = f"{name}[{scheme}]"
        zen_hvd.reset_comm_stats()
        out = zen_hvd.sparse_allreduce(inputs[me], name=tag, op=op, scheme=scheme, transport=T)
        stats = zen_hvd.comm_stats()
        got = out.to_dense().double()
        assert out.dtype == inputs[me].dtype and out.shape == inputs[me].shape, f"{tag}: dtype/shape"
        assert out.is_sparse == inputs[me].is_sparse, f"{tag}: layout changed"
        assert torch.allclose(got, ref, rtol=rtol, atol=rtol), \
            f"{tag}: differs from the dense sum (max err {(got - ref).abs().max()})"
        used = zen_hvd.last_sync["scheme"]
        if union is not None and used in EXACT_UNION:
            assert torch.equal(out.indices(), union), f"{tag}: unit set differs from the union"
        assert same_on_all_ranks(tr, digest(out), list(SCHEMES).index(used)), \
            f"{tag}: result (or scheme) not bitwise identical on all ranks"
        table = tr.allgather_int64([stats["bytes_sent"], stats["bytes_received"]])
        assert table[:, 0].sum() == table[:, 1].sum(), f"{tag}: bytes sent != received: {table}"


def empty(M, D):
    return torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64), torch.zeros((0, D)), (M, D),
                                   check_invariants=True)


check("identical", rows(1000, 8, 0.05, 1.0, 0.0, 1))
check("disjoint", rows(1000, 8, 0.05, 0.0, 0.0, 2))
check("zipf_rows", rows(5000, 16, 0.02, 0.3, 1.1, 3))
check("dense_100pct", rows(300, 4, 1.0, 1.0, 0.0, 4))
check("near_dense", rows(600, 1, 0.7, 0.2, 0.0, 5, shape=(600,)))   # SparCML switches to dense
check("all_empty", [empty(100, 8)] * n)
one_empty = rows(400, 8, 0.1, 0.5, 0.0, 6)
one_empty[n - 1] = empty(400, 8)
check("one_rank_empty", one_empty)
check("average", rows(800, 8, 0.05, 0.5, 0.5, 7), op=zen_hvd.Average)
check("float64", rows(800, 3, 0.05, 0.5, 0.5, 8, dtype=np.float64), rtol=1e-12)
check("element_dgc", rows(20_000, 1, 0.05, 0.2, 0.2, 9, shape=(100, 200)))
check("wide_rows", rows(200, 300, 0.1, 0.3, 1.0, 10))                 # OmniReduce block = 1 row
check("dense_in", [t.to_dense() for t in rows(500, 8, 0.05, 0.3, 1.0, 11)])
# half precision (small integer values: exact in bfloat16 and float16 sums of a few ranks)
for half in (torch.bfloat16, torch.float16):
    check(f"{half}", [torch.sparse_coo_tensor(t.indices(), t.values().round().to(half), t.shape)
                      for t in (u.coalesce() for u in rows(400, 4, 0.05, 0.5, 0.0, 12))])

# auto: the same choice on every rank, at every call; the choice is logged and exposed.
# Re-check at every call: two overlapping steps (balanced), then disjoint sets, where
# hierarchical centralization moves fewer bytes whenever n is a power of two.
logging.basicConfig(level=logging.WARNING)
auto.reset()
os.environ["ZEN_HVD_AUTO_RECHECK"] = "1"
os.environ["ZEN_HVD_ROUND_BYTES"] = "0"   # these tensors are tiny: compare bytes alone
os.environ["ZEN_HVD_HASH_BYTES"] = "0"
for step in range(4):
    inputs = rows(4000, 4, 0.02, 0.6 if step < 2 else 0.0, 1.0, 20 + step)
    check("auto_tensor", inputs, schemes=["auto"])
choice = auto.scheme_choices()["auto_tensor[auto]"]
assert choice["calls"] == 4 and choice["scheme"] in auto.CANDIDATES, choice
assert same_on_all_ranks(tr, auto.CANDIDATES.index(choice["scheme"])), "auto chose differently across ranks"
if n in (2, 4) and os.environ.get("ZEN_HVD_TWO_LEVEL") != "on":   # two levels: a choice per share
    assert choice["scheme"] == "hierarchical" and choice["stage_gammas"], choice


@settings(max_examples=args.examples, derandomize=True, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
@given(M=st.integers(1, 2000), D=st.sampled_from([1, 3, 16]), density=st.floats(0, 1),
       overlap=st.floats(0, 1), skew=st.sampled_from([0.0, 1.0, 1.5]), seed=st.integers(0, 2 ** 31))
def random_workloads(M, D, density, overlap, skew, seed):
    check(f"random_{M}_{D}_{seed}", rows(M, D, density, overlap, skew, seed))


random_workloads()
if me == 0:
    print(f"scheme_cases: all cases passed on {n} ranks ({tr.name} transport)")
