"""Zen against Horovod on one embedding gradient, side by side in one launch.

    python -m zen_hvd.bench.vs_horovod [--ranks 4] [--emulate 1gbit] [--repeats 20]
                                       [--vocab 200000] [--dim 64] [--tokens 4096] [--zipf 1.05]
                                       [--out F.csv]

Every rank builds an nn.Embedding(sparse=True)-style gradient (--tokens lookups of ids drawn
from Zipf(--zipf) over --vocab rows, uncoalesced, --dim float32 values per row) and syncs it,
repeat after repeat in turn, with:
  horovod-dense   hvd.allreduce of the dense gradient (what sparse_as_dense=True does)
  horovod-sparse  hvd.sparse_allreduce_async + synchronize (Horovod's allgather of COO)
  zen-balanced    zen_hvd.sparse_allreduce(scheme="balanced")
  zen-uncoalesced zen_hvd.sparse_allreduce(scheme="balanced", coalesced=False): the union's
                  rows in the servers' order, as Horovod's result is unsorted (and what the
                  optimizer takes): no sort and no gather of the result
  zen-auto        zen_hvd.sparse_allreduce(scheme="auto"), after its profiling calls
Prints per method: median time per sync (each repeat's slowest rank), CPU (process) time per
sync (median, mean over ranks) and its system (kernel) part, data bytes received per rank
(Zen: the transports' counters; Horovod: from the tensor sizes, allgather (n-1) k (8 + 4 D),
ring allreduce 2 (n-1)/n M 4 D), and ratios to Horovod's sparse allgather. The link rate is measured in the same launch (a
16 MiB point-to-point transfer); Zen's byte ideal is the slowest rank's max(bytes sent,
received) over that rate. Results are checked against the dense allreduce. --out writes the
table as CSV, one row per method, with the setting in every row.

Started plainly it runs itself under mpirun (--ranks local ranks), or with --emulate on
--ranks network namespaces joined by tc-limited links (scripts/netns_cluster.sh, needs root);
started under mpirun or horovodrun, it runs on that job's ranks.
"""
from __future__ import annotations

import argparse
import resource
import shlex
import statistics
import subprocess
import sys
import time

from .common import add_embedding_args

METHODS = ("horovod-dense", "horovod-sparse", "zen-balanced", "zen-uncoalesced", "zen-auto")


def _cpu():
    """(process CPU seconds, its system part), all threads, from getrusage (Linux splits the
    exact total between user and system by tick samples: the split is a statistic, hence the
    median over repeats and the mean over ranks)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_stime


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_embedding_args(ap, repeats=20, rate="1gbit")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--transport", default=None)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args()


def zipf_tokens(V, count, a, seed):
    """`count` ids in [0, V), P(id = i) proportional to 1 / (i + 1)^a (id 0 most frequent)."""
    import numpy as np

    p = 1.0 / np.arange(1, V + 1, dtype=np.float64) ** a
    return np.random.default_rng(seed).choice(V, size=count, p=p / p.sum())


def rank_lookups(args, rank):
    """This rank's --tokens Zipf ids and their gradient rows, [tokens, --dim] float32 (the
    same in every benchmark that syncs the embedding gradient)."""
    import numpy as np
    import torch

    ids = torch.from_numpy(zipf_tokens(args.vocab, args.tokens, args.zipf, args.seed * 1000 + rank))
    rng = np.random.default_rng(rank)
    return ids, torch.from_numpy(rng.standard_normal((args.tokens, args.dim)).astype(np.float32))


def child(args):
    import numpy as np
    import torch

    import zen_hvd
    from zen_hvd import runtime
    from zen_hvd.bench.common import share_cores

    zen_hvd.init()
    import horovod.torch as hvd

    share_cores()
    n, me = hvd.size(), hvd.rank()
    zen_hvd.set_seed(12345)
    V, D = args.vocab, args.dim
    ids, values = rank_lookups(args, me)
    grad = torch.sparse_coo_tensor(ids.reshape(1, -1), values, (V, D))   # uncoalesced, as nn.Embedding makes it
    rows = int(torch.unique(ids).numel())

    def horovod_dense():
        return hvd.allreduce(grad.to_dense(), name="bench.dense", op=hvd.Average)

    def horovod_sparse():
        return hvd.sparse_allreduce_async(grad, name="bench.sparse", op=hvd.Average)()  # a callable handle

    def zen(scheme, coalesced=True):
        name = f"bench.{scheme}" + ("" if coalesced else ".uncoalesced")
        return lambda: zen_hvd.sparse_allreduce(grad, name=name, op=zen_hvd.Average, scheme=scheme,
                                                transport=args.transport, coalesced=coalesced)

    fns = {"horovod-dense": horovod_dense, "horovod-sparse": horovod_sparse,
           "zen-balanced": zen("balanced"), "zen-uncoalesced": zen("balanced", coalesced=False),
           "zen-auto": zen("auto")}
    methods = [m for m in args.methods.split(",") if m]
    # Correctness first: every method against the dense allreduce.
    ref = horovod_dense()
    agree = {m: bool(torch.allclose(fns[m]().to_dense(), ref, rtol=1e-4, atol=1e-4)) for m in methods}
    for _ in range(args.warmup):
        for m in methods:
            fns[m]()
    wall = {m: [] for m in methods}
    cpu = {m: [] for m in methods}
    kernel = {m: [] for m in methods}   # its system (kernel) part: MPI's TCP, the polls' sleeps
    zen_bytes = {m: [0, 0] for m in methods}
    for _ in range(args.repeats):
        for m in methods:
            hvd.barrier()
            before = runtime.comm_stats()
            c0, t0 = _cpu(), time.perf_counter()
            fns[m]()
            wall[m].append(time.perf_counter() - t0)
            c1 = _cpu()
            cpu[m].append(c1[0] - c0[0])
            kernel[m].append(c1[1] - c0[1])
            after = runtime.comm_stats()
            zen_bytes[m][0] += after["bytes_received"] + after["control_bytes_received"] \
                - before["bytes_received"] - before["control_bytes_received"]
            zen_bytes[m][1] += after["bytes_sent"] + after["control_bytes_sent"] \
                - before["bytes_sent"] - before["control_bytes_sent"]
    rate = link_rate(hvd)
    # Every rank's numbers, to rank 0: per repeat walls, CPU and system medians, bytes.
    row = []
    for m in methods:
        row += wall[m] + [statistics.median(cpu[m]), statistics.median(kernel[m]),
                          zen_bytes[m][0] / args.repeats,
                          zen_bytes[m][1] / args.repeats]
    row += [rows, rate]
    table = hvd.allgather(torch.tensor([row], dtype=torch.float64)).numpy()
    if me != 0:
        return
    choice = zen_hvd.scheme_choices().get("bench.auto", {}).get("scheme", "-")
    report(args, n, methods, table, agree, choice)


def link_rate(hvd):
    """Bytes/s of a 16 MiB transfer from rank 0 to rank 1 (median of 3), on every rank."""
    import torch

    if hvd.size() < 2:
        return float("nan")
    from mpi4py import MPI

    comm, me = MPI.COMM_WORLD, hvd.rank()
    buf = torch.zeros(16 << 20, dtype=torch.uint8).numpy()
    times = []
    for _ in range(3):
        comm.Barrier()
        t0 = time.perf_counter()
        if me == 0:
            comm.Send(buf, dest=1, tag=7)
            comm.Recv(buf[:1], source=1, tag=8)
        elif me == 1:
            comm.Recv(buf, source=0, tag=7)
            comm.Send(buf[:1], dest=0, tag=8)
        times.append(time.perf_counter() - t0)
    return comm.bcast(buf.size / statistics.median(times), root=0)


def report(args, n, methods, table, agree, choice):
    import numpy as np

    from zen_hvd.bench.common import reproduce, write_csv

    R, V, D = args.repeats, args.vocab, args.dim
    k = args.tokens
    rows = table[:, -2]
    rate = float(table[0, -1])
    horovod_bytes = {"horovod-dense": 2 * (n - 1) / n * V * D * 4,
                     "horovod-sparse": (n - 1) * k * (8 + 4 * D)}
    res = {}
    for i, m in enumerate(methods):
        base = i * (R + 4)
        walls = table[:, base:base + R]
        t = float(np.median(walls.max(axis=0)))        # each repeat's slowest rank
        c = float(table[:, base + R].mean())
        sys_cpu = float(table[:, base + R + 1].mean())
        recv = table[:, base + R + 2]
        sent = table[:, base + R + 3]
        counted = m.startswith("zen")
        b = float(recv.max()) if counted else horovod_bytes[m]
        crit = float(np.maximum(recv, sent).max()) if counted else b
        res[m] = dict(t=t, cpu=c, sys=sys_cpu, bytes=b, ideal=crit / rate if rate == rate else float("nan"),
                      counted=counted)
    where = f"{n} emulated hosts, {args.emulate} links" if args.emulate else f"{n} ranks, one machine (shared memory)"
    print(f"\nzen_hvd.bench.vs_horovod: {where}; embedding {V:,} x {D} float32, {k:,} tokens per rank "
          f"(Zipf {args.zipf}), {rows.mean():,.0f} distinct rows per rank (mean); {R} repeats")
    print("  " + reproduce("zen_hvd.bench.vs_horovod"))
    print(f"  measured link rate (16 MiB, rank 0 -> 1): {rate * 8 / 1e9:.2f} Gbit/s")
    print(f"  {'method':<16}{'time ms':>9}{'cpu ms':>9}{'sys ms':>8}{'recv B/rank':>14}{'t/hvd-sparse':>14}"
          f"{'B/hvd-sparse':>14}{'ideal ms':>10}{'t/ideal':>9}  agrees")
    hs = res.get("horovod-sparse")
    for m in methods:
        r = res[m]
        tr = f"{r['t'] / hs['t']:.2f}" if hs else "-"
        br = f"{r['bytes'] / hs['bytes']:.2f}" if hs else "-"
        ideal = f"{r['ideal'] * 1e3:.1f}" if r["counted"] else "-"
        ti = f"{r['t'] / r['ideal']:.2f}" if r["counted"] else "-"
        mark = "" if r["counted"] else " (computed)"
        print(f"  {m:<16}{r['t'] * 1e3:>9.2f}{r['cpu'] * 1e3:>9.2f}{r['sys'] * 1e3:>8.2f}{r['bytes']:>14,.0f}{tr:>14}{br:>14}"
              f"{ideal:>10}{ti:>9}  {agree[m]}{mark}")
    if "zen-auto" in methods:
        print(f"  zen-auto chose: {choice}")
    for m, what in (("zen-balanced", "Zen balanced"), ("zen-uncoalesced", "Zen balanced, uncoalesced,")):
        if hs and m in res:
            z = res[m]
            print(f"  {what} is {hs['t'] / z['t']:.2f}x Horovod's sparse allgather in time "
                  f"({hs['cpu'] / z['cpu']:.2f}x in CPU time), moving {z['bytes'] / hs['bytes']:.2f}x its bytes")
    write_csv(args.out, [dict(setting=where, method=m, time_ms=res[m]["t"] * 1e3, cpu_ms=res[m]["cpu"] * 1e3,
                              sys_ms=res[m]["sys"] * 1e3,
                              recv_bytes_per_rank=res[m]["bytes"], bytes_counted=res[m]["counted"],
                              time_vs_horovod_sparse=res[m]["t"] / hs["t"] if hs else "",
                              bytes_vs_horovod_sparse=res[m]["bytes"] / hs["bytes"] if hs else "",
                              ideal_ms=res[m]["ideal"] * 1e3 if res[m]["counted"] else "",
                              agrees=agree[m], link_gbps=rate * 8 / 1e9) for m in methods])
    if not all(agree.values()):
        sys.exit(1)


def launch(args):
    here = [sys.executable, "-m", "zen_hvd.bench.vs_horovod", "--child", *sys.argv[1:]]
    from zen_hvd.bench.common import launch_command

    cmd = launch_command(args.ranks, args.emulate, here)
    print("+", shlex.join(cmd), flush=True)
    sys.exit(subprocess.run(cmd).returncode)


def main():
    from zen_hvd.bench.common import under_launcher

    args = parse()
    if args.child or under_launcher():   # started by mpirun / horovodrun: run on its ranks
        return child(args)
    launch(args)


if __name__ == "__main__":
    main()
