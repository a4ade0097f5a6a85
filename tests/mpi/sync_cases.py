"""Multi-rank cases for zen_hvd.sparse_allreduce, run under mpirun or horovodrun.

    mpirun -np N python tests/mpi/sync_cases.py [--transport mpi4py|horovod|torch] [--examples K]
    torchrun --nproc-per-node N tests/mpi/sync_cases.py [--examples K]     (no Horovod needed)
    ... sync_cases.py --delay            (rank 1's messages leave after random pauses)

Every rank builds every rank's input from a shared seed, so each rank checks its result
against an independent float64 sum of all inputs (what a dense allreduce computes), checks
that the result is bitwise identical on all ranks, and that no unit is lost. With --delay rank 1 sends every message after a random pause, so the
others receive its messages late and in a changing order: every sync then runs twice, without
the pauses and with them, and the two results must be the same bits (the servers add in rank
order whatever order the parts arrive in); the error cases run with the pauses. Exits non-zero
(on every rank) at the first failure.
"""
import argparse
import sys

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from common import DelayedSends, digest, make_sparse, same_on_all_ranks

import zen_hvd
from zen_hvd import auto, runtime, workloads
from zen_hvd.header import InvalidTensorError, TensorMismatchError

parser = argparse.ArgumentParser()
parser.add_argument("--transport", default=None)
parser.add_argument("--examples", type=int, default=25)
parser.add_argument("--delay", action="store_true")
args = parser.parse_args()

zen_hvd.init()
n, me = zen_hvd.size(), zen_hvd.rank()
T = args.transport
tr = runtime.get_transport(T)
delayed = DelayedSends(tr, seed=7) if args.delay and me == 1 else None
if delayed:
    delayed.on = True
DT = {"float32": torch.float32, "float64": torch.float64}


def check(name, inputs, op=zen_hvd.Sum, rtol=1e-5, **kw):
    """inputs: the tensors of all ranks; this rank syncs inputs[me]."""
    scheme = kw.get("scheme", "auto")
    if scheme == "auto":   # the scheme auto runs this call (it may change at the next)
        scheme = zen_hvd.scheme_choices().get(name, {}).get("scheme", auto.FIRST)
    out = zen_hvd.sparse_allreduce(inputs[me], name=name, op=op, transport=T, **kw)
    if args.delay:   # once more, rank 1's messages not delayed: the same bits
        if delayed:
            delayed.on = False
        plain = zen_hvd.sparse_allreduce(inputs[me], name=name, op=op, transport=T, **{**kw, "scheme": scheme})
        if delayed:
            delayed.on = True
        assert digest(plain) == digest(out), f"{name}: the result depends on the order messages arrive in"
    dense = [t.to_dense() if t.is_sparse else t for t in inputs]
    ref = sum(d.double() for d in dense)
    if op == zen_hvd.Average:
        ref = ref / n
    assert out.is_sparse == inputs[me].is_sparse, f"{name}: layout changed"
    assert out.dtype == inputs[me].dtype and out.shape == inputs[me].shape, f"{name}: dtype/shape"
    got = out.to_dense().double()
    assert torch.allclose(got, ref, rtol=rtol, atol=rtol, equal_nan=True), \
        f"{name}: result differs from the dense sum (max err {(got - ref).abs().nan_to_num().max()})"
    if out.is_sparse:
        union = torch.cat([t.coalesce().indices() for t in inputs], dim=1)
        union = torch.unique(union, dim=1) if union.numel() else union
        if kw.get("coalesced", True):
            assert out.is_coalesced(), f"{name}: sparse result not coalesced"
            assert torch.equal(out.indices(), union), f"{name}: unit set differs from the union"
        else:   # each unit of the union once, in any order; marked coalesced only if ascending
            idx = out._indices()
            assert torch.equal(torch.unique(idx, dim=1) if idx.numel() else idx, union) and \
                idx.shape[1] == union.shape[1], f"{name}: not each unit of the union once"
            flat = np.ravel_multi_index(tuple(idx.numpy()), out.shape[:idx.shape[0]]) if idx.numel() else []
            assert out.is_coalesced() == bool(len(flat) < 2 or (np.diff(flat) > 0).all()), \
                f"{name}: marked coalesced though its units descend (or the reverse)"
    assert same_on_all_ranks(tr, digest(out)), f"{name}: result not bitwise identical on all ranks"
    return out


def workload(M, D, density, overlap, skew, seed, dtype=np.float32):
    units = workloads.rank_units(M, n, density, overlap, skew, seed)
    return units, [workloads.rank_values(u, D, r, seed, dtype) for r, u in enumerate(units)]


def rows(M, D, density, overlap, skew, seed, dtype=np.float32):
    units, values = workload(M, D, density, overlap, skew, seed, dtype)
    return [make_sparse(u, v, (M, D)) for u, v in zip(units, values)]


def expect_error(kind, name, inputs, **kw):
    try:
        zen_hvd.sparse_allreduce(inputs[me], name=name, transport=T, **kw)
    except kind as e:
        assert name in str(e), f"{name}: error does not name the tensor: {e}"
        return str(e)
    raise AssertionError(f"{name}: expected {kind.__name__} on rank {me}")


# -- controlled workloads -------------------------------------------------------------------
check("identical", rows(1000, 8, 0.05, 1.0, 0.0, 1))
check("disjoint", rows(1000, 8, 0.05, 0.0, 0.0, 2))
check("zipf_rows", rows(5000, 16, 0.02, 0.3, 1.1, 3))
check("dense_100pct", rows(300, 4, 1.0, 1.0, 0.0, 4))
def empty(M, D):
    return torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64), torch.zeros((0, D)), (M, D))


check("all_empty", [empty(100, 8)] * n)
for scheme in ("auto", *zen_hvd.sync.SCHEMES):   # an empty table (M = 0), as hvd.allreduce takes it
    check(f"zero_rows_{scheme}", [empty(0, 8)] * n, scheme=scheme)
    check(f"zero_rows_dense_{scheme}", [torch.zeros(0, 8)] * n, scheme=scheme)
one_empty = rows(400, 8, 0.1, 0.5, 0.0, 5)
one_empty[n - 1] = empty(400, 8)
check("one_rank_empty", one_empty)
check("average", rows(800, 8, 0.05, 0.5, 0.5, 6), op=zen_hvd.Average)
check("float64", rows(800, 3, 0.05, 0.5, 0.5, 7, np.float64), rtol=1e-12)
# messages of hundreds of KB: past the torch transport's first part (EAGER bytes), its rest
for scheme in ("balanced", "hierarchical", "agsparse"):
    check(f"large_{scheme}", rows(60_000, 16, 0.3, 0.5, 0.0, 10), scheme=scheme)
# element-sparse 1-D and 3-D, uncoalesced duplicates (summed, not dropped)
u, v = workload(10_000, 1, 0.01, 0.5, 1.0, 8)
check("element_1d", [make_sparse(a, b, (10_000,)) for a, b in zip(u, v)])
check("element_3d", [make_sparse(a, b, (10, 20, 50)) for a, b in zip(u, v)])
dup = [torch.sparse_coo_tensor(torch.tensor([[3, 7, 3, 3 + r]]), torch.tensor([1.0, 2.0, 4.0, 8.0]), (50,))
       for r in range(n)]
check("uncoalesced", dup)
# coalesced=False: the union's units once each, in the servers' order, on every scheme
for scheme in ("balanced", "hierarchical", "agsparse", "auto"):
    check(f"unordered_{scheme}", rows(3000, 8, 0.05, 0.5, 1.0, 13), scheme=scheme, coalesced=False)
    check(f"unordered_uncoalesced_{scheme}", dup, scheme=scheme, coalesced=False)
# dense in, dense out (rows of a 2-D table; elements of a 1-D tensor), NaN and Inf propagate
dense_rows = [t.to_dense() for t in rows(500, 8, 0.05, 0.3, 1.0, 9)]
check("dense_rows", dense_rows)
check("dense_elements", [t.reshape(-1) for t in dense_rows])
nan_inputs = [t.clone() for t in dense_rows]
nan_inputs[0][3, 1] = float("nan")
nan_inputs[n - 1][4, 2] = float("inf")
out = check("nan_inf", nan_inputs)
assert torch.isnan(out[3, 1]) and torch.isinf(out[4, 2]) or n == 1 and torch.isinf(out[4, 2])

# The one-shot allgather's unordered result (the optimizer's): every rank's entries in rank
# order, duplicates kept and scaled once, as Horovod's sparse_allreduce returns them.
for name, inputs in (("oneshot_unordered", rows(3000, 8, 0.05, 0.5, 1.0, 12)),
                     ("oneshot_unordered_uncoalesced", dup)):
    layout, units, values, info = zen_hvd.sync.allreduce_units(
        inputs[me], name=name, op=zen_hvd.Average, scheme="agsparse", transport=T,
        postscale_factor=2.0, ordered=False, repeats=True)
    nnz = [t._nnz() for t in inputs]
    assert units.size == sum(nnz) and info["nnz"].tolist() == nnz, f"{name}: not every entry kept"
    rank_order = np.concatenate([t._indices()[0].numpy() for t in inputs])
    assert np.array_equal(units, rank_order), f"{name}: entries not in rank order"
    out = zen_hvd.sync.result(inputs[me], layout, units, values)
    assert out.is_coalesced() == bool(units.size < 2 or (np.diff(units) > 0).all()), \
        f"{name}: marked coalesced though its units repeat or descend (or the reverse)"
    ref = 2.0 * sum(t.to_dense().double() for t in inputs) / n
    assert torch.allclose(out.to_dense().double(), ref, rtol=1e-5, atol=1e-5), f"{name}: wrong sum"
    assert info["union_size"] == torch.unique(torch.from_numpy(units)).numel(), f"{name}: union size"
    assert same_on_all_ranks(tr, digest(values)), f"{name}: not bitwise identical on all ranks"

# -- byte counters ---------------------------------------------------------------------------
from zen_hvd.cuda_kernels import h0  # noqa: E402
from zen_hvd import two_level  # noqa: E402
from zen_hvd.header import COUNTS  # noqa: E402
from zen_hvd.wire import bitmap_nbytes  # noqa: E402
pad8 = lambda x: (x + 7) // 8 * 8  # noqa: E731


def received(info, M, n, me, peers):
    """The data bytes a balanced sync of n ranks brought this rank from `peers` (ranks and
    servers), from its info: Push parts, and Pull messages (tag, index part: the smaller of
    bitmap and positions; indices as int32, 8 float32 values per row)."""
    push = sum(pad8(c * 4) + c * 32 for r, c in enumerate(info["push_counts"][:, me]) if r in peers)
    return push + sum(8 + min(bitmap_nbytes(h0.server_size(M, n, s)), pad8(k * 4)) + k * 32
                      for s, k in enumerate(info["pull_counts"]) if s in peers)


def check_bytes(name, M, density):
    """Counters: conservation over ranks, and the exact sizes of Push and Pull; of them, those
    from other hosts; and with two levels (several ranks per host: ZEN_HVD_RANKS_PER_HOST) the
    exact bytes inside the host."""
    zen_hvd.reset_comm_stats()
    inputs = rows(M, 8, density, 0.4, 1.0, 10)
    twice = 2 if args.delay else 1
    check(name, inputs, two_level="off")
    stats = zen_hvd.comm_stats()
    table = tr.allgather_int64([stats["bytes_sent"], stats["bytes_received"], stats["off_host_sent"],
                                stats["off_host_received"]])
    assert (table[:, 0].sum(), table[:, 2].sum()) == (table[:, 1].sum(), table[:, 3].sum()), \
        f"bytes sent != received over ranks: {table}"
    info = zen_hvd.last_sync
    expected = received(info, M, n, me, [r for r in range(n) if r != me])
    assert stats["bytes_received"] == expected * twice, (name, stats, expected)
    union = np.unique(np.concatenate([t.coalesce().indices()[0].numpy() for t in inputs]))
    assert sum(info["pull_counts"]) == union.size
    # from other hosts: Push parts with their headers; Pull messages directly from their
    # server, or all of them from the left neighbour around the ring
    off = [r for r in range(n) if tr.off_host(r)]
    header = 8 * (COUNTS + n)
    off_push = received(dict(info, pull_counts=[]), M, n, me, off) + header * len(off)
    pull = received(dict(info, push_counts=np.zeros((n, n), np.int64)), M, n, me, range(n)) - \
        received(dict(info, push_counts=np.zeros((n, n), np.int64)), M, n, me, [me])
    off_pull = received(dict(info, push_counts=np.zeros((n, n), np.int64)), M, n, me, off)
    if tr.pull_route() == "ring":
        off_pull = pull if tr.off_host((me - 1) % n) else 0
    assert stats["off_host_received"] == (off_push + off_pull) * twice, (name, stats, off_push, off_pull)
    lv = two_level.levels(tr)
    if lv is None:
        return
    before = lv.local.stats.bytes_received
    check(name + "_two_level", inputs, two_level="on")
    info, L, l = zen_hvd.last_sync, lv.per_host, lv.local.rank
    assert info["two_level"] and info["push_counts"].shape == (L, L)
    expected = received(info, M, L, l, [r for r in range(L) if r != l])
    assert lv.local.stats.bytes_received - before == expected * twice, (name, expected)
    assert sum(info["pull_counts"]) == union.size
    stats = zen_hvd.comm_stats()
    table = tr.allgather_int64([stats["off_host_sent"], stats["off_host_received"]])
    assert table[:, 0].sum() == table[:, 1].sum(), f"bytes sent != received over hosts: {table}"


check_bytes("bytes_bitmap", 4000, 0.05)        # dense enough that Pull sends hash bitmaps
check_bytes("bytes_positions", 200_000, 0.001)  # so sparse that Pull sends positions

# -- bad input: the same clear error on every rank, and the next sync still works ----------
good = rows(100, 4, 0.1, 0.5, 0.0, 11)
if n > 1:
    shapes = [torch.zeros(100 + (r == 1), 4) for r in range(n)]
    msg = expect_error(TensorMismatchError, "shape_mismatch", shapes)
    assert "shape differs" in msg
    me_op = zen_hvd.Sum if me == 1 else zen_hvd.Average
    msg = expect_error(TensorMismatchError, "op_mismatch", good, op=me_op)
    assert "rank 1: Sum" in msg and "rank 0: Average" in msg, msg
    zero_on_one = [torch.zeros(0 if r == 1 else 5, 4).to_sparse(1) for r in range(n)]
    assert "shape differs" in expect_error(TensorMismatchError, "zero_rows_on_one_rank", zero_on_one)
    dtypes = [torch.zeros(10, 4, dtype=torch.float64 if r == 1 else torch.float32) for r in range(n)]
    assert "dtype differs" in expect_error(TensorMismatchError, "dtype_mismatch", dtypes)
    units_ = [torch.zeros(10, 4) if r != 1 else torch.zeros(10, 4).to_sparse(1) for r in range(n)]
    expect_error(TensorMismatchError, "layout_mismatch", units_)
    zen_hvd.set_seed(1234 + (me == 1))
    assert "seed differs" in expect_error(TensorMismatchError, "seed_mismatch", good)
    zen_hvd.set_seed(1234)
    names = expect_error(TensorMismatchError, "name_a" if me == 0 else "name_b", good)
    assert "different tensors" in names and "rank 0: 'name_a'" in names and "rank 1: 'name_b'" in names, names
oob = [torch.sparse_coo_tensor(torch.tensor([[1, 150]]), torch.ones(2, 4), (200, 4)) for r in range(n)]
oob[n - 1] = torch.sparse_coo_tensor(torch.tensor([[1, 250]]), torch.ones(2, 4), (200, 4),
                                     check_invariants=False)
for scheme in ("auto", "agsparse"):
    msg = expect_error(InvalidTensorError, f"out_of_range_{scheme}", oob, scheme=scheme)
    assert f"rank {n - 1}" in msg and "250" in msg, msg
if n > 1:   # ranks of the two schemes whose headers ride in their Push meet in that round
    mixed = "agsparse" if me == n - 1 else "balanced"
    msg = expect_error(TensorMismatchError, "scheme_mismatch", good, scheme=mixed)
    assert "scheme differs" in msg and f"rank {n - 1}: agsparse" in msg, msg
    assert "shape differs" in expect_error(TensorMismatchError, "shape_mismatch_agsparse", shapes,
                                           scheme="agsparse")
check("after_errors", good)


# -- property-based: random workloads (the same examples on every rank: derandomized) -------
@settings(max_examples=args.examples, derandomize=True, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
@given(M=st.integers(1, 3000), D=st.sampled_from([1, 2, 5, 16]), density=st.floats(0, 1),
       overlap=st.floats(0, 1), skew=st.sampled_from([0.0, 0.5, 1.0, 1.5]),
       seed=st.integers(0, 2 ** 31), op=st.sampled_from(["sum", "avg"]),
       dense=st.booleans(), coalesced=st.booleans())
def random_workloads(M, D, density, overlap, skew, seed, op, dense, coalesced):
    inputs = rows(M, D, density, overlap, skew, seed)
    if dense:
        inputs = [t.to_dense() for t in inputs]
    check(f"random_{M}_{D}_{seed}", inputs, op=zen_hvd.Sum if op == "sum" else zen_hvd.Average,
          coalesced=coalesced)


random_workloads()

# Horovod's sparse_allreduce_async call on Zen's sync: a handle whose call returns the result.
inputs = rows(500, 4, 0.05, 0.5, 0.0, 11)
handle = zen_hvd.sparse_allreduce_async(inputs[me], name="async", op=zen_hvd.Sum, transport=T)
got, ref = handle().to_dense().double(), sum(t.to_dense().double() for t in inputs)
assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5), "sparse_allreduce_async: wrong sum"
if me == 0:
    print(f"sync_cases: all cases passed on {n} ranks ({tr.name} transport)")
