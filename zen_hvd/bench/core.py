"""Core benchmark of balanced parallelism (issue: foundation).

    python -m zen_hvd.bench.core [--ranks 4] [--units 16777216] [--density 0.01] [--out F.csv]

Starts itself under mpirun with --ranks ranks when launched plainly. Prints, for an
element-sparse tensor of M units at the given density:
  - Push and Pull imbalance ratios (docs/algorithm.md §3; goal <= 1.1);
  - data bytes received per rank, measured by the transport counters, against the paper's
    formula (1) with the hash bitmap, and what COO indices would have cost in Pull;
  - CPU partition throughput (million units/s) against a torch sort-based partition;
  - the memory Zen keeps per tensor, and the working buffers of one sync.
--out writes the figures as CSV (figure, value, unit; one row each).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from .common import ensure_launched, gather, human_bytes, reproduce, share_cores, time_calls, write_csv


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--units", type=int, default=16 * 2 ** 20, help="M (elements)")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--overlap", type=float, default=0.3)
    ap.add_argument("--skew", type=float, default=0.5)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--transport", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--denser", type=lambda x: [float(v) for v in x.split(",") if v], default=[0.05, 0.2],
                    help="extra densities at which to show the hash bitmap's saving")
    ap.add_argument("--out", default=None, help="CSV file of the figures printed")
    args = ap.parse_args()
    ensure_launched(args.ranks, "zen_hvd.bench.core")

    import zen_hvd
    from zen_hvd import stats, workloads
    from zen_hvd.cuda_kernels import h0, hierarchical_hashing
    from zen_hvd.wire import bitmap_nbytes

    zen_hvd.init()
    import horovod.torch as hvd

    share_cores()
    n, me, M = hvd.size(), hvd.rank(), args.units
    zen_hvd.set_seed(12345)
    units = workloads.rank_units(M, n, args.density, args.overlap, args.skew, args.seed)[me]
    values = workloads.rank_values(units, 1, me, args.seed)[:, 0]
    grad = torch.sparse_coo_tensor(torch.from_numpy(units).reshape(1, -1), torch.from_numpy(values), (M,),
                                   check_invariants=True).coalesce()

    sync = lambda: zen_hvd.sparse_allreduce(grad, name="bench.core", op=zen_hvd.Sum, scheme="balanced",
                                           transport=args.transport)
    t_sync, recv_bytes, _ = time_calls(sync, args.repeats)
    info = dict(zen_hvd.last_sync)  # a snapshot: last_sync changes with every sync
    push_imb = stats.push_imbalance(info["push_counts"])
    pull_imb = stats.pull_imbalance(info["pull_counts"])

    # The formula, from the measured density d_G and densification ratio gamma_n.
    nnz = info["nnz"].astype(float)
    d_G = nnz.mean() / M
    gamma = info["pull_counts"].sum() / nnz.mean()
    f, coo, bm = (stats.balanced_bytes_formula(M, n, d_G, gamma, D=1, value_bytes=4, index_bytes=4,
                                               pull_index=kind) for kind in ("zen", "coo", "bitmap"))

    # CPU partition throughput: Zen's fused h0 + counting sort, against computing the same
    # partition ids with h0 and grouping them with torch.sort (stable) + bincount.
    keys = h0.derive_keys(12345)
    def zen_partition():
        hierarchical_hashing.group_by_partition_cpu(units, M, n, keys)
    def torch_sort_partition():
        part = torch.from_numpy(h0.partition_cpu(units, M, n, keys)[0])
        torch.sort(part, stable=True)
        torch.bincount(part, minlength=n)
    def median_time(fn, reps=20):
        fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
        return statistics.median(ts)
    t_zen, t_sort = median_time(zen_partition), median_time(torch_sort_partition)

    # The hash bitmap's saving grows with the aggregated density gamma d_G: a few denser runs.
    denser = []
    for d in args.denser:
        u = workloads.rank_units(M, n, d, args.overlap, args.skew, args.seed + 1)[me]
        v = torch.from_numpy(workloads.rank_values(u, 1, me, args.seed)[:, 0])
        g = torch.sparse_coo_tensor(torch.from_numpy(u).reshape(1, -1), v, (M,), check_invariants=True).coalesce()
        _, b, _ = time_calls(lambda: zen_hvd.sparse_allreduce(g, name=f"bench.core.{d}", op=zen_hvd.Sum,
                                                              scheme="balanced", transport=args.transport),
                             2, warmup=1)
        s = zen_hvd.last_sync
        gam = s["pull_counts"].sum() / s["nnz"].mean()
        denser.append((d, gam, gather([b])) + tuple(
            stats.balanced_bytes_formula(M, n, d, gam, 1, 4, 4, pull_index=k)["total"] for k in ("coo", "bitmap")))

    rows = gather([recv_bytes, t_sync, units.size])
    if me != 0:
        return
    recv = np.array([r[0] for r in rows])
    print(f"zen_hvd.bench.core: M = {M:,} elements, density {args.density:.2%}, {n} ranks, "
          f"overlap {args.overlap}, skew {args.skew}, transport {zen_hvd.runtime.get_transport(args.transport).name}")
    print("  " + reproduce("zen_hvd.bench.core"))
    print(f"  measured d_G = {d_G:.4%}, gamma_{n} = {gamma:.3f} (|I| = {info['pull_counts'].sum():,} aggregated units)")
    print(f"  Push imbalance ratio   {push_imb:.4f}   (goal <= 1.1)")
    print(f"  Pull imbalance ratio   {pull_imb:.4f}   (goal <= 1.1)")
    print(f"  time per sync (median of {args.repeats}, rank max) {max(r[1] for r in rows) * 1e3:.1f} ms")
    print("  data bytes received per rank (transport counters):")
    for r, b in enumerate(recv):
        print(f"    rank {r}: {b:,.0f} B ({human_bytes(b)})")
    err = (recv.mean() - f["total"]) / f["total"]
    print(f"  formula (1), Pull indices as Zen sends them: {f['total']:,.0f} B per rank "
          f"(Push {f['push']:,.0f} + Pull {f['pull']:,.0f}, of which indices {f['pull_index']:,.0f})")
    print(f"  measured mean / formula: {recv.mean() / f['total']:.4f} (error {err:+.2%}, goal within 2%); "
          f"max rank / formula {recv.max() / f['total']:.4f}")
    for label, other in (("COO indices", coo), ("hash bitmaps only", bm)):
        print(f"  Pull with {label}: {other['total']:,.0f} B per rank; Zen saves "
              f"{other['total'] - f['total']:,.0f} B ({(other['total'] - f['total']) / other['total']:.1%})")
    print("  Pull index format at higher densities (measured bytes per rank, mean):")
    for d, gam, rows_d, coo_b, bm_b in denser:
        got = np.mean([r[0] for r in rows_d])
        print(f"    density {d:.0%}: gamma {gam:.2f}, measured {got:,.0f} B; with COO Pull indices {coo_b:,.0f} B "
              f"-> saving {(coo_b - got) / coo_b:.1%}; bitmap-only formula {bm_b:,.0f} B")
    print(f"  CPU partition of {units.size:,} units (median of 20): Zen h0 + counting sort "
          f"{units.size / t_zen / 1e6:.1f} M units/s; h0 + torch.sort + bincount "
          f"{units.size / t_sort / 1e6:.1f} M units/s (Zen {t_sort / t_zen:.2f}x faster)")
    nbits = h0.server_size(M, n, 0)
    print(f"  memory Zen keeps per tensor: {keys.nbytes} B (h0's Feistel keys; no I_p table — a table "
          f"would hold M int64 = {human_bytes(M * 8)})")
    print(f"  working buffers of one sync (freed after): bitmap {human_bytes(bitmap_nbytes(nbits))} "
          f"+ popcount prefix {human_bytes(bitmap_nbytes(nbits) * 8)} per server, plus the Push/Pull buffers")
    figures = [("ranks", n, ""), ("units", M, "elements"), ("density", args.density, ""),
               ("d_G", d_G, ""), (f"gamma_{n}", gamma, ""), ("push_imbalance", push_imb, "ratio"),
               ("pull_imbalance", pull_imb, "ratio"), ("time_per_sync", max(r[1] for r in rows), "s"),
               ("recv_bytes_mean", recv.mean(), "B/rank"), ("recv_bytes_max", recv.max(), "B/rank"),
               ("formula_bytes", f["total"], "B/rank"), ("coo_pull_bytes", coo["total"], "B/rank"),
               ("partition_zen", units.size / t_zen, "units/s"),
               ("partition_torch_sort", units.size / t_sort, "units/s")]
    figures += [(f"recv_bytes_mean_at_{d}", float(np.mean([r[0] for r in rows_d])), "B/rank")
                for d, _, rows_d, _, _ in denser]
    write_csv(args.out, [dict(figure=k, value=v, unit=u) for k, v, u in figures])


if __name__ == "__main__":
    main()
