"""Flat and two-level syncs on hosts of several GPUs, projected by the cost model.

    python -m zen_hvd.bench.hosts [--hosts 16] [--per-host 8] [--network 25] [--inside 1200]
                                  [--vocab 200000] [--dim 64] [--tokens 4096] [--zipf 1.05]
                                  [--out F.csv]

The embedding gradient of bench.vs_horovod on every one of n = hosts x per-host ranks (rank r
draws its --tokens Zipf ids with the same seeds as there), its set sizes counted exactly: k
distinct rows per rank (mean), a host's union (gamma_L k) and the union of all (|I_n|). From
them, per sync: the bytes leaving a host and the bytes each rank moves inside its host
(costmodel.two_level_bytes), and the time at --network Gbit/s between hosts and --inside
Gbit/s inside (NVLink: 1200 Gbit/s, the V100's 150 GB/s a direction), with 50 us per message
step, for:
  zen-flat        balanced parallelism over all n ranks (Pull around the ring between hosts)
  zen-flat-direct the same with the direct Pull (ZEN_HVD_PULL=direct; the paper's Pull):
                  every server's message reaches each host once per local rank
  zen-two-level   balanced inside each host, balanced across hosts on each share
  horovod-sparse  Horovod's allgather of every rank's --tokens rows as they are (what its
                  optimizer sends), flat: each host receives what the other hosts' ranks
                  hold, (n - L) t (8 + 4 D), and each rank the n - 1 other ranks' rows, in
                  n - 1 ring steps
  horovod-coalesced  the same of each rank's k distinct rows
  horovod-hier    HOROVOD_HIERARCHICAL_ALLGATHER=1 on the distinct rows: the same bytes, in
                  H - 1 steps between hosts and a gather and a broadcast inside the host
A projection: no CPU term (on GPUs the kernels take microseconds a sync); bench.vs_horovod
--per-host measures this machine.
"""
from __future__ import annotations

import argparse
import math

STEP_S = 50e-6   # one message step (costmodel.LATENCY_S)


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=16)
    ap.add_argument("--per-host", type=int, default=8)
    ap.add_argument("--network", type=float, default=25.0, help="Gbit/s between hosts")
    ap.add_argument("--inside", type=float, default=1200.0, help="Gbit/s inside a host (NVLink)")
    ap.add_argument("--vocab", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--zipf", type=float, default=1.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="CSV file of the table printed")
    return ap.parse_args()


def set_sizes(args, n, L):
    """(k: distinct rows per rank, mean; a host's union, mean; the union of all n ranks)."""
    import numpy as np

    from .vs_horovod import zipf_tokens

    sets = [np.unique(zipf_tokens(args.vocab, args.tokens, args.zipf, args.seed * 1000 + r)) for r in range(n)]
    k = float(np.mean([s.size for s in sets]))
    host = float(np.mean([np.unique(np.concatenate(sets[h * L:(h + 1) * L])).size for h in range(n // L)]))
    return k, host, float(np.unique(np.concatenate(sets)).size)


def project(H, L, M, D, k, host_union, union, network_gbps, inside_gbps, tokens) -> dict:
    """Per method: (bytes leaving a host, bytes inside per rank, time in seconds)."""
    from ..costmodel import two_level_bytes

    n, v = H * L, 4 * D
    zen = two_level_bytes(H, L, M, k, union, host_union, v, ring=True)
    direct = two_level_bytes(H, L, M, k, union, host_union, v, ring=False)["flat"]
    net, inside = network_gbps * 1e9 / 8, inside_gbps * 1e9 / 8
    rows, raw = k * (8 + v), tokens * (8 + v)   # Horovod's COO: int64 index and the values
    out = {"zen-flat": (zen["flat"]["off_host"], zen["flat"]["inside"], 2),
           "zen-flat-direct": (direct["off_host"], direct["inside"], 2),
           "zen-two-level": (zen["two-level"]["off_host"], zen["two-level"]["inside"], 5),
           "horovod-sparse": ((n - L) * raw, (n - 1) * raw, n - 1),
           "horovod-coalesced": ((n - L) * rows, (n - 1) * rows, n - 1),
           "horovod-hier": ((n - L) * rows, (n - 1) * rows, H - 1 + 2 * math.ceil(math.log2(L)))}
    return {m: dict(off_host=b, inside=i, time=b / net + i / inside + steps * STEP_S)
            for m, (b, i, steps) in out.items()}


def main():
    args = parse()
    H, L = args.hosts, args.per_host
    n = H * L
    k, host_union, union = set_sizes(args, n, L)
    res = project(H, L, args.vocab, args.dim, k, host_union, union, args.network, args.inside, args.tokens)
    from .common import reproduce, write_csv

    print(f"\nzen_hvd.bench.hosts: projection, {H} hosts x {L} GPUs, {args.network:g} Gbit/s between "
          f"hosts, {args.inside:g} Gbit/s inside; embedding {args.vocab:,} x {args.dim} float32, "
          f"{args.tokens:,} Zipf({args.zipf}) tokens per rank")
    print("  " + reproduce("zen_hvd.bench.hosts"))
    print(f"  rows per rank k = {k:,.0f}; a host's union {host_union:,.0f} (gamma_L = {host_union / k:.2f} "
          f"of L = {L}); the union of all {union:,.0f} (gamma_n = {union / k:.1f} of n = {n})")
    print(f"  {'method':<18}{'B leaving host':>16}{'B inside/rank':>15}{'time ms':>10}{'vs zen-flat':>13}"
          f"{'B vs zen-flat':>15}")
    flat = res["zen-flat"]
    for m, r in res.items():
        print(f"  {m:<18}{r['off_host']:>16,.0f}{r['inside']:>15,.0f}{r['time'] * 1e3:>10.3f}"
              f"{flat['time'] / r['time']:>12.2f}x{r['off_host'] / flat['off_host']:>15.2f}")
    write_csv(args.out, [dict(hosts=H, per_host=L, network_gbps=args.network, inside_gbps=args.inside,
                              method=m, bytes_leaving_host=r["off_host"], bytes_inside_per_rank=r["inside"],
                              time_ms=r["time"] * 1e3) for m, r in res.items()])


if __name__ == "__main__":
    main()
