"""The time model (zen_hvd/timemodel.py) against measurement, point by point.

    python -m zen_hvd.bench.model_check [--rates 250mbit,1gbit] [--hosts 4,8,16] [--repeats 6]
                                        [--out bench_out]

Measures bench.vs_horovod's embedding gradient (200k x 64, 4096 Zipf(1.05) tokens per rank)
with Zen's balanced, hierarchical and one-shot schemes and Horovod's dense allreduce, sparse
allgather and allgather of the coalesced gradient, one launch per setting:
  calibration  2 and 3 ranks on shared memory; 2 and 3 emulated hosts at each of --rates: the
               CPU time per sync of every method, from which timemodel.calibrate fits its
               parts per message and per byte, per transport kind, and the times, from which
               it fits the overlap of CPU and wire;
  check        4 ranks on shared memory; --hosts emulated hosts at each of --rates: the model
               predicts each point from the calibration alone (the gradient's set sizes are
               counted from the ranks' real draws; the link rate is the one each launch
               measures), and the table sets it beside the measured median, with the error,
               and each setting's methods ranked by both.
Without root (no network namespaces) only the shared-memory points run. Writes
model_check.csv (every point), timemodel.json (the calibration) and the gradient's set sizes
(gradient.json) to --out, which the demo's picture reads.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

METHODS = ("horovod-dense", "horovod-sparse", "horovod-coalesced", "zen-balanced", "zen-hierarchical",
           "zen-agsparse")


def parse():
    from .common import add_gradient_args

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="250mbit,1gbit")
    ap.add_argument("--hosts", default="4,8,16")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--methods", default=",".join(METHODS))
    add_gradient_args(ap)
    ap.add_argument("--measured", default=None,
                    help="a model_check.csv written before: its measured points, no launches")
    ap.add_argument("--out", default="bench_out")
    return ap.parse_args()


def can_emulate() -> bool:
    """Network namespaces need root and the ip tool."""
    return os.geteuid() == 0 and subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0


def gradient(args, ns):
    """timemodel.Gradient of the ranks' real draws, with the unions of the first m ranks for m
    in ns and the powers of two below them."""
    import numpy as np

    from zen_hvd.timemodel import Gradient

    from .vs_horovod import zipf_tokens

    top = max(ns)
    sets = [np.unique(zipf_tokens(args.vocab, args.tokens, args.zipf, args.seed * 1000 + r)) for r in range(top)]
    ms = sorted(set(ns) | {2 ** i for i in range(top.bit_length()) if 2 ** i <= top})
    unions = {m: float(np.unique(np.concatenate(sets[:m])).size) for m in ms}
    return Gradient(args.vocab, args.dim, float(args.tokens), float(np.mean([s.size for s in sets])), unions)


def measure(args, n, rate, methods):
    """{method: dict(time_s, cpu_s, rate_bps)} of one vs_horovod launch."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "points.csv")
        cmd = [sys.executable, "-m", "zen_hvd.bench.vs_horovod", "--ranks", str(n), "--repeats", str(args.repeats),
               "--methods", ",".join(methods), "--vocab", str(args.vocab), "--dim", str(args.dim),
               "--tokens", str(args.tokens), "--zipf", str(args.zipf), "--seed", str(args.seed), "--out", out]
        if rate:
            cmd += ["--emulate", rate]
        print(f"  measuring {n} {'emulated hosts at ' + rate if rate else 'ranks on shared memory'} ...", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        with open(out) as f:
            rows = list(csv.DictReader(f))
    return {r["method"]: dict(time_s=float(r["time_ms"]) / 1e3, cpu_s=float(r["cpu_ms"]) / 1e3,
                              rate_bps=float(r["link_gbps"]) * 1e9) for r in rows}


def earlier(path):
    """The measured points of a model_check.csv, as measure() returns them per launch."""
    out = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            rate = None if r["rate"] == "shared memory" else r["rate"]
            out.setdefault((r["kind"], int(r["ranks"]), rate), {})[r["method"]] = dict(
                time_s=float(r["measured_ms"]) / 1e3, cpu_s=float(r["measured_cpu_ms"]) / 1e3,
                rate_bps=float(r["link_gbps"]) * 1e9)
    return out


def main():
    args = parse()
    from zen_hvd import timemodel

    from .common import reproduce, write_csv

    methods = [m for m in args.methods.split(",") if m]
    emulate = can_emulate()
    rates = [r for r in args.rates.split(",") if r] if emulate else []
    hosts = [int(h) for h in args.hosts.split(",") if h] if emulate else []
    calib = [("shm", n, None) for n in (2, 3)] + ([("tcp", n, r) for r in rates for n in (2, 3)] if emulate else [])
    check = [("shm", 4, None)] + [("tcp", n, r) for r in rates for n in hosts]
    g = gradient(args, [n for _, n, _ in calib + check])
    cores = os.cpu_count() or 1
    print(f"zen_hvd.bench.model_check: {len(calib)} calibration and {len(check)} check launches"
          + ("" if emulate else " (shared memory only: network namespaces need root)"), flush=True)
    measured = earlier(args.measured) if args.measured else {}
    for kind, n, rate in calib + check:
        if (kind, n, rate) not in measured:
            measured[(kind, n, rate)] = measure(args, n, rate, methods)
    constants = timemodel.calibrate(
        [dict(kind=kind, method=m, n=n, rate=rate or "shared memory", cpu_s=p["cpu_s"], time_s=p["time_s"],
              rate_bps=p["rate_bps"], sharing=timemodel.sharing(n, cores), gradient=g)
         for kind, n, rate in calib for m, p in measured[(kind, n, rate)].items()])
    rows = []
    for role, points in (("calibration", calib), ("check", check)):
        for kind, n, rate in points:
            for m, p in measured[(kind, n, rate)].items():
                model = timemodel.predict(m, n, g, p["rate_bps"], kind, constants, timemodel.sharing(n, cores),
                                          rate=rate or "shared memory")
                rows.append(dict(role=role, kind=kind, ranks=n, rate=rate or "shared memory", method=m,
                                 measured_ms=p["time_s"] * 1e3, model_ms=model["time"] * 1e3,
                                 measured_cpu_ms=p["cpu_s"] * 1e3,
                                 wire_ms=model["wire"] * 1e3, cpu_ms=model["cpu"] * 1e3,
                                 error=model["time"] / p["time_s"] - 1, link_gbps=p["rate_bps"] / 1e9))
    report(rows, args)
    os.makedirs(args.out, exist_ok=True)
    write_csv(os.path.join(args.out, "model_check.csv"), rows)
    timemodel.save(constants, os.path.join(args.out, "timemodel.json"))
    with open(os.path.join(args.out, "gradient.json"), "w") as f:
        json.dump(dict(M=g.M, D=g.D, t=g.t, k=g.k, unions={str(m): u for m, u in g.unions.items()}), f)
    print("  " + reproduce("zen_hvd.bench.model_check"))


def report(rows, args):
    print(f"\n  {'setting':<26}{'method':<19}{'measured ms':>12}{'model ms':>10}{'error':>8}"
          f"{'model wire':>11}{'model cpu':>10}")
    settings = list(dict.fromkeys((r["role"], r["kind"], r["ranks"], r["rate"]) for r in rows))
    worst, order_ok = 0.0, 0
    checks = [s for s in settings if s[0] == "check"]
    for s in settings:
        mine = [r for r in rows if (r["role"], r["kind"], r["ranks"], r["rate"]) == s]
        where = f"{s[2]} {'hosts, ' + s[3] if s[1] == 'tcp' else 'ranks, shared mem'}" + (" (calib)" if s[0] != "check" else "")
        for r in mine:
            print(f"  {where:<26}{r['method']:<19}{r['measured_ms']:>12.1f}{r['model_ms']:>10.1f}"
                  f"{r['error']:>+8.0%}{r['wire_ms']:>11.1f}{r['cpu_ms']:>10.1f}")
            where = ""
        if s[0] == "check":
            worst = max([worst] + [abs(r["error"]) for r in mine])
            by_measure = [r["method"] for r in sorted(mine, key=lambda r: r["measured_ms"])]
            by_model = [r["method"] for r in sorted(mine, key=lambda r: r["model_ms"])]
            same = by_measure == by_model
            order_ok += same
            print(f"  {'':<26}ranked by measurement: {', '.join(by_measure)}"
                  + ("  (the model ranks them the same)" if same else f"\n  {'':<26}ranked by the model:   {', '.join(by_model)}"))
    print(f"\n  largest model error over the {len(checks)} check settings: {worst:.0%}; the model ranks the "
          f"methods as measured in {order_ok} of {len(checks)}")


if __name__ == "__main__":
    main()
