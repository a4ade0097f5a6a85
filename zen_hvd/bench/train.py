"""Training benchmark: the LSTM language model of examples/lstm_lm.py at its --small (CPU) sizes,
synchronized three ways.

    python -m zen_hvd.bench.train [--ranks 4] [--rounds 3] [--steps 20] [--warmup 3] [--batch 16]
                                  [--seq-len 20] [--hidden 128] [--out F.csv]

Starts itself under mpirun with --ranks ranks when launched plainly, then trains the same model
from the same seeds with Zen (zen_hvd.DistributedOptimizer), Horovod's allreduce with
sparse_as_dense=True, and Horovod's default sparse path (allgather), and prints samples/s,
from the median time of a step (the slowest rank's median, after --warmup untimed steps; Zen
and Horovod's sparse path run --rounds times each, alternating, so that the noise of a shared
machine falls on both alike; the median over rounds is printed; sparse_as_dense runs 5 steps once),
bytes received per step per rank (Zen's counted by its transports, Horovod's computed from
tensor sizes, as the example explains) and the final loss of each. Zen's and Horovod sparse's
losses must agree (they compute the same averaged gradients up to float rounding) and Zen must
move the fewest bytes. A line per run says how long is left; --out writes the table as CSV.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys

from .common import Progress, ensure_launched, gather, reproduce, share_cores, write_csv

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "lstm_lm.py")
SMALL = ["--small"]  # the example's CPU sizes (embedding 512, hidden 128): the figures' workload


def load_example():
    spec = importlib.util.spec_from_file_location("lstm_lm", os.path.abspath(EXAMPLE))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    ours, rest = ap.parse_known_args()
    if {"-h", "--help"} & set(rest):   # help without launching mpirun: ours, then the example's
        print(__doc__)
        load_example().parse_args(["--help"])
    ensure_launched(ours.ranks, "zen_hvd.bench.train")

    import zen_hvd
    import horovod.torch as hvd

    lstm_lm = load_example()
    zen_hvd.init()
    share_cores()
    results, step_times = {}, {}
    rounds = max(1, ours.rounds)
    progress = Progress(2 * rounds + 1, active=hvd.rank() == 0)
    for rnd in range(rounds):
        order = ("zen", "horovod") if rnd % 2 == 0 else ("horovod", "zen")
        for sync in order + (("horovod-dense",) if rnd == 0 else ()):
            progress.stage(f"round {rnd + 1} of {rounds}: --sync {sync}")
            # sparse_as_dense moves the whole 100k-row tables: a few steps tell its speed
            few = ["--steps", "5", "--warmup", "1"] if sync == "horovod-dense" else []
            args = lstm_lm.parse_args(SMALL + ["--no-progress"] + rest + few + ["--sync", sync])
            results[sync] = lstm_lm.train(args)
            slowest = max(row[0] for row in gather([results[sync]["step_seconds"]]))
            step_times.setdefault(sync, []).append(slowest)
    args = lstm_lm.parse_args(SMALL + rest)
    for sync, r in results.items():
        r["samples_per_s"] = args.batch * hvd.size() / statistics.median(step_times[sync])
    if hvd.rank() != 0:
        return
    print(f"zen_hvd.bench.train: LSTM LM, {hvd.size()} ranks, {args.steps} timed steps after {args.warmup} "
          f"warm-up steps, {ours.rounds} rounds, batch {args.batch} x "
          f"{args.seq_len} per rank, embedding {args.vocab} x {args.embed} (sparse=True), hidden "
          f"{args.hidden}, sampled softmax with {args.negatives} negatives")
    print("  " + reproduce("zen_hvd.bench.train"))
    print(f"  {'sync':<36}{'samples/s':>10}{'ms/step':>9}{'bytes/step/rank':>18}{'final loss':>14}")
    labels = {"zen": "Zen (zen_hvd.DistributedOptimizer)", "horovod-dense": "Horovod sparse_as_dense (5 steps)",
              "horovod": "Horovod sparse (allgather)"}
    for sync, r in results.items():
        total = r["zen_bytes"] + r["peer_bytes"]
        ms = statistics.median(step_times[sync]) * 1e3
        print(f"  {labels[sync]:<36}{r['samples_per_s']:>10.1f}{ms:>9.1f}{total:>18,.0f}{r['final_loss']:>14.6f}")
    write_csv(ours.out, [dict(sync=labels[sync], samples_per_s=r["samples_per_s"],
                              ms_per_step=statistics.median(step_times[sync]) * 1e3,
                              bytes_per_step_per_rank=r["zen_bytes"] + r["peer_bytes"],
                              final_loss=r["final_loss"]) for sync, r in results.items()])
    z = results["zen"]
    print(f"  Zen: {z['zen_bytes']:,.0f} B counted (sparse syncs, data + control) + "
          f"{z['peer_bytes']:,.0f} B computed (Horovod allreduce of the dense LSTM weights)")
    losses = [results[s]["final_loss"] for s in ("zen", "horovod")]   # the same steps
    same = max(losses) - min(losses) <= 1e-4 * abs(losses[0])
    zen_total = z["zen_bytes"] + z["peer_bytes"]
    fewer = all(zen_total < r["zen_bytes"] + r["peer_bytes"] for s, r in results.items() if s != "zen")
    print(f"  Zen's and Horovod sparse's final losses equal (rel. 1e-4): {same}; Zen moves the fewest "
          f"bytes: {fewer}")
    if not (same and fewer):
        sys.exit(1)


if __name__ == "__main__":
    main()
