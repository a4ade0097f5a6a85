"""Soak: many random syncs on real ranks, each checked against a float64 reference.

    python -m zen_hvd.soak [--cases 10000] [--ranks 1,2,3,4,5,8] [--transports mpi4py,horovod,torch]
                           [--seed 0]

Splits --cases over every (ranks, transport) pair and runs each share under mpirun (the torch
transport from 2 ranks up). A case draws, the same on every rank from the seed: a scheme
(every concrete scheme and auto), M (1 to 20,000 units, log-uniform), D (1, 2, 5 or 16), a
density, overlap and skew, a dtype (float32, float64, float16), the op (Sum or Average) and
whether the input is sparse (uncoalesced half the time) or dense. Every rank builds every
rank's input (zen_hvd.workloads), syncs its own, and compares the result with the float64 sum
of all inputs (tolerance by dtype), and checks that the result is bitwise the same on every
rank. Prints per share and in total how many cases ran and how many differed (an exception
counts as a difference); exits non-zero if any differed.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys

DTYPES = ("float32", "float64", "float16")
TOLERANCE = {"float32": 1e-4, "float64": 1e-10, "float16": 2e-2}


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--ranks", default="1,2,3,4,5,8")
    ap.add_argument("--transports", default="mpi4py,horovod,torch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--transport", default="mpi4py", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def draw_case(rng, schemes):
    """One case's parameters (rng is seeded alike on every rank)."""
    return dict(scheme=str(rng.choice(schemes)), M=int(round(10 ** rng.uniform(0, 4.3))),
                D=int(rng.choice([1, 2, 5, 16])), density=float(rng.choice([0.0, 1.0, rng.uniform(0, 0.5)])),
                overlap=float(rng.uniform(0, 1)), skew=float(rng.choice([0.0, 0.5, 1.0, 1.5])),
                dtype=str(rng.choice(DTYPES)), average=bool(rng.integers(2)),
                layout=str(rng.choice(["sparse", "uncoalesced", "dense"])),
                seed=int(rng.integers(2 ** 31)))


def inputs_of(case, n):
    """Every rank's input tensor for a case."""
    import numpy as np
    import torch

    from zen_hvd import workloads

    M, D = case["M"], case["D"]
    units = workloads.rank_units(M, n, case["density"], case["overlap"], case["skew"], case["seed"])
    out = []
    for r, u in enumerate(units):
        v = torch.from_numpy(workloads.rank_values(u, D, r, case["seed"], np.float32)).to(getattr(torch, case["dtype"]))
        idx = torch.from_numpy(u).reshape(1, -1)
        if case["layout"] == "uncoalesced" and u.size:   # every unit twice, halves of its value
            idx, v = torch.cat([idx, idx], dim=1), torch.cat([v / 2, v / 2])
        t = torch.sparse_coo_tensor(idx, v, (M, D), check_invariants=False)
        out.append(t.to_dense() if case["layout"] == "dense" else t)
    return out


def child(args):
    import numpy as np
    import torch

    import zen_hvd
    from zen_hvd import runtime

    zen_hvd.init()
    n, me = zen_hvd.size(), zen_hvd.rank()
    tr = runtime.get_transport(args.transport)
    rng = np.random.default_rng([args.seed, n, sum(map(ord, args.transport))])
    schemes = sorted(zen_hvd.SCHEMES) + ["auto"]
    ran = differed = 0
    for i in range(args.cases):
        case = draw_case(rng, schemes)
        inputs = inputs_of(case, n)
        op = zen_hvd.Average if case["average"] else zen_hvd.Sum
        ok, why = True, ""
        try:
            out = zen_hvd.sparse_allreduce(inputs[me], name=f"soak.{i}", op=op, scheme=case["scheme"],
                                           transport=args.transport)
            ref = sum((t.to_dense() if t.is_sparse else t).double() for t in inputs) / (n if case["average"] else 1)
            got = out.to_dense().double() if out.is_sparse else out.double()
            tol = TOLERANCE[case["dtype"]] * max(1.0, float(ref.abs().max()) if ref.numel() else 1.0)
            ok = out.shape == inputs[me].shape and out.dtype == inputs[me].dtype and \
                bool(torch.allclose(got, ref, rtol=TOLERANCE[case["dtype"]], atol=tol))
            why = "" if ok else f"max error {float((got - ref).abs().max()) if ref.numel() else 0:.3g}"
            flat = (out.coalesce().values() if out.is_sparse else out).contiguous().view(-1)
            digest = int.from_bytes(hashlib.blake2b(flat.view(torch.uint8).numpy().tobytes(),
                                                    digest_size=7).digest(), "little")
            same = tr.allgather_int64([digest, out._nnz() if out.is_sparse else 0])
            if not (same == same[0]).all():
                ok, why = False, "results differ across ranks"
        except Exception as e:  # noqa: BLE001  (counted and reported, then the next case)
            ok, why = False, f"{type(e).__name__}: {e}"
        ran += 1
        if not ok:
            differed += 1
            print(f"soak: rank {me}: case {i} {case}: {why}", flush=True)
    table = tr.allgather_int64([differed])
    if me == 0:
        print(f"soak: {n} ranks, {args.transport} transport: ran {ran} cases, "
              f"{int((table[:, 0] > 0).sum())} ranks saw differences, {int(table[:, 0].max())} "
              f"cases differed", flush=True)
    sys.exit(1 if table[:, 0].any() else 0)


def main():
    args = parse()
    if args.child:
        return child(args)
    from .launch import mpirun_command

    pairs = [(int(r), t) for r in args.ranks.split(",") for t in args.transports.split(",")
             if not (t == "torch" and int(r) < 2)]
    share = max(1, -(-args.cases // len(pairs)))   # at least --cases in all
    failed, lines = 0, []
    for r, t in pairs:
        cmd = mpirun_command(r) + [sys.executable, "-m", "zen_hvd.soak", "--child", "--cases",
                                   str(share), "--transport", t, "--seed", str(args.seed)]
        print(f"soak: {r} ranks, {t} transport, {share} cases ...", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        summary = [ln for ln in proc.stdout.splitlines() if ln.startswith("soak:")]
        print("\n".join(summary[-20:]) or proc.stderr[-3000:], flush=True)
        failed += proc.returncode != 0
        lines.append(f"  {r} ranks, {t}: exit {proc.returncode}")
    print(f"soak: {share * len(pairs)} cases over {len(pairs)} (ranks, transport) pairs; "
          f"{failed} pairs had differences or errors")
    print("\n".join(lines))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
