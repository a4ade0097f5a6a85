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
Started under mpirun or horovodrun, it measures that job's N only, on its ranks.
"""
from __future__ import annotations

import argparse
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
    from zen_hvd.bench.common import reproduce, write_csv

    rows = [r for p in parts for r in p["rows"]]
    print(f"\nzen_hvd.bench.schemes: {setting(args)}; bytes = data bytes received per rank per sync")
    print("  " + reproduce("zen_hvd.bench.schemes"))
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
    print()
    write_csv(os.path.join(args.out, "schemes.csv"), [{k: r[k] for k in FIELDS} for r in rows])
    plot(args, rows, parts)
    costmodel_check(args, parts, rows)


def setting(args) -> str:
    where = f"emulated {args.emulate} links (network namespaces + tc)" if args.emulate else \
        "one machine, shared memory / loopback (not bandwidth-bound)"
    return f"{where}; {os.cpu_count()} cores; median of {args.repeats} syncs (rank max)"


def _at(ch, n):
    """(gamma curve, skew, blocks) of a launch's characteristics, at its own n or projected to n."""
    from zen_hvd import costmodel

    gamma = costmodel.gamma_curve(ch["n"], ch["k"], ch["gamma_n"], ch["stage_gammas"])
    if n == ch["n"]:
        return gamma, (ch["skew_worker"], ch["skew_union"]), ch["blocks"]
    at = ch["at"][str(n)]
    bl = dict(at["blocks"])   # union of blocks at n workers: the universe fit in blocks
    bl["union"] = bl["k"] * costmodel.gamma_curve(ch["n"], bl["k"], ch["blocks"]["union"] / bl["k"])(n)
    return gamma, tuple(at["skew"]), bl


def predicted(ch, n, rate=None) -> dict:
    """The cost model's critical-path bytes (rate None) or time at `rate` bit/s, per scheme."""
    from zen_hvd import costmodel

    gamma, skew, blocks = _at(ch, n)
    if rate is None:
        return costmodel.predict_bytes(n, ch["M"], ch["d_G"], gamma, ch["value_bytes"], skew=skew, blocks=blocks)
    return costmodel.predict_time(n, ch["M"], ch["d_G"], gamma, ch["value_bytes"], rate, skew=skew, blocks=blocks)


# Measured points are filled markers on solid lines; the cost model's are hollow on dashed lines.
MEASURED = dict(marker="o", ls="-")
MODEL = dict(marker="o", ls="--", mfc="none")


def _style_legend(ax, with_model: bool) -> None:
    from matplotlib.lines import Line2D

    handles, labels = ax.get_legend_handles_labels()
    if with_model:
        handles += [Line2D([], [], color="k", **MEASURED), Line2D([], [], color="k", **MODEL)]
        labels += ["measured", "cost model"]
    ax.legend(handles, labels, fontsize=7, ncol=2)


def plot(args, rows, parts):
    """schemes.png: measured time / AllReduce against N per workload (log axis: AllReduce's 1.0
    would squash the sparse schemes), with the cost model at the measured N on emulated links."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = args.workloads.split(",")
    from zen_hvd.bench.common import rate_bps

    rate = rate_bps(args.emulate) if args.emulate else None
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4.4), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        chs = sorted((p["characteristics"][kind] for p in parts if kind in p["characteristics"]),
                     key=lambda ch: ch["n"])
        model = [(ch["n"], predicted(ch, ch["n"], rate)) for ch in chs] if rate else []
        for c, scheme in enumerate(SCHEME_ORDER):
            pts = sorted((r["n"], r["time_norm"]) for r in rows if r["workload"] == kind and r["scheme"] == scheme)
            if pts:
                ax.plot(*zip(*pts), color=f"C{c}", label=scheme, **MEASURED)
            if model:
                ax.plot([n for n, _ in model], [t[scheme] / t["allreduce"] for _, t in model],
                        color=f"C{c}", **MODEL)
        ax.set_title(f"{kind}: measured" + (" and cost model" if rate else ""))
        ax.set_xlabel("number of workers")
        ax.set_ylabel("comm. time / AllReduce (log)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sorted({r["n"] for r in rows}), [str(n) for n in sorted({r["n"] for r in rows})])
        _style_legend(ax, bool(rate))
    fig.suptitle(setting(args), fontsize=9)
    fig.tight_layout()
    path = os.path.join(args.out, "schemes.png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def costmodel_check(args, parts, rows):
    """Predicted vs measured critical-path bytes (and time when emulated) at the measured N;
    projection to 16..128 workers (bytes, and time at 25 and 100 Gbit/s) from the largest N's
    characteristics, drawn in costmodel.png with the measured bytes beside the model's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    print("\ncost model check (critical-path bytes: max over ranks of max(sent, received) per sync)")
    errs, terrs = [], []
    from zen_hvd.bench.common import rate_bps

    rate = rate_bps(args.emulate) if args.emulate else None
    for p in parts:
        for kind, ch in p["characteristics"].items():
            n = ch["n"]
            pred = predicted(ch, n)
            ptime = predicted(ch, n, rate) if rate else None
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
    kinds = list(last["characteristics"])
    fig, axes = plt.subplots(3, len(kinds), figsize=(5.5 * len(kinds), 10.5), squeeze=False)
    print("\nprojection (cost model, time / AllReduce):")
    for col, kind in enumerate(kinds):
        ch = last["characteristics"][kind]
        # Row 0: bytes, measured at the launched N and predicted there and beyond.
        ax = axes[0][col]
        own = {p["characteristics"][kind]["n"]: p["characteristics"][kind] for p in parts
               if kind in p["characteristics"]}
        model_ns = sorted(own) + Ns
        model = [predicted(own.get(n, ch), n) for n in model_ns]
        for c, s in enumerate(SCHEME_ORDER):
            pts = sorted((r["n"], r["crit_bytes"] / next(q["crit_bytes"] for q in rows if q["workload"] == kind
                                                         and q["n"] == r["n"] and q["scheme"] == "allreduce"))
                         for r in rows if r["workload"] == kind and r["scheme"] == s)
            ax.plot(*zip(*pts), color=f"C{c}", label=s, **MEASURED)
            ax.plot(model_ns, [b[s] / b["allreduce"] for b in model], color=f"C{c}", **MODEL)
        ax.set_title(f"{kind}: critical-path bytes, measured N={','.join(map(str, sorted(own)))} and model")
        ax.set_ylabel("bytes / AllReduce (log)")
        _style_legend(ax, True)
        # Rows 1 and 2: the model's time at data-centre link rates (no measured points there).
        for row, gbps in enumerate((25, 100), start=1):
            ax = axes[row][col]
            table = {}
            for n in Ns:
                t = predicted(ch, n, gbps * 1e9)
                table[n] = {s: t[s] / t["allreduce"] for s in t}
            for c, s in enumerate(SCHEME_ORDER):
                ax.plot(Ns, [table[n][s] for n in Ns], color=f"C{c}", label=s, **MODEL)
            ax.set_title(f"{kind}, {gbps} Gbit/s: cost model only (projected from N={ch['n']})")
            ax.set_ylabel("comm. time / AllReduce (log)")
            _style_legend(ax, False)
            print(f"  {kind} {gbps} Gbit/s: " + "; ".join(
                f"N={n}: " + " ".join(f"{s}={table[n][s]:.2f}" for s in SCHEME_ORDER) for n in Ns))
        for row, ax in enumerate(axes[:, col]):
            ticks = model_ns if row == 0 else Ns
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [str(n) for n in ticks])
            ax.set_yscale("log")
            ax.set_xlabel("number of workers")
    fig.suptitle("filled markers, solid lines: measured here; hollow markers, dashed lines: cost model "
                 f"(zen_hvd/costmodel.py)\nmeasured on {setting(args)}", fontsize=9)
    fig.tight_layout()
    path = os.path.join(args.out, "costmodel.png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")



def main():
    from zen_hvd.bench.common import under_launcher

    args = parse()
    if args.child:
        return child(args)
    if under_launcher():   # started by mpirun / horovodrun: one N, this job's, on its ranks
        child(args)
        import horovod.torch as hvd

        if hvd.rank() == 0:
            with open(os.path.join(args.out, f"part_{hvd.size()}.json")) as f:
                report(args, [json.load(f)])
        return
    os.makedirs(args.out, exist_ok=True)
    parts = []
    sizes = list(map(int, args.ranks.split(",")))
    for i, n in enumerate(sizes):
        print(f"== launch {i + 1}/{len(sizes)}: {n} ranks", flush=True)
        launch(args, n)
        with open(os.path.join(args.out, f"part_{n}.json")) as f:
            parts.append(json.load(f))
    report(args, parts)


if __name__ == "__main__":
    main()
