"""Training benchmark: the LSTM language model of examples/lstm_lm.py, synchronized three ways.

    python -m zen_hvd.bench.train [--ranks 4] [--steps 20] [--batch 16] [--seq-len 20] [--hidden 128]

Starts itself under mpirun with --ranks ranks when launched plainly, then trains the same model
from the same seeds with Zen (zen_hvd.DistributedOptimizer), Horovod's allreduce with
sparse_as_dense=True, and Horovod's default sparse path (allgather), and prints samples/s,
bytes received per step per rank (Zen's counted by its transports, Horovod's computed from
tensor sizes, as the example explains) and the final loss of each. The losses must agree (the
three compute the same averaged gradients up to float rounding) and Zen must move fewer bytes.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys

from .common import ensure_launched, share_cores

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "lstm_lm.py")


def load_example():
    spec = importlib.util.spec_from_file_location("lstm_lm", os.path.abspath(EXAMPLE))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--ranks", type=int, default=4)
    ours, rest = ap.parse_known_args()
    ensure_launched(ours.ranks, "zen_hvd.bench.train")

    import zen_hvd
    import horovod.torch as hvd

    lstm_lm = load_example()
    zen_hvd.init()
    share_cores()
    results = {}
    for sync in ("zen", "horovod-dense", "horovod"):
        args = lstm_lm.parse_args(rest + ["--sync", sync])
        results[sync] = lstm_lm.train(args)
    if hvd.rank() != 0:
        return
    print(f"zen_hvd.bench.train: LSTM LM, {hvd.size()} ranks, {args.steps} steps, batch {args.batch} x "
          f"{args.seq_len} per rank, embedding {args.vocab} x {args.embed} (sparse=True), hidden "
          f"{args.hidden}, sampled softmax with {args.negatives} negatives")
    print(f"  reproduce: python -m zen_hvd.bench.train {shlex.join(sys.argv[1:])}".rstrip())
    print(f"  {'sync':<32}{'samples/s':>10}{'bytes/step/rank':>18}{'final loss':>14}")
    labels = {"zen": "Zen (zen_hvd.DistributedOptimizer)", "horovod-dense": "Horovod sparse_as_dense",
              "horovod": "Horovod sparse (allgather)"}
    for sync, r in results.items():
        total = r["zen_bytes"] + r["horovod_bytes"]
        print(f"  {labels[sync]:<32}{r['samples_per_s']:>10.1f}{total:>18,.0f}{r['final_loss']:>14.6f}")
    z = results["zen"]
    print(f"  Zen: {z['zen_bytes']:,.0f} B counted (sparse syncs, data + control) + "
          f"{z['horovod_bytes']:,.0f} B computed (Horovod allreduce of the dense LSTM weights)")
    losses = [r["final_loss"] for r in results.values()]
    same = max(losses) - min(losses) <= 1e-4 * abs(losses[0])
    zen_total = z["zen_bytes"] + z["horovod_bytes"]
    fewer = all(zen_total < r["zen_bytes"] + r["horovod_bytes"] for s, r in results.items() if s != "zen")
    print(f"  final losses equal (rel. 1e-4): {same}; Zen moves the fewest bytes: {fewer}")
    if not (same and fewer):
        sys.exit(1)


if __name__ == "__main__":
    main()
