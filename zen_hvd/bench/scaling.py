"""Where Zen wins: time per sync against the number of hosts, measured where this machine can
and projected by the checked time model (zen_hvd/timemodel.py) beyond.

    python -m zen_hvd.bench.scaling [--hosts 4,8] [--rate 1gbit] [--project-to 128]
                                    [--repeats 5] [--out bench_out]

bench.vs_horovod's embedding gradient (200k x 64, 4096 Zipf(1.05) tokens per rank), synced by
Zen (balanced), Horovod's sparse allgather (what its optimizer does) and Horovod's dense
allreduce (AllReduce):
  1. calibration: 2 and 3 ranks on shared memory, and with root 2 and 3 emulated hosts at
     --rate (timemodel.calibrate), unless --out holds a model_check calibration already;
  2. measured: with root, --hosts emulated hosts at --rate (network namespaces,
     scripts/netns_cluster.sh), each beside the model's time for that very point (the hosts
     share this machine's 2 cores: the model shares the CPU out);
  3. projected: 2 to --project-to hosts of one rank with cores of its own each, links at
     --rate, by the model calibrated in step 1.
Prints both, says which is which, and draws scaling.png in --out: measured points filled,
the model at the measured points hollow, projected lines dashed.
"""
from __future__ import annotations

import argparse
import os

METHODS = ("zen-balanced", "horovod-sparse", "horovod-dense")
LABELS = {"zen-balanced": "Zen (balanced)", "horovod-sparse": "Horovod sparse allgather",
          "horovod-dense": "AllReduce (Horovod dense)"}


def parse():
    from .common import add_gradient_args

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="4,8")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--project-to", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    add_gradient_args(ap)
    ap.add_argument("--out", default="bench_out")
    return ap.parse_args()


def main():
    args = parse()
    from zen_hvd import timemodel

    from .common import rate_bps, reproduce
    from .model_check import can_emulate, gradient, measure

    methods = list(METHODS)
    emulate = can_emulate()
    hosts = [int(h) for h in args.hosts.split(",") if h] if emulate else []
    projected = timemodel.geometric_hosts(2, args.project_to)
    g = gradient(args, sorted(set(projected) | set(hosts) | {2, 3}))
    cores = os.cpu_count() or 1
    kind = "tcp" if emulate else "shm"
    saved = os.path.join(args.out, "timemodel.json")
    label = args.rate if emulate else "shared memory"
    if os.path.exists(saved) and all((kind, m, label) in timemodel.load(saved) for m in methods):
        constants = timemodel.load(saved)
        print(f"scaling: the time model's calibration from {saved} (bench.model_check)", flush=True)
    else:
        calib = [("shm", n, None) for n in (2, 3)] + ([("tcp", n, args.rate) for n in (2, 3)] if emulate else [])
        print(f"scaling: calibrating the time model ({len(calib)} short launches)", flush=True)
        points = []
        for k, n, rate in calib:
            for m, p in measure(args, n, rate, methods).items():
                points.append(dict(kind=k, method=m, n=n, rate=rate or "shared memory", cpu_s=p["cpu_s"], time_s=p["time_s"],
                                   rate_bps=p["rate_bps"], sharing=timemodel.sharing(n, cores), gradient=g))
        constants = timemodel.calibrate(points)
    measured = {n: measure(args, n, args.rate, methods) for n in hosts}
    rate = rate_bps(args.rate)
    lines = {m: {n: timemodel.predict(m, n, g, rate, kind, constants, rate=label)["time"] for n in projected}
             for m in methods}
    print(f"\nscaling: {LABELS['zen-balanced']} against Horovod, embedding {args.vocab:,} x {args.dim}, "
          f"{args.tokens:,} Zipf({args.zipf}) tokens per rank; links at {args.rate}")
    print("  " + reproduce("zen_hvd.bench.scaling"))
    checks = {}
    if measured:
        print(f"  MEASURED here (emulated hosts sharing this machine's {cores} cores), and the model at the same point:")
        for n, got in measured.items():
            for m in methods:
                model = timemodel.predict(m, n, g, got[m]["rate_bps"], kind, constants, timemodel.sharing(n, cores),
                                          rate=label)
                checks[(n, m)] = model["time"]
                print(f"    {n:>3} hosts  {LABELS[m]:<28}{got[m]['time_s'] * 1e3:>9.1f} ms measured"
                      f"{model['time'] * 1e3:>9.1f} ms model ({model['time'] / got[m]['time_s'] - 1:+.0%})")
    print(f"  PROJECTED by the model (one rank per host, cores of its own, {args.rate} links):")
    for n in projected:
        print(f"    {n:>3} hosts  " + "  ".join(f"{LABELS[m]} {lines[m][n] * 1e3:.1f} ms" for m in methods))
    plot(args, methods, measured, checks, lines)
    summary(args, measured, lines, projected)


def summary(args, measured, lines, projected):
    """The last lines: where Zen is faster, by how much, measured or projected."""
    print()
    for n, got in measured.items():
        z = got["zen-balanced"]["time_s"]
        print(f"  MEASURED, {n} emulated hosts at {args.rate}: Zen {z * 1e3:.1f} ms per sync, "
              f"{got['horovod-sparse']['time_s'] / z:.1f}x faster than Horovod's sparse allgather and "
              f"{got['horovod-dense']['time_s'] / z:.1f}x faster than AllReduce")
    top = projected[-1]
    z = lines["zen-balanced"]
    wins = [n for n in projected if z[n] < lines["horovod-sparse"][n]]
    where = f"from {wins[0]} hosts on" if wins and wins == projected[projected.index(wins[0]):] else \
        (f"at {', '.join(map(str, wins))} hosts" if wins else "at none of the host counts")
    print(f"  PROJECTED (the model, not a measurement), {top} hosts at {args.rate}: Zen {z[top] * 1e3:.1f} ms per "
          f"sync, {lines['horovod-sparse'][top] / z[top]:.1f}x faster than Horovod's sparse allgather and "
          f"{lines['horovod-dense'][top] / z[top]:.1f}x faster than AllReduce; faster than the allgather {where}")


def plot(args, methods, measured, checks, lines):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  (matplotlib is not installed: no picture)")
        return
    colors = {"zen-balanced": "tab:blue", "horovod-sparse": "tab:orange", "horovod-dense": "tab:gray"}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in methods:
        ns = sorted(lines[m])
        ax.plot(ns, [lines[m][n] * 1e3 for n in ns], "--", color=colors[m], label=f"{LABELS[m]}, projected")
        if measured:
            xs = sorted(measured)
            ax.plot(xs, [measured[n][m]["time_s"] * 1e3 for n in xs], "o", color=colors[m],
                    label=f"{LABELS[m]}, measured")
            ax.plot(xs, [checks[(n, m)] * 1e3 for n in xs], "o", mfc="none", color=colors[m])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("hosts (one rank each)")
    ax.set_ylabel("time per sync (ms)")
    ax.set_title(f"Zen vs Horovod, embedding {args.vocab:,} x {args.dim}, {args.rate} links\n"
                 "filled: measured on emulated hosts; hollow: model there; dashed: model, own cores",
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "scaling.png")
    fig.savefig(path, dpi=120)
    print(f"  wrote {path}")


if __name__ == "__main__":
    main()
