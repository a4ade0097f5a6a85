"""Zen against Horovod on one embedding gradient, side by side in one launch.

    python -m zen_hvd.bench.vs_horovod [--ranks 4] [--emulate 1gbit] [--per-host L]
                                       [--horovod-hierarchical] [--repeats 20]
                                       [--vocab 200000] [--dim 64] [--tokens 4096] [--zipf 1.05]
                                       [--out F.csv]

Every rank builds an nn.Embedding(sparse=True)-style gradient (--tokens lookups of ids drawn
from Zipf(--zipf) over --vocab rows, uncoalesced, --dim float32 values per row) and syncs it,
repeat after repeat in turn, with:
  horovod-dense   hvd.allreduce of the dense gradient (what sparse_as_dense=True does)
  horovod-sparse  hvd.sparse_allreduce_async + synchronize (Horovod's allgather of COO), of
                  the gradient as it is (what Horovod's optimizer does)
  horovod-coalesced the same of the gradient coalesced first (coalesce timed too): the
                  strongest allgather, each distinct row sent once
  zen-balanced    zen_hvd.sparse_allreduce(scheme="balanced", two_level="off"): flat
  zen-two-level   the same with two_level="on": balanced inside each host and across hosts
                  (with --per-host L > 1)
  zen-uncoalesced zen_hvd.sparse_allreduce(scheme="balanced", coalesced=False): the union's
                  rows in the servers' order, as Horovod's result is unsorted (and what the
                  optimizer takes): no sort and no gather of the result
  zen-auto        zen_hvd.sparse_allreduce(scheme="auto"), after its profiling calls (it
                  chooses the scheme, and flat or two-level)
  zen-SCHEME      zen_hvd.sparse_allreduce(scheme=SCHEME, two_level="off") for any other
                  scheme (zen-hierarchical, zen-agsparse, ...)
Prints per method: median time per sync (each repeat's slowest rank), CPU (process) time per
sync (median, mean over ranks) and its system (kernel) part, data bytes received per rank
(Zen: the transports' counters; Horovod: from the tensor sizes, allgather (n-1) k (8 + 4 D),
of the coalesced gradient the other ranks' distinct rows times (8 + 4 D), ring allreduce
2 (n-1)/n M 4 D), and ratios to Horovod's two allgathers. The link rate is measured in the
same launch (a 16 MiB point-to-point transfer between hosts); a method's byte ideal is its
slowest rank's max(bytes sent, received) over that rate (with --per-host, the bytes leaving a
host), and its wire share the ideal over its time (how much of the sync the link is busy with
its bytes). Results are checked against the dense allreduce. --out writes the
table as CSV, one row per method, with the setting in every row.

--per-host L: L ranks on each host (with --emulate, L ranks share each namespace, and memory;
without, ZEN_HVD_RANKS_PER_HOST=L groups consecutive ranks). Then the table also gives the
bytes leaving a host per sync (mean over hosts): Zen's counted (the transports' off-host
counters), Horovod's computed: an allgather brings each host every other host's rows,
(n - L) k (8 + 4 D) (coalesced: the distinct rows). --horovod-hierarchical sets
HOROVOD_HIERARCHICAL_ALLGATHER=1 for the job: Horovod's allgathers gather inside each host
first (Horovod reads it at start, so it holds for the whole launch).

Started plainly it runs itself under mpirun (--ranks local ranks), or with --emulate on
--ranks network namespaces joined by tc-limited links (scripts/netns_cluster.sh, needs root);
started under mpirun or horovodrun, it runs on that job's ranks.
"""
from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time

from .common import add_embedding_args

METHODS = ("horovod-dense", "horovod-sparse", "horovod-coalesced", "zen-balanced", "zen-two-level",
           "zen-uncoalesced", "zen-auto")


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
    ap.add_argument("--per-host", type=int, default=1, help="ranks per host (see above)")
    ap.add_argument("--horovod-hierarchical", action="store_true",
                    help="HOROVOD_HIERARCHICAL_ALLGATHER=1 for the job")
    ap.add_argument("--transport", default=None)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--timeline", action="store_true",
                    help="also print a per-phase timeline of one zen-balanced sync, every rank")
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

    def horovod_coalesced():
        return hvd.sparse_allreduce_async(grad.coalesce(), name="bench.coalesced", op=hvd.Average)()

    def zen(scheme, coalesced=True, two_level="off"):
        name = f"bench.{scheme}.{two_level}" + ("" if coalesced else ".uncoalesced")
        return lambda: zen_hvd.sparse_allreduce(grad, name=name, op=zen_hvd.Average, scheme=scheme,
                                                transport=args.transport, coalesced=coalesced,
                                                two_level=two_level)

    fns = {"horovod-dense": horovod_dense, "horovod-sparse": horovod_sparse, "horovod-coalesced": horovod_coalesced,
           "zen-balanced": zen("balanced"), "zen-two-level": zen("balanced", two_level="on"),
           "zen-uncoalesced": zen("balanced", coalesced=False), "zen-auto": zen("auto", two_level="auto")}
    methods = [m for m in args.methods.split(",") if m]
    fns.update({m: zen(m[4:]) for m in methods if m not in fns and m.startswith("zen-")})
    # Correctness first: every method against the dense allreduce.
    ref = horovod_dense()
    agree = {m: bool(torch.allclose(fns[m]().to_dense(), ref, rtol=1e-4, atol=1e-4)) for m in methods}
    for _ in range(args.warmup):
        for m in methods:
            fns[m]()
    wall = {m: [] for m in methods}
    cpu = {m: [] for m in methods}
    kernel = {m: [] for m in methods}   # its system (kernel) part: MPI's TCP, the polls' sleeps
    zen_bytes = {m: [0, 0, 0] for m in methods}   # received, sent, sent off host
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
            zen_bytes[m][2] += after["off_host_sent"] - before["off_host_sent"]
    traced = "zen-two-level" if args.per_host > 1 and "zen-two-level" in methods else "zen-balanced"
    timeline = phase_timeline(hvd, fns[traced]) if args.timeline else None
    rate = link_rate(hvd, args.per_host)
    # Every rank's numbers, to rank 0: per repeat walls, CPU and system medians, bytes.
    row = []
    for m in methods:
        row += wall[m] + [statistics.median(cpu[m]), statistics.median(kernel[m]),
                          zen_bytes[m][0] / args.repeats,
                          zen_bytes[m][1] / args.repeats, zen_bytes[m][2] / args.repeats]
    host = runtime.get_transport(args.transport).host_of[me]
    row += [host, rows, rate]
    table = hvd.allgather(torch.tensor([row], dtype=torch.float64)).numpy()
    if me != 0:
        return
    prof = zen_hvd.scheme_choices().get("bench.auto.auto", {})
    choice = prof.get("scheme", "-") + (", two-level" if prof.get("two_level") and args.per_host > 1 else "")
    across = zen_hvd.scheme_choices().get("bench.auto.auto (across hosts)")
    choice += f" (across hosts: {across['scheme']})" if across and prof.get("two_level") else ""
    report(args, n, methods, table, agree, choice)
    if timeline:
        print_timeline(timeline, traced)


def phase_timeline(hvd, fn, syncs=5):
    """Every rank's phases of the median of `syncs` syncs (by the slowest rank's time), as
    (rank, phase, start, end) in ms from the earliest start of that sync on any rank (ranks
    on one machine share the clock, and the emulated hosts are namespaces of one machine).
    On rank 0; None elsewhere."""
    from mpi4py import MPI

    from zen_hvd import device

    runs = []
    for _ in range(syncs):
        hvd.barrier()
        with device.time_steps() as (_, events):
            t0 = time.perf_counter()
            fn()
            events.append(("whole sync", t0, time.perf_counter()))
        runs.append(events)
    got = MPI.COMM_WORLD.gather(runs, root=0)
    if got is None:
        return None
    whole = [[r[i][-1] for r in got] for i in range(syncs)]   # each rank's "whole sync" of sync i
    length = [max(end for _, _, end in w) - min(start for _, start, _ in w) for w in whole]
    pick = sorted(range(syncs), key=length.__getitem__)[syncs // 2]
    zero = min(start for _, start, _ in whole[pick])
    return [(rank, name, (a - zero) * 1e3, (b - zero) * 1e3)
            for rank, r in enumerate(got) for name, a, b in r[pick]]


def print_timeline(rows, method):
    """Per phase: when its first rank started it and its last rank ended it, and its duration
    on each rank (mean and max): a phase that lasts much longer than its work waits on a peer."""
    phases = list(dict.fromkeys(name for _, name, _, _ in rows))
    print(f"\n  timeline of one {method} sync (ms from its first start; every rank):")
    print(f"  {'phase':<52}{'first start':>12}{'last end':>10}{'mean dur':>10}{'max dur':>9}")
    for ph in phases:
        mine = [(a, b) for _, name, a, b in rows if name == ph]
        durs = [b - a for a, b in mine]
        print(f"  {ph:<52}{min(a for a, _ in mine):>12.1f}{max(b for _, b in mine):>10.1f}"
              f"{statistics.mean(durs):>10.1f}{max(durs):>9.1f}")
    ranks = sorted({r for r, _, _, _ in rows})
    if len(ranks) <= 8:   # every rank's start and end of every phase
        print(f"  {'phase, start-end ms on rank':<52}" + "".join(f"{r:>13}" for r in ranks))
        for ph in phases:
            spans = {r: f"{a:.1f}-{b:.1f}" for r, name, a, b in rows if name == ph}
            print(f"  {ph:<52}" + "".join(f"{spans.get(r, '-'):>13}" for r in ranks))


def link_rate(hvd, per_host=1):
    """Bytes/s of a 16 MiB transfer from rank 0 to the first rank of the next host (rank
    per_host; median of 3), on every rank."""
    import torch

    if hvd.size() <= per_host:
        return float("nan")
    from mpi4py import MPI

    comm, me = MPI.COMM_WORLD, hvd.rank()
    buf = torch.zeros(16 << 20, dtype=torch.uint8).numpy()
    times = []
    for _ in range(3):
        comm.Barrier()
        t0 = time.perf_counter()
        if me == 0:
            comm.Send(buf, dest=per_host, tag=7)
            comm.Recv(buf[:1], source=per_host, tag=8)
        elif me == per_host:
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
    hosts = table[:, -3].astype(int)
    H, L = hosts.max() + 1, args.per_host
    horovod_bytes = {"horovod-dense": 2 * (n - 1) / n * V * D * 4,
                     "horovod-sparse": (n - 1) * k * (8 + 4 * D),
                     "horovod-coalesced": float((rows.sum() - rows).max()) * (8 + 4 * D)}
    # what an allgather brings each host from the others, mean over hosts
    leaving = {"horovod-sparse": (n - L) * k * (8 + 4 * D),
               "horovod-coalesced": float((rows.sum() - np.bincount(hosts, rows)[hosts]).mean()) * (8 + 4 * D),
               "horovod-dense": 2 * (H - 1) / H * V * D * 4}
    res = {}
    for i, m in enumerate(methods):
        base = i * (R + 5)
        walls = table[:, base:base + R]
        t = float(np.median(walls.max(axis=0)))        # each repeat's slowest rank
        c = float(table[:, base + R].mean())
        sys_cpu = float(table[:, base + R + 1].mean())
        recv = table[:, base + R + 2]
        sent = table[:, base + R + 3]
        counted = m.startswith("zen")
        off = float(np.bincount(hosts, table[:, base + R + 4]).mean()) if counted else leaving[m]
        b = float(recv.max()) if counted else horovod_bytes[m]
        crit = float(np.maximum(recv, sent).max()) if counted else b
        if L > 1:   # several ranks to a host: the host's link carries what leaves the host
            crit = off
        res[m] = dict(t=t, cpu=c, sys=sys_cpu, bytes=b, ideal=crit / rate if rate == rate else float("nan"),
                      counted=counted, leaving=off)
        res[m]["wire"] = res[m]["ideal"] / t
    where = (f"{H} emulated hosts x {L} ranks, {args.emulate} links" if args.emulate else
             f"{n} ranks, one machine (shared memory)" + (f", {L} to a host" if L > 1 else ""))
    if args.horovod_hierarchical:
        where += ", HOROVOD_HIERARCHICAL_ALLGATHER=1"
    print(f"\nzen_hvd.bench.vs_horovod: {where}; embedding {V:,} x {D} float32, {k:,} tokens per rank "
          f"(Zipf {args.zipf}), {rows.mean():,.0f} distinct rows per rank (mean); {R} repeats")
    print("  " + reproduce("zen_hvd.bench.vs_horovod"))
    print(f"  measured link rate (16 MiB, rank 0 -> {L}): {rate * 8 / 1e9:.2f} Gbit/s")
    print(f"  {'method':<18}{'time ms':>9}{'cpu ms':>9}{'sys ms':>8}{'recv B/rank':>14}{'t/hvd-sparse':>13}"
          f"{'t/coalesced':>12}{'B/coalesced':>12}{'ideal ms':>10}{'t/ideal':>8}{'wire':>6}"
          + (f"{'B leaving host':>15}" if L > 1 else "") + "  agrees")
    hs, hc = res.get("horovod-sparse"), res.get("horovod-coalesced")
    for m in methods:
        r = res[m]
        ts = f"{r['t'] / hs['t']:.2f}" if hs else "-"
        tc = f"{r['t'] / hc['t']:.2f}" if hc else "-"
        bc = f"{r['bytes'] / hc['bytes']:.2f}" if hc else "-"
        mark = "" if r["counted"] else " (bytes computed)"
        print(f"  {m:<18}{r['t'] * 1e3:>9.2f}{r['cpu'] * 1e3:>9.2f}{r['sys'] * 1e3:>8.2f}{r['bytes']:>14,.0f}"
              f"{ts:>13}{tc:>12}{bc:>12}{r['ideal'] * 1e3:>10.1f}{r['t'] / r['ideal']:>8.2f}{r['wire']:>6.0%}"
              + (f"{r['leaving']:>15,.0f}" if L > 1 else "") + f"  {agree[m]}{mark}")
    if "zen-auto" in methods:
        print(f"  zen-auto chose: {choice}")
    if L > 1 and "zen-two-level" in res and "zen-balanced" in res:
        z2, z1 = res["zen-two-level"], res["zen-balanced"]
        print(f"  Zen two-level is {z1['t'] / z2['t']:.2f}x flat Zen in speed, its bytes leaving a host "
              f"{z2['leaving'] / z1['leaving']:.2f}x flat Zen's")
    for m, what in (("zen-balanced", "Zen balanced"), ("zen-two-level", "Zen two-level"),
                    ("zen-uncoalesced", "Zen balanced, uncoalesced,")):
        for peer, peer_name in ((hs, "Horovod's sparse allgather"), (hc, "the coalesced allgather")):
            if peer and m in res:
                z = res[m]
                print(f"  {what} is {peer['t'] / z['t']:.2f}x {peer_name} in speed "
                      f"({peer['cpu'] / z['cpu']:.2f}x in CPU time), moving {z['bytes'] / peer['bytes']:.2f}x its bytes")
    write_csv(args.out, [dict(setting=where, method=m, time_ms=res[m]["t"] * 1e3, cpu_ms=res[m]["cpu"] * 1e3,
                              sys_ms=res[m]["sys"] * 1e3,
                              recv_bytes_per_rank=res[m]["bytes"], bytes_counted=res[m]["counted"],
                              time_vs_horovod_sparse=res[m]["t"] / hs["t"] if hs else "",
                              bytes_vs_horovod_sparse=res[m]["bytes"] / hs["bytes"] if hs else "",
                              time_vs_coalesced=res[m]["t"] / hc["t"] if hc else "",
                              ideal_ms=res[m]["ideal"] * 1e3, wire_share=res[m]["wire"],
                              bytes_leaving_host=res[m]["leaving"],
                              agrees=agree[m], link_gbps=rate * 8 / 1e9) for m in methods])
    if not all(agree.values()):
        sys.exit(1)


def launch(args):
    here = [sys.executable, "-m", "zen_hvd.bench.vs_horovod", "--child", *sys.argv[1:]]
    from zen_hvd.bench.common import launch_command

    cmd = launch_command(args.ranks, args.emulate, here, args.per_host)
    if args.per_host > 1 and not args.emulate:
        os.environ["ZEN_HVD_RANKS_PER_HOST"] = str(args.per_host)
    if args.horovod_hierarchical:
        os.environ["HOROVOD_HIERARCHICAL_ALLGATHER"] = "1"
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
