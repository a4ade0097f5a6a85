"""The paper's settings by projection: the four examples' real gradients, scaled to the paper's
models, on 16 to 128 GPUs (8 to a host) at 25 and 100 Gbit/s.

    python -m zen_hvd.bench.paper [--ranks 16] [--out bench_out]

1. Measured: each example (--small sizes, examples/) runs --ranks ranks' first batch through its
   model in this process, one backward pass per rank, and records the gradient's unit sets:
   the largest sparse embedding's rows (lstm_lm, deepfm, nmt), and for gpt DGC's top 5% of
   every dense parameter's elements (one flat tensor, as the paper's LLM buckets).
   zen_hvd.characteristics gives d_G = k / M and gamma_m for m up to --ranks.
2. Scaled to the paper's models (PAPER below): the same density d_G and the same effective
   universe as a fraction of M (costmodel.fit_universe), so gamma_m keeps its shape, at the
   paper's M and D; gamma_m beyond --ranks from that universe.
3. Projected: per sync of that tensor, the bytes on a host's network link and the time at the
   link rate (50 us a message step; NVLink inside the host, 1200 Gbit/s; the GPU kernels'
   hashing at 0.05 ns a unit, 20 G units/s, bound by a V100's memory bandwidth), for
     Zen        the cheaper of flat (ring Pull) and two-level (costmodel.two_level_bytes), as
                auto chooses
     AllReduce  NCCL's ring between hosts after a reduce inside: 2 (H-1)/H M v
     AGsparse   Horovod's allgather (hierarchical): each host gets (n-L) k (8 + v)
     SparCML    recursive doubling: the log2 H stages between hosts carry L ranks' sets each
     OmniReduce 256-row blocks to servers: L (n-L)/(n-1) of its flat bytes (costmodel)
   and Zen's speedup over each, beside the paper's reported communication speedups.
"""
from __future__ import annotations

import argparse
import importlib
import math
import os
import sys

# paper model, M (rows or elements), D, the paper's communication speedups of Zen over
# AllReduce on 16 machines x 8 V100 at 25 Gbit/s (its Section 5), None where it gives none
PAPER = {
    "lstm_lm": ("LSTM, One Billion Word (vocab 793,471 x 1000)", 793_471, 1000, 6.77),
    "deepfm": ("DeepFM, Criteo (33.8M rows x 16)", 33_762_577, 16, 2.10),
    "nmt": ("NMT, IWSLT14 De-En (vocab 10,000 x 512)", 10_000, 512, None),
    "gpt": ("OPT-2.7B with DGC 5% (2.7e9 elements)", 2_700_000_000, 1, 3.44),
}
PER_HOST = 8
NVLINK_BPS = 1200e9
HASH_S = 0.05e-9
STEP_S = 50e-6
INDEX = 4


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--gpus", default="16,32,64,128")
    ap.add_argument("--rates", default="25,100", help="Gbit/s between hosts")
    ap.add_argument("--out", default="bench_out")
    return ap.parse_args()


def example_sets(name, ranks):
    """(sets, M, D) of the example's gradient over `ranks` ranks' first batches."""
    import numpy as np
    import torch

    here = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
    sys.path.insert(0, os.path.abspath(here))
    mod = importlib.import_module(name)
    args = mod.parse_args(["--small"])
    torch.manual_seed(args.seed)
    if name == "lstm_lm":
        model, stream = mod.LSTMLM(args.vocab, args.embed, args.hidden), mod.token_stream
    elif name == "nmt":
        model, stream = mod.Seq2Seq(args.vocab, args.embed, args.hidden), mod.pair_stream
    elif name == "deepfm":
        model = mod.DeepFM(args.rows, args.dim, [int(u) for u in args.mlp.split(",") if u])
        stream = mod.synthetic_batches
    else:
        model = mod.GPT(args.vocab, args.width, args.layers, args.heads, args.seq_len)
        stream = mod.token_stream
    from zen_hvd.units import layout_of, to_units

    sets = []
    for r in range(ranks):
        model.zero_grad(set_to_none=True)
        model.loss(*next(iter(stream(args, r)))).backward()
        if name == "gpt":   # DGC: the top 5% of every dense parameter's elements, one flat tensor
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None
                              and not p.grad.is_sparse])
            top = torch.topk(flat.abs(), max(1, int(0.05 * flat.numel()))).indices
            sets.append(np.sort(top.numpy()))
            M, D = flat.numel(), 1
        else:               # the largest sparse embedding's rows
            pname, grad = max(((n, p.grad) for n, p in model.named_parameters()
                               if p.grad is not None and p.grad.is_sparse), key=lambda x: x[1].shape[0])
            layout = layout_of(grad)
            sets.append(np.asarray(to_units(grad.coalesce(), layout)[0]))
            M, D = layout.num_units, layout.unit_size
    sys.path.pop(0)
    return sets, M, D


def project(n, H, M, D, k, gamma, rate_bps) -> dict:
    """Seconds per sync of every method on n GPUs in H hosts (PER_HOST each)."""
    from zen_hvd import costmodel

    L, v = PER_HOST, 4 * D
    union, host_union = gamma(n) * k, gamma(L) * k
    lvl = costmodel.two_level_bytes(H, L, M, k, union, host_union, v, ring=True)
    hashing = (k + union + (host_union + union) / L) * HASH_S
    zen = min(lvl["flat"]["off_host"] * 8 / rate_bps + lvl["flat"]["inside"] * 8 / NVLINK_BPS + 2 * STEP_S,
              lvl["two-level"]["off_host"] * 8 / rate_bps + lvl["two-level"]["inside"] * 8 / NVLINK_BPS
              + 5 * STEP_S) + hashing
    allreduce = 2 * (H - 1) / H * M * v * 8 / rate_bps + 2 * (H - 1) * STEP_S
    agsparse = (n - L) * k * (8 + v) * 8 / rate_bps + (H - 1) * STEP_S
    cross = [gamma(2 ** i) * k for i in range(int(math.log2(L)), int(math.log2(n)))]   # sets entering the stages between hosts
    sparcml = L * sum(min(s * (INDEX + v), M * v) for s in cross) * 8 / rate_bps + len(cross) * STEP_S
    omni = costmodel.predict_bytes(n, M, k / M, gamma, v, ["omnireduce"])["omnireduce"]
    omnireduce = L * (n - L) / (n - 1) * omni * 8 / rate_bps + 2 * STEP_S
    return {"Zen": zen, "AllReduce": allreduce, "AGsparse": agsparse, "SparCML": sparcml, "OmniReduce": omnireduce}


def main():
    args = parse()
    import numpy as np

    from zen_hvd import characteristics, costmodel

    from .common import reproduce, write_csv

    gpus = [int(g) for g in args.gpus.split(",")]
    rates = [float(r) for r in args.rates.split(",")]
    print(f"zen_hvd.bench.paper: the four examples' gradients over {args.ranks} ranks, scaled to the paper's "
          f"models; PROJECTED to {gpus} GPUs ({PER_HOST} to a host) at {rates} Gbit/s (a model, not a measurement)")
    print("  " + reproduce("zen_hvd.bench.paper"))
    rows = []
    for name, (model, M_p, D_p, reported) in PAPER.items():
        sets, M, D = example_sets(name, args.ranks)
        ch = characteristics.characterize(sets, M, D)
        k = float(np.mean([s.size for s in sets]))
        d_G = k / M
        U = costmodel.fit_universe(k, ch["gamma_n"] * k, args.ranks)
        k_p = d_G * M_p
        U_p = U / M * M_p if math.isfinite(U) else math.inf
        gamma = (lambda m, k_p=k_p, U_p=U_p: m if math.isinf(U_p) else U_p * (1 - (1 - k_p / U_p) ** m) / k_p)
        print(f"\n  {name} -> {model}")
        print(f"    measured at {args.ranks} ranks ({M:,} x {D}): d_G {d_G:.4g}, overlap {ch['overlap']:.2f}, "
              f"gamma_{args.ranks} {ch['gamma_n']:.2f}; scaled: k {k_p:,.0f} of {M_p:,}, gamma_8 {gamma(8):.2f}, "
              f"gamma_128 {gamma(128):.1f}")
        for rate in rates:
            for n in gpus:
                t = project(n, max(1, n // PER_HOST), M_p, D_p, k_p, gamma, rate * 1e9)
                z = t["Zen"]
                speed = {m: t[m] / z for m in t if m != "Zen"}
                line = "  ".join(f"{m} {speed[m]:.2f}x" for m in speed)
                paper = (f"   (paper, 16 x 8 at 25 Gbit/s: {reported:.2f}x over AllReduce)"
                         if reported and n == 128 and rate == 25 else "")
                print(f"    {n:>4} GPUs {rate:>5g} Gbit/s: Zen {z * 1e3:8.2f} ms; Zen's speedup over {line}{paper}")
                rows.append(dict(example=name, paper_model=model, gpus=n, gbps=rate, zen_ms=z * 1e3,
                                 **{f"{m}_ms": t[m] * 1e3 for m in speed},
                                 **{f"speedup_vs_{m}": s for m, s in speed.items()},
                                 reported_vs_allreduce=reported if n == 128 and rate == 25 else ""))
    write_csv(os.path.join(args.out, "paper_projection.csv"), rows)


if __name__ == "__main__":
    main()
