"""Every scheme on the same workloads, normalized to dense AllReduce (the paper's Figure 8).

    python -m zen_hvd.bench.schemes [--ranks 2,4,8] [--workloads embedding,dgc] [--repeats 5]
                                    [--emulate 1gbit] [--out bench_out]

Started plainly, it runs itself under mpirun once per N of --ranks (or, with --emulate, on N
network namespaces joined by tc-limited links: scripts/netns_cluster.sh). Per workload
(characteristics.WORKLOADS: embedding-like Zipf rows at 1%, DGC-like elements at 5%), per
scheme: median time per sync over the repeats (rank max), data bytes received per rank (max and
mean, transport counters), both also divided by AllReduce's; which scheme "auto" picked (after
its profiling calls) and whether it was the fastest. Writes <out>/schemes.csv and
<out>/schemes.png (normalized time vs N, one line per scheme), and the cost model's check
against the measured points plus its projection to 16..128 workers (<out>/costmodel.png).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import subprocess
import sys

SCHEME_ORDER = ("allreduce", "balanced", "hierarchical", "sparcml", "agsparse", "sparse_ps", "omnireduce")
PROJECT_N = (16, 32, 64, 128)
FIELDS = ("workload", "n", "scheme", "time_s", "bytes_max", "bytes_mean", "crit_bytes",
          "time_norm", "bytes_norm", "auto_pick")


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4,8", help="comma list of N; one launch per N")
    ap.add_argument("--workloads", default="embedding,dgc")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--transport", default=None)
    ap.add_argument("--emulate", default=None, help="link rate, e.g. 1gbit: namespaces + tc")
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args()


# -- one N, under mpirun ----------------------------------------------------------------------
def child(args):
    import numpy as np
    import torch

    import zen_hvd
    from zen_hvd import auto, characteristics, workloads
    from zen_hvd.bench.common import Progress, gather, share_cores, time_calls

    zen_hvd.init()
    import horovod.torch as hvd

    share_cores()
    n, me = hvd.size(), hvd.rank()
    zen_hvd.set_seed(12345)
    rows, chars = [], {}
    kinds = args.workloads.split(",")
    progress = Progress(len(kinds) * len(SCHEME_ORDER), active=me == 0)
    for kind in kinds:
        sets, w = characteristics.workload_sets(kind, n, args.seed)
        M, D = w["M"], w["D"]
        vals = torch.from_numpy(workloads.rank_values(sets[me], D, me, args.seed))
        if D > 1:
            grad = torch.sparse_coo_tensor(torch.from_numpy(sets[me]).reshape(1, -1), vals, (M, D),
                                           check_invariants=True)
        else:
            grad = torch.sparse_coo_tensor(torch.from_numpy(sets[me]).reshape(1, -1), vals[:, 0], (M,),
                                           check_invariants=True)
        grad = grad.coalesce()
        measured = {}
        for scheme in SCHEME_ORDER:
            progress.stage(f"{n} ranks, {kind}: {scheme}")
            sync = lambda: zen_hvd.sparse_allreduce(grad, name=f"{kind}.{scheme}", op=zen_hvd.Sum,  # noqa: E731
                                                    scheme=scheme, transport=args.transport)
            t, recv, st = time_calls(sync, args.repeats)
            sent = st["bytes_sent"] / args.repeats
            per_rank = np.array(gather([t, recv, max(recv, sent)]))
            measured[scheme] = (per_rank[:, 0].max(), per_rank[:, 1].max(), per_rank[:, 1].mean(),
                                per_rank[:, 2].max())
        auto.reset()
        for _ in range(3):   # profiling calls, then the choice it would keep
            zen_hvd.sparse_allreduce(grad, name=f"{kind}.auto", op=zen_hvd.Sum, transport=args.transport)
        pick = auto.scheme_choices()[f"{kind}.auto"]["scheme"]
        base_t, base_b = measured["allreduce"][0], measured["allreduce"][1]
        for scheme, (t, bmax, bmean, crit) in measured.items():
            rows.append(dict(workload=kind, n=n, scheme=scheme, time_s=t, bytes_max=bmax, bytes_mean=bmean,
                             crit_bytes=crit, time_norm=t / base_t, bytes_norm=bmax / base_b, auto_pick=pick))
        if me == 0:
            ch = characteristics.characterize(sets, M, D)
            ch["blocks"] = characteristics.block_stats(sets, M, D)
            ch["value_bytes"] = D * 4
            # skew depends on the number of parts: computed from the same sets for the projection
            ch["at"] = {str(m): dict(skew=(float(np.mean([characteristics.skew_ratio(s, M, m) for s in sets])),
                                           characteristics.skew_ratio(np.unique(np.concatenate(sets)), M, m)),
                                     blocks=characteristics.block_stats(sets, M, D, m)) for m in PROJECT_N}
            chars[kind] = ch
    if me == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"part_{n}.json"), "w") as f:
            json.dump(dict(rows=rows, characteristics=chars), f)


# -- the driver -------------------------------------------------------------------------------
def launch(args, n):
    here = [sys.executable, "-m", "zen_hvd.bench.schemes", "--child", "--workloads", args.workloads,
            "--repeats", str(args.repeats), "--out", os.path.abspath(args.out), "--seed", str(args.seed)]
    if args.transport:
        here += ["--transport", args.transport]
    from zen_hvd.bench.common import launch_command

    cmd = launch_command(n, args.emulate, here)
    print("+", shlex.join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def report(args, parts):
    rows = [r for p in parts for r in p["rows"]]
    path = os.path.join(args.out, "schemes.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        w.writerows(rows)
    mode = f"emulated {args.emulate} links (network namespaces + tc)" if args.emulate else \
        "one machine, shared memory / loopback (not bandwidth-bound)"
    print(f"\nzen_hvd.bench.schemes: {mode}; time = median of {args.repeats} syncs (rank max); "
          "bytes = data bytes received per rank per sync")
    for kind in args.workloads.split(","):
        for n in sorted({r["n"] for r in rows}):
            sel = [r for r in rows if r["workload"] == kind and r["n"] == n]
            if not sel:
                continue
            fastest = min(sel, key=lambda r: r["time_s"])["scheme"]
            pick = sel[0]["auto_pick"]
            print(f"\n[{kind}, N={n}] auto picked {pick}; fastest measured: {fastest}"
                  f" ({'auto was fastest' if pick == fastest else 'auto was not the fastest'})")
            print(f"  {'scheme':<13}{'time ms':>9}{'t/AR':>7}{'recv max':>12}{'recv mean':>12}{'b/AR':>7}")
            for r in sel:
                print(f"  {r['scheme']:<13}{r['time_s'] * 1e3:>9.2f}{r['time_norm']:>7.2f}"
                      f"{r['bytes_max']:>12,.0f}{r['bytes_mean']:>12,.0f}{r['bytes_norm']:>7.2f}")
    print(f"\nwrote {path}")
    plot(args, rows)
    costmodel_check(args, parts, rows)


def plot(args, rows):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = args.workloads.split(",")
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 3.8), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for scheme in SCHEME_ORDER:
            pts = sorted((r["n"], r["time_norm"]) for r in rows if r["workload"] == kind and r["scheme"] == scheme)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=scheme)
        ax.set_title(kind)
        ax.set_xlabel("number of workers")
        ax.set_ylabel("comm. time / AllReduce")
        ax.set_xscale("log", base=2)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(args.out, "schemes.png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def costmodel_check(args, parts, rows):
    """Predicted vs measured critical-path bytes (and time when emulated) at the measured N;
    projection to 16..128 workers at 25 and 100 Gbit/s from the largest N's characteristics."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from zen_hvd import costmodel

    print("\ncost model check (critical-path bytes: max over ranks of max(sent, received) per sync)")
    errs, terrs = [], []
    rate = _rate_bps(args.emulate) if args.emulate else None
    for p in parts:
        for kind, ch in p["characteristics"].items():
            n = ch["n"]
            gamma = costmodel.gamma_curve(n, ch["k"], ch["gamma_n"], ch["stage_gammas"])
            pred = costmodel.predict_bytes(n, ch["M"], ch["d_G"], gamma, ch["value_bytes"],
                                           skew=(ch["skew_worker"], ch["skew_union"]), blocks=ch["blocks"])
            ptime = costmodel.predict_time(n, ch["M"], ch["d_G"], gamma, ch["value_bytes"], rate,
                                           skew=(ch["skew_worker"], ch["skew_union"]),
                                           blocks=ch["blocks"]) if rate else None
            line = []
            for r in rows:
                if r["workload"] == kind and r["n"] == n:
                    e = pred[r["scheme"]] / max(r["crit_bytes"], 1) - 1
                    errs.append(abs(e))
                    line.append(f"{r['scheme']} {e:+.0%}")
                    if ptime:
                        terrs.append(abs(ptime[r["scheme"]] / r["time_s"] - 1))
            print(f"  {kind} N={n}: " + ", ".join(line))
    if errs:
        print(f"  bytes: mean |error| {np.mean(errs):.1%}, max {np.max(errs):.1%}")
    if terrs:
        print(f"  time ({args.emulate}): mean |error| {np.mean(terrs):.1%}, max {np.max(terrs):.1%}")
    last = max(parts, key=lambda p: max(c["n"] for c in p["characteristics"].values()))
    Ns = list(PROJECT_N)
    fig, axes = plt.subplots(2, len(last["characteristics"]), figsize=(5 * len(last["characteristics"]), 7),
                             squeeze=False)
    print("\nprojection (cost model, time / AllReduce):")
    for col, (kind, ch) in enumerate(last["characteristics"].items()):
        gamma = costmodel.gamma_curve(ch["n"], ch["k"], ch["gamma_n"], ch["stage_gammas"])
        for row, gbps in enumerate((25, 100)):
            ax = axes[row][col]
            table = {}
            for n in Ns:
                at = ch["at"][str(n)]
                bl = dict(at["blocks"])   # union of blocks at n workers: the universe fit in blocks
                bl["union"] = bl["k"] * costmodel.gamma_curve(ch["n"], bl["k"], ch["blocks"]["union"] / bl["k"])(n)
                at = dict(at, blocks=bl)
                t = costmodel.predict_time(n, ch["M"], ch["d_G"], gamma, ch["value_bytes"], gbps * 1e9,
                                           skew=tuple(at["skew"]), blocks=at["blocks"])
                table[n] = {s: t[s] / t["allreduce"] for s in t}
            for s in SCHEME_ORDER:
                ax.plot(Ns, [table[n][s] for n in Ns], marker="o", label=s)
            ax.set_title(f"{kind}, {gbps} Gbit/s (model)")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("number of workers")
            ax.set_ylabel("comm. time / AllReduce")
            print(f"  {kind} {gbps} Gbit/s: " + "; ".join(
                f"N={n}: " + " ".join(f"{s}={table[n][s]:.2f}" for s in SCHEME_ORDER) for n in Ns))
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(args.out, "costmodel.png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def _rate_bps(text: str) -> float:
    text = text.lower().rstrip("bit/s").rstrip("bps")
    scale = {"k": 1e3, "m": 1e6, "g": 1e9}.get(text[-1:], 1)
    return float(text[:-1] if text[-1:] in "kmg" else text) * scale


def main():
    args = parse()
    if args.child:
        return child(args)
    os.makedirs(args.out, exist_ok=True)
    parts = []
    sizes = list(map(int, args.ranks.split(",")))
    for i, n in enumerate(sizes):
        print(f"== launch {i + 1}/{len(sizes)}: {n} ranks", flush=True)
        launch(args, n)
        with open(os.path.join(args.out, f"part_{n}.json")) as f:
            parts.append(json.load(f))
    report(args, parts)
    print("# reproduce: python -m zen_hvd.bench.schemes " + shlex.join(sys.argv[1:]))


if __name__ == "__main__":
    main()
