"""Every example trained under every synchronization: samples/s and bytes per step (the paper's
kind of table, its Figures 11 and 13).

    python -m zen_hvd.bench.examples [--ranks 4] [--emulate 1gbit] [--steps 10] [--warmup 3]
                                     [--examples lstm_lm,deepfm,nmt,gpt] [--out bench_out]

Each example (examples/*.py at its --small size) runs once per synchronization, each run its own
launch (mpirun with --ranks local ranks, or with --emulate one rank per network namespace
joined by tc-limited links: scripts/netns_cluster.sh, needs root):
  - lstm_lm, deepfm, nmt (embedding gradients, sparse by nature): Zen (scheme auto), Horovod's
    dense allreduce (AllReduce: sparse_as_dense=True), Horovod's sparse allgather, and Zen's
    baselines by name (AGsparse, SparCML, OmniReduce, SparsePS);
  - gpt (dense gradients sparsified by DGC at 5%): DGC through Zen (auto) and through each
    baseline, against Horovod without DGC (dense allreduce, and its sparse path for the
    embedding).
Samples/s is rank 0's over the timed steps (after --warmup untimed ones); bytes per step per
rank are Zen's counted by its transports plus Horovod's computed from tensor sizes (see
examples/common.py). Prints the table (samples/s also as a multiple of AllReduce's) and
writes <out>/examples.csv and <out>/examples.png. Started under mpirun or horovodrun, it runs
every example in its own processes on that job's ranks instead (--ranks and --emulate unused).
"""
from __future__ import annotations

import argparse
import csv
import os
import shlex
import subprocess
import sys
import tempfile
import time

from .common import Progress, launch_command, reproduce, under_launcher, write_csv

EXAMPLES_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
BASELINES = (("AGsparse", "agsparse"), ("SparCML", "sparcml"), ("OmniReduce", "omnireduce"),
             ("SparsePS", "sparse_ps"))
# (label, the example's arguments) per example kind; AllReduce is every ratio's reference.
NATURAL = [("Zen", ["--sync", "zen"]), ("AllReduce", ["--sync", "horovod-dense"]),
           ("Horovod sparse", ["--sync", "horovod"])] + \
          [(label, ["--sync", "zen", "--scheme", s]) for label, s in BASELINES]
DGC = [("Zen + DGC 5%", ["--sync", "zen", "--dgc", "0.05"]), ("AllReduce", ["--sync", "horovod-dense"]),
       ("Horovod sparse", ["--sync", "horovod"])] + \
      [(f"{label} + DGC 5%", ["--sync", "zen", "--dgc", "0.05", "--scheme", s]) for label, s in BASELINES]
RUNS = {"lstm_lm": NATURAL, "deepfm": NATURAL, "nmt": NATURAL, "gpt": DGC}
FIELDS = ("example", "sync", "samples_per_s", "vs_allreduce", "bytes_per_step", "zen_bytes_per_step",
          "horovod_bytes_per_step", "loss", "seconds")


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--emulate", default=None, help="link rate such as 1gbit: namespaces + tc")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    ap.add_argument("--examples", default=",".join(RUNS))
    ap.add_argument("--out", default="bench_out")
    args = ap.parse_args(argv)
    unknown = set(args.examples.split(",")) - set(RUNS)
    if unknown:
        ap.error(f"unknown examples {sorted(unknown)}: choose from {list(RUNS)}")
    return args


def run_one(args, example, extra, csv_path):
    """One launch of an example; returns its last CSV row (a dict) and the seconds it took."""
    command = [sys.executable, os.path.join(EXAMPLES_DIR, f"{example}.py"), "--small", "--no-progress",
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--csv", csv_path, *extra]
    for attempt in range(3):
        t0 = time.perf_counter()
        proc = subprocess.run(launch_command(args.ranks, args.emulate, command), capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        # Open MPI's daemons now and then fail to start inside the network namespaces (a crash
        # in orted before any rank runs): launch again rather than lose the table.
        if proc.returncode == 0 or "ORTE was unable to reliably start" not in proc.stdout + proc.stderr:
            break
        print(f"  (mpirun could not start its daemons; launching again, attempt {attempt + 2} of 3)", flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    with open(csv_path) as f:
        return list(csv.DictReader(f))[-1], seconds


def run_in_job(args, example, extra, csv_path):
    """Under a launcher already: the example on this job's ranks, in this process. Returns its
    last CSV row on rank 0 (None elsewhere) and the seconds it took."""
    import importlib

    import horovod.torch as hvd

    if EXAMPLES_DIR not in sys.path:
        sys.path.insert(0, EXAMPLES_DIR)
    module = importlib.import_module(example)
    t0 = time.perf_counter()
    module.train(module.parse_args(["--small", "--no-progress", "--steps", str(args.steps), "--warmup",
                                    str(args.warmup), "--csv", csv_path, *extra]))
    seconds = time.perf_counter() - t0
    if hvd.rank() != 0:
        return None, seconds
    with open(csv_path) as f:
        return list(csv.DictReader(f))[-1], seconds


def measure(args, in_job=False):
    plan = [(ex, label, extra) for ex in args.examples.split(",") for label, extra in RUNS[ex]]
    if in_job:
        import zen_hvd

        zen_hvd.init()
        import horovod.torch as hvd

        args.ranks, args.emulate, rank0 = hvd.size(), None, hvd.rank() == 0
    rows, progress = [], Progress(len(plan), active=not in_job or rank0)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (example, label, extra) in enumerate(plan):
            progress.stage(f"{example}: {label}")
            if in_job:   # one path on every rank: the example's rank 0 writes it
                path = os.path.join(os.path.abspath(args.out), "runs", f"{i}.csv")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                row, seconds = run_in_job(args, example, extra, path)
                if row is None:
                    continue
            else:
                row, seconds = run_one(args, example, extra, os.path.join(tmp, f"{i}.csv"))
            zen, horovod = float(row["zen_bytes_per_step"]), float(row["peer_bytes_per_step"])
            rows.append(dict(example=example, sync=label, samples_per_s=float(row["samples_per_s"]),
                             bytes_per_step=zen + horovod, zen_bytes_per_step=zen,
                             horovod_bytes_per_step=horovod, loss=float(row["loss"]), seconds=seconds))
    if in_job and not rank0:
        return None
    for r in rows:
        ref = next(q for q in rows if q["example"] == r["example"] and q["sync"] == "AllReduce")
        r["vs_allreduce"] = r["samples_per_s"] / ref["samples_per_s"]
    return rows


def setting(args):
    where = (f"{args.ranks} emulated hosts, {args.emulate} links" if args.emulate
             else f"{args.ranks} ranks on one machine (shared memory)" if not under_launcher()
             else f"{args.ranks} ranks of the job it was started in")
    return f"{where}, {os.cpu_count()} cores, --small models, {args.steps} timed steps after {args.warmup}"


def report(args, rows):
    print(f"\nzen_hvd.bench.examples: {setting(args)}")
    print("  " + reproduce("zen_hvd.bench.examples"))
    print(f"  {'example':<9}{'synchronization':<24}{'samples/s':>11}{'x AllReduce':>13}"
          f"{'bytes/step/rank':>17}{'loss':>9}")
    for r in rows:
        print(f"  {r['example']:<9}{r['sync']:<24}{r['samples_per_s']:>11.1f}{r['vs_allreduce']:>13.2f}"
              f"{r['bytes_per_step']:>17,.0f}{r['loss']:>9.4f}")
    print("  (bytes: received per step per rank, Zen's counted + Horovod's computed; loss: the mean "
          "of the timed steps' losses, over ranks)")
    write_csv(os.path.join(args.out, "examples.csv"), [{k: r[k] for k in FIELDS} for r in rows])
    print(f"wrote {plot(args, rows)}")


def plot(args, rows):
    """Per example: samples/s (top) and bytes per step (bottom, log axis), one bar per
    synchronization, Zen's bars first and marked."""
    from matplotlib.figure import Figure

    examples = list(dict.fromkeys(r["example"] for r in rows))
    fig = Figure(figsize=(4.2 * len(examples), 7.5), layout="constrained")
    axes = fig.subplots(2, len(examples), squeeze=False)
    for col, example in enumerate(examples):
        mine = [r for r in rows if r["example"] == example]
        labels = [r["sync"] for r in mine]
        colors = ["tab:green" if r["sync"].startswith("Zen") else
                  "tab:gray" if r["sync"] in ("AllReduce", "Horovod sparse") else "tab:blue" for r in mine]
        for row, (key, ylabel) in enumerate((("samples_per_s", "samples/s (higher is better)"),
                                             ("bytes_per_step", "bytes/step/rank received (log)"))):
            ax = axes[row][col]
            ax.bar(range(len(mine)), [r[key] for r in mine], color=colors)
            ax.set_xticks(range(len(mine)), labels, rotation=45, ha="right", fontsize=8)
            ax.set_ylabel(ylabel)
            if row == 1:   # log: AllReduce's bytes would flatten the others; floor below the least
                ax.set_yscale("log")
                ax.set_ylim(bottom=min(r[key] for r in mine) / 3)
            else:
                ax.set_title(example)
    from matplotlib.patches import Patch

    fig.legend(handles=[Patch(color="tab:green", label="Zen"), Patch(color="tab:gray", label="Horovod"),
                        Patch(color="tab:blue", label="Zen's baselines (scheme=...)")],
               loc="outside lower center", ncols=3)
    fig.suptitle(f"Training throughput and bytes per step\n{setting(args)}", fontsize=10)
    path = os.path.join(args.out, "examples.png")
    fig.savefig(path, dpi=100)
    return path


def main(argv=None):
    args = parse(argv)
    rows = measure(args, in_job=under_launcher())
    if rows is not None:
        report(args, rows)


if __name__ == "__main__":
    main()
