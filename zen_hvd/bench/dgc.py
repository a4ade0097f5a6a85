"""DGC's sparsifier against a full torch.topk: time per bucket and achieved density.

    python -m zen_hvd.bench.dgc [--sizes 1e5,1e6,1e7,3.3e7] [--ratio 0.05] [--repeats 5] [--out F.csv]

One process, no communication: for each bucket size (elements; 3.3e7 float32 is DGC's default
128 MiB bucket) and each kind of gradient (normal; heavy-tailed, normal cubed; 90% exact zeros),
the median time of zen_hvd.dgc.top_k (a strided 1% sample, a few threshold corrections, then a
trim to k) and of torch.topk(|g|, k), their ratio, and the density top_k achieved against the
target (count / size, and as a multiple of the target). The whole DGC step of a bucket (the
residual's update and clearing, dgc.Bucket.compress) is timed too.
"""
from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys
import time

import torch

from .. import dgc
from .common import write_csv


def gradient(kind, n, seed):
    g = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    if kind == "heavy":
        return g ** 3
    if kind == "sparse":
        g[torch.rand(n, generator=torch.Generator().manual_seed(seed + 1)) < 0.9] = 0
    return g


def median_time(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e5,1e6,1e7,3.3e7")
    ap.add_argument("--ratio", type=float, default=0.05)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None, help="CSV file of the rows printed")
    args = ap.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    print(f"zen_hvd.bench.dgc: DGC sparsifier vs torch.topk, ratio {args.ratio}, median of "
          f"{args.repeats}, {torch.get_num_threads()} torch threads")
    print(f"  reproduce: python -m zen_hvd.bench.dgc {shlex.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    head = ("size", "gradient", "k", "sent", "density", "x target", "top_k ms", "torch.topk ms",
            "speed-up", "DGC step ms")
    print("  " + "".join(f"{h:>14}" for h in head))
    rows = []
    for n in sizes:
        k = max(1, math.ceil(args.ratio * n))
        for kind in ("normal", "heavy", "sparse"):
            g = gradient(kind, n, seed=n)
            mag = g.abs()
            sent = dgc.top_k(mag, k, 0.01).numel()
            ours = median_time(lambda: dgc.top_k(g.abs(), k, 0.01), args.repeats)
            full = median_time(lambda: torch.topk(g.abs(), k, sorted=False), args.repeats)
            p = torch.nn.Parameter(torch.zeros(n))
            p.grad = g
            bucket = dgc.Bucket("bench", [p], dgc.DGC(ratio=args.ratio))
            step = median_time(lambda: bucket.compress(bucket.flat_gradient(), 1), args.repeats)
            row = (n, kind, k, sent, sent / n, sent / k, ours * 1e3, full * 1e3, full / ours, step * 1e3)
            rows.append(row)
            print("  " + "".join(f"{v:>14,}" if isinstance(v, int) else f"{v:>14}" if isinstance(v, str)
                                 else f"{v:>14.4f}" if v < 1 else f"{v:>14.2f}" for v in row))
    print("  (sparse: 90% of the entries are exactly zero, and zeros are never sent; x target: "
          "sent / k; speed-up: torch.topk's time / top_k's)")
    write_csv(args.out, [dict(zip((h.replace(" ", "_") for h in head), row)) for row in rows])


if __name__ == "__main__":
    main()
