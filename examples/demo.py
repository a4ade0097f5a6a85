"""The main demo: one embedding-sized row-sparse gradient, synchronized three ways.

    scripts/demo.sh                                  # 4 local ranks (sets everything up first)
    mpirun -np 4 python examples/demo.py             # the same, once set up
    torchrun --nproc-per-node 4 examples/demo.py     # without Horovod: its peers are gloo's

Each rank holds the gradient of a (rows x dim) embedding table for a batch of Zipf-distributed
token ids (as in a language model), so ranks overlap on the hot rows. The gradient is summed
over ranks with
  - Zen's balanced parallelism (zen_hvd.sparse_allreduce),
  - Horovod's dense allreduce (hvd.allreduce of the dense table; what sparse_as_dense=True does),
  - Horovod's sparse path (allgather of every rank's indices and values, then a local sum; what
    hvd.DistributedOptimizer does for sparse gradients),
or, without Horovod (torchrun), torch.distributed's dense allreduce and gloo's sparse allreduce
(DDP's own reduction of a sparse gradient: an allgather of every rank's coalesced rows), and
the demo prints bytes received per rank, time per sync (median), and Zen's Push and Pull
imbalance ratios. All three results are checked to be equal.
"""
import argparse

import numpy as np
import torch

import zen_hvd
from zen_hvd import stats, workloads
from zen_hvd.bench.common import gather, human_bytes, share_cores, time_calls

ap = argparse.ArgumentParser()
ap.add_argument("--rows", type=int, default=200_000)
ap.add_argument("--dim", type=int, default=64)
ap.add_argument("--tokens", type=int, default=32768, help="token ids per rank per step")
ap.add_argument("--skew", type=float, default=1.05, help="Zipf exponent of the token ids")
ap.add_argument("--repeats", type=int, default=10)
ap.add_argument("--scheme", default="balanced", help="Zen scheme: balanced, hierarchical or auto")
args = ap.parse_args()

zen_hvd.init()
hvd = zen_hvd.runtime.horovod()   # None under torchrun: the peers are torch.distributed's
share_cores()
n, me = zen_hvd.size(), zen_hvd.rank()
PEER = "Horovod" if hvd is not None else "gloo"
rng = np.random.default_rng([7, me])
# A batch of Zipf-distributed token ids; the gradient has one row per distinct id.
ids = np.minimum(rng.zipf(args.skew, size=args.tokens) - 1, args.rows - 1)
tokens = np.unique(ids)
grad_values = torch.from_numpy(workloads.rank_values(tokens, args.dim, me, 7))
grad = torch.sparse_coo_tensor(torch.from_numpy(tokens).reshape(1, -1), grad_values, (args.rows, args.dim),
                               check_invariants=True)
dense = grad.to_dense()


def zen():
    return zen_hvd.sparse_allreduce(grad, name="demo.embedding", op=zen_hvd.Sum, scheme=args.scheme)


def peer_dense():
    if hvd is None:
        out = dense.clone()
        torch.distributed.all_reduce(out)
        return out
    return hvd.allreduce(dense, name="demo.dense", op=hvd.Sum)


def peer_allgather():
    g = grad.coalesce()
    if hvd is None:   # gloo's sparse allreduce: an allgather of every rank's coalesced rows
        out = g.clone()
        torch.distributed.all_reduce(out)
        return out.coalesce()
    idx = hvd.allgather(g.indices().t().contiguous(), name="demo.ag.idx")
    val = hvd.allgather(g.values(), name="demo.ag.val")
    return torch.sparse_coo_tensor(idx.t(), val, g.shape, check_invariants=True).coalesce()


DENSE, SPARSE = f"{PEER} dense allreduce", f"{PEER} sparse allgather"
results = {"Zen": zen(), DENSE: peer_dense(), SPARSE: peer_allgather()}
ref = results[DENSE]
for label, out in results.items():
    assert torch.allclose(out.to_dense(), ref, atol=1e-5), f"{label} disagrees with dense allreduce"

# Bytes: Zen's are counted by its transport; Horovod's are computed from what each op must
# deliver to a rank (ring allreduce: 2 (n-1)/n of the table; allgather: the others' parts).
t_zen, zen_bytes, _ = time_calls(zen, args.repeats)
info = dict(zen_hvd.last_sync)  # a snapshot: last_sync changes with every sync
t_dense, _, _ = time_calls(peer_dense, args.repeats)
t_ag, _, _ = time_calls(peer_allgather, args.repeats)
g = grad.coalesce()
my_ag_bytes = g.indices().numel() * 8 + g.values().numel() * 4
rows = gather([t_zen, zen_bytes, t_dense, t_ag, my_ag_bytes, g.indices().shape[1]])
if me == 0:
    table_bytes = args.rows * args.dim * 4
    dense_bytes = 2 * (n - 1) / n * table_bytes
    ag_bytes = [sum(r[4] for r in rows) - rows[i][4] for i in range(n)]
    union = int(ref.ne(0).any(dim=1).sum())
    print(f"demo: {n} ranks, embedding {args.rows:,} x {args.dim} float32 ({human_bytes(table_bytes)}), "
          f"{args.tokens:,} Zipf({args.skew}) tokens per rank -> {int(np.mean([r[5] for r in rows])):,} "
          f"rows per rank on average, {union:,} rows in the sum (density {union / args.rows:.2%})")
    print(f"{'scheme':28s} {'bytes received per rank (max)':>30s} {'time per sync (median, ms)':>28s}")
    print(f"{'Zen (' + info['scheme'] + ')':28s} {human_bytes(max(r[1] for r in rows)):>30s} "
          f"{max(r[0] for r in rows) * 1e3:>28.2f}")
    print(f"{DENSE:28s} {human_bytes(dense_bytes):>30s} {max(r[2] for r in rows) * 1e3:>28.2f}")
    print(f"{SPARSE:28s} {human_bytes(max(ag_bytes)):>30s} {max(r[3] for r in rows) * 1e3:>28.2f}")
    if "push_counts" in info:
        print(f"Zen imbalance ratios: Push {stats.push_imbalance(info['push_counts']):.3f}, "
              f"Pull {stats.pull_imbalance(info['pull_counts']):.3f} (1.0 is perfect balance)")
    print("All three results are equal (checked against the dense allreduce).")
    # What that means: Zen receives about twice the union's share of a rank, 2 (n-1)/n |I|,
    # the allgather every other rank's rows, (n-1) k: close at a few ranks, apart at many.
    k = float(np.mean([r[5] for r in rows]))
    print(f"What this means: at {n} ranks the union of the ranks' rows ({union:,}) is "
          f"{union / k:.1f}x one rank's ({k:,.0f}), so Zen's Push and Pull receive about "
          f"{max(r[1] for r in rows) / max(ag_bytes):.2f}x the allgather's bytes; on shared memory both are "
          "bound by the CPU, not by bytes. The allgather's bytes grow with every rank added, (n-1) x k "
          "rows, and Zen's with the union's growth, 2 (n-1)/n x |I|: with hosts on a network Zen pulls "
          "ahead (below).")
