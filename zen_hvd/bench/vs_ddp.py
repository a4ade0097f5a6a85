"""Zen's DDP comm hook against DDP's own reduction, on one embedding's training step, side by side
in one launch.

    python -m zen_hvd.bench.vs_ddp [--ranks 4] [--emulate 250mbit] [--repeats 10] [--scheme auto]
                                   [--vocab 200000] [--dim 64] [--tokens 4096] [--zipf 1.05]
                                   [--out F.csv]

Every rank trains three torch.nn.parallel.DistributedDataParallel copies of one model, an
nn.Embedding(--vocab, --dim) with the loss sum(embedding(ids) * w), SGD without momentum: ids
are --tokens lookups drawn from Zipf(--zipf) (this rank's own, the same at every step), w fixed
random values, so every step's gradient is bench.vs_horovod's (rows ids, uncoalesced, values w).
Repeat after repeat, in turn (the order turning each repeat):
  ddp-sparse  sparse=True, DDP's own reduction: gloo's sparse allreduce (each rank's gradient
              coalesced, then every rank's indices and values allgathered and summed), over n
  ddp-dense   sparse=False, DDP's own reduction: the dense allreduce of the whole table
  ddp-zen     sparse=True, zen_hvd.ddp.zen_hook registered (ZenState(scheme=--scheme))
Prints per method: the median time of a training step (forward, backward, where DDP syncs, and
the optimizer's step; each repeat's slowest rank); the median time of the sync alone (each
repeat's slowest rank), on the same gradient outside DDP, started together after a barrier:
dist.all_reduce of the sparse gradient or of the dense one, divided by n as DDP does, and for
Zen the hook's own call for a sparse bucket (gradients.sync_rows); the bytes one rank receives
per step (the largest over ranks): Zen's counted by its transports (data and control bytes),
DDP's computed from tensor sizes, the allgather's sum over the other ranks r of k_r (8 + 4 D)
for their k_r coalesced rows (gloo's few bytes of metadata apart), the ring allreduce's
2 (n-1)/n V 4 D; and each as a ratio to ddp-sparse's.
Checked, so that a broken sync fails loudly (exit 1): at the first step the three models'
gradients and the three syncs' results equal the dense allreduce's (float rounding apart), and
after the last repeat the three models' parameters are equal. --out writes the table as CSV.

Started plainly it runs itself under torchrun (--ranks local processes, each bound to one core
as bench.common.mpirun_command binds MPI ranks), or with --emulate under one torchrun agent per
network namespace joined by tc-limited links (scripts/netns_cluster.sh torchrun, needs root);
started under torchrun, it runs on that job's ranks.
"""
from __future__ import annotations

import argparse
import gc
import os
import shlex
import subprocess
import sys
import time

from .common import add_embedding_args

METHODS = ("ddp-sparse", "ddp-dense", "ddp-zen")


def parse():
    import zen_hvd

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_embedding_args(ap, repeats=10, rate="250mbit")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps (DDP rebuilds its buckets, "
                                                          "the hook checks layouts, auto profiles)")
    ap.add_argument("--scheme", choices=["auto", *zen_hvd.SCHEMES], default="auto")
    ap.add_argument("--lr", type=float, default=0.01)
    return ap.parse_args()


def bind_local_rank():
    """Several local ranks: each on one core, wrapping over the cores (torchrun binds none)."""
    local, count = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if count > 1 and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[local % len(cores)]})


def child(args):
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import zen_hvd
    from zen_hvd import gradients
    from zen_hvd.bench.common import share_cores
    from zen_hvd.bench.vs_horovod import rank_lookups

    zen_hvd.init()
    bind_local_rank()
    share_cores()
    n, me = dist.get_world_size(), dist.get_rank()
    zen_hvd.set_seed(12345)
    V, D = args.vocab, args.dim
    ids, w = rank_lookups(args, me)
    rows = int(torch.unique(ids).numel())

    class Lookup(nn.Module):
        def __init__(self, sparse):
            super().__init__()
            self.embedding = nn.Embedding(V, D, sparse=sparse)

        def forward(self, ids, w):
            return (self.embedding(ids) * w).sum()

    models, opts = {}, {}
    for m in METHODS:
        torch.manual_seed(args.seed)   # the same initial table for all three
        models[m] = DistributedDataParallel(Lookup(sparse=m != "ddp-dense"))
        opts[m] = torch.optim.SGD(models[m].parameters(), lr=args.lr)
    models["ddp-zen"].register_comm_hook(zen_hvd.ddp.ZenState(scheme=args.scheme), zen_hvd.ddp.zen_hook)

    def train_step(m):
        """One step of method m: (its seconds, Zen's bytes received in it)."""
        opts[m].zero_grad()
        dist.barrier()
        before = zen_received()
        t0 = time.perf_counter()
        models[m](ids, w).backward()
        opts[m].step()
        return time.perf_counter() - t0, zen_received() - before

    # The gradient each step makes, for the syncs alone.
    local = torch.sparse_coo_tensor(ids.reshape(1, -1), w, (V, D), check_invariants=True)
    dense = local.to_dense()
    world = dist.group.WORLD

    def ddp_sparse(out):   # gloo's sparse allreduce works in place
        dist.all_reduce(out)
        return out.div_(n)

    def ddp_dense(out):
        dist.all_reduce(out.div_(n))
        return out

    def ddp_zen(grad):     # the hook's own call for a sparse bucket (zen_hvd.ddp.zen_hook)
        return gradients.sync_rows(grad, grad, repeats=True, name="bench.vs_ddp.zen", op=zen_hvd.Average,
                                   scheme=args.scheme, transport=None, process_group=world)[0]

    syncs = {"ddp-sparse": (ddp_sparse, local), "ddp-dense": (ddp_dense, dense), "ddp-zen": (ddp_zen, local)}

    def sync_alone(m):
        """The sync of method m alone, on the gradient: (its seconds, its result)."""
        fn, grad = syncs[m]
        grad = grad.clone()   # copied before the clock starts: the allreduces work in place
        dist.barrier()
        t0 = time.perf_counter()
        out = fn(grad)
        return time.perf_counter() - t0, out

    # Correctness first: every gradient and every sync against the dense allreduce's mean.
    ref = sync_alone("ddp-dense")[1]
    agree = {}
    for m in METHODS:
        train_step(m)
        grad = models[m].module.embedding.weight.grad
        same_grad = torch.allclose(grad.to_dense(), ref, rtol=1e-4, atol=1e-4)
        agree[m] = same_grad and torch.allclose(sync_alone(m)[1].to_dense(), ref, rtol=1e-4, atol=1e-4)
    for _ in range(args.warmup):
        for m in METHODS:
            train_step(m)
            sync_alone(m)
    step_s = {m: [] for m in METHODS}
    sync_s = {m: [] for m in METHODS}
    received = {m: 0 for m in METHODS}
    for i in range(args.repeats):
        # The order turns each repeat, so that each method follows each other alike: a sync's
        # time depends on the one before it (on 4 ranks sharing 2 cores, gloo's sparse
        # allreduce took 1.3x to 2x as long right after a Zen sync as after one of its own).
        order = METHODS[i % len(METHODS):] + METHODS[:i % len(METHODS)]
        for m in order:
            seconds, zen_bytes = train_step(m)
            step_s[m].append(seconds)
            received[m] += zen_bytes
        for m in order:
            sync_s[m].append(sync_alone(m)[0])
    # Every model took the same steps on the same gradients: their tables must still agree.
    table0 = models["ddp-dense"].module.embedding.weight.detach()
    for m in METHODS:
        agree[m] = agree[m] and torch.allclose(models[m].module.embedding.weight.detach(), table0,
                                               rtol=1e-4, atol=1e-5)
    agree_all = torch.tensor([[int(agree[m]) for m in METHODS]])
    dist.all_reduce(agree_all, op=dist.ReduceOp.MIN)   # a method agrees only where every rank's did
    row = [x for m in METHODS for x in step_s[m] + sync_s[m] + [received[m] / args.repeats]] + [rows]
    table = [torch.zeros(1, len(row), dtype=torch.float64) for _ in range(n)]
    dist.all_gather(table, torch.tensor([row], dtype=torch.float64))
    if me == 0:
        report(args, n, torch.cat(table).numpy(), {m: bool(agree_all[0, i]) for i, m in enumerate(METHODS)})
    dist.barrier()
    # DDP released before the interpreter's exit, where its gloo work sometimes ended the
    # process ("terminate called without an active exception", torch 2.13).
    models.clear()
    gc.collect()
    if not agree_all.all():
        sys.exit(1)


def zen_received() -> int:
    from zen_hvd import runtime

    stats = runtime.comm_stats()
    return stats["bytes_received"] + stats["control_bytes_received"]


def report(args, n, table, agree):
    import numpy as np

    from zen_hvd.bench.common import reproduce, write_csv

    R, V, D = args.repeats, args.vocab, args.dim
    rows = table[:, -1]
    # DDP's bytes, from the sizes: gloo allgathers every other rank's coalesced rows (8-byte
    # index + D float32 values each); a ring allreduce moves 2 (n-1)/n of the table.
    allgather = (rows.sum() - rows) * (8 + 4 * D)
    computed = {"ddp-sparse": float(allgather.max()), "ddp-dense": 2 * (n - 1) / n * V * D * 4}
    res = {}
    for i, m in enumerate(METHODS):
        base = i * (2 * R + 1)
        step = float(np.median(table[:, base:base + R].max(axis=0)))   # each repeat's slowest rank
        sync = float(np.median(table[:, base + R:base + 2 * R].max(axis=0)))
        counted = m == "ddp-zen"
        b = float(table[:, base + 2 * R].max()) if counted else computed[m]
        res[m] = dict(step=step, sync=sync, bytes=b, counted=counted)
    where = f"{n} emulated hosts, {args.emulate} links" if args.emulate else f"{n} ranks, one machine (shared memory)"
    print(f"\nzen_hvd.bench.vs_ddp: {where}; embedding {V:,} x {D} float32, {args.tokens:,} tokens per rank "
          f"(Zipf {args.zipf}), {rows.mean():,.0f} distinct rows per rank (mean); {R} repeats; "
          f"Zen scheme {args.scheme}")
    print("  " + reproduce("zen_hvd.bench.vs_ddp"))
    print(f"  {'method':<12}{'step ms':>9}{'sync ms':>9}{'recv B/rank':>14}{'step/sparse':>13}"
          f"{'sync/sparse':>13}{'B/sparse':>10}  agrees")
    s = res["ddp-sparse"]
    for m in METHODS:
        r = res[m]
        mark = "" if r["counted"] else " (bytes computed)"
        print(f"  {m:<12}{r['step'] * 1e3:>9.2f}{r['sync'] * 1e3:>9.2f}{r['bytes']:>14,.0f}"
              f"{r['step'] / s['step']:>13.2f}{r['sync'] / s['sync']:>13.2f}{r['bytes'] / s['bytes']:>10.2f}"
              f"  {agree[m]}{mark}")
    z = res["ddp-zen"]
    choice = auto_choice()
    print(f"  Zen's hook{choice}: its training step is {s['step'] / z['step']:.2f}x as fast as DDP's own "
          f"sparse reduction's (the sync alone {s['sync'] / z['sync']:.2f}x), moving {z['bytes'] / s['bytes']:.2f}x "
          f"its bytes")
    write_csv(args.out, [dict(setting=where, method=m, step_ms=res[m]["step"] * 1e3, sync_ms=res[m]["sync"] * 1e3,
                              recv_bytes_per_rank=res[m]["bytes"], bytes_counted=res[m]["counted"],
                              step_vs_ddp_sparse=res[m]["step"] / s["step"],
                              sync_vs_ddp_sparse=res[m]["sync"] / s["sync"],
                              bytes_vs_ddp_sparse=res[m]["bytes"] / s["bytes"], agrees=agree[m])
                         for m in METHODS])


def auto_choice() -> str:
    """auto's choice for the hook's sparse bucket, as ' (auto chose X)', or nothing."""
    import zen_hvd

    scheme = zen_hvd.scheme_choices().get("ddp.bucket.0", {}).get("scheme")
    return f" (auto chose {scheme})" if scheme else ""


def launch(args):
    from zen_hvd.bench.common import torchrun_command

    cmd = torchrun_command(args.ranks, args.emulate, ["-m", "zen_hvd.bench.vs_ddp", *sys.argv[1:]])
    print("+", shlex.join(cmd), flush=True)
    sys.exit(subprocess.run(cmd).returncode)


def main():
    from zen_hvd.runtime import launched_by_torchrun

    args = parse()
    if launched_by_torchrun():   # one of torchrun's processes: run on its ranks
        return child(args)
    launch(args)


if __name__ == "__main__":
    main()
