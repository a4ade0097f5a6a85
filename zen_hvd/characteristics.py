"""Sparsity characteristics of gradients across ranks (docs/algorithm.md §1 and §3).

    overlap ratio      (Def. 3)  |I1 & I2| / min(|I1|, |I2|), mean over pairs of ranks
    densification      (Def. 4)  gamma_m = d_m / d_G = |I_1 u .. u I_m| / mean |I_i|
    skew ratio         (Def. 5)  s_n = max_i d_{G_i} / d_G over n uniform contiguous parts
    Push imbalance     (Def. 8)  max_{i,j} n |I_i^j| / |I_i|   with Zen's h0 partition
    Pull imbalance     (Def. 8)  max_j n |I'_j| / |I|

From synthetic workloads (workloads.py) or real gradients: GradientRecorder hooks a model's
parameters, records the unit sets of a few steps' sparse gradients on every rank, and
gathers them (allgather, outside any timing) so that rank 0 can characterize them.

    python -m zen_hvd.characteristics [--workload embedding|dgc] [--ranks 8] [--out F.csv]
                                        (one process)
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from . import stats
from .units import sorted_unique


def overlap_ratio(a: np.ndarray, b: np.ndarray) -> float:
    m = min(a.size, b.size)
    return float(np.intersect1d(a, b, assume_unique=True).size / m) if m else 0.0


def mean_overlap(sets) -> float:
    pairs = [(i, j) for i in range(len(sets)) for j in range(i + 1, len(sets))]
    return float(np.mean([overlap_ratio(sets[i], sets[j]) for i, j in pairs])) if pairs else 1.0


def densification(sets, m: int | None = None) -> float:
    """gamma_m over the first m sets (all by default)."""
    m = len(sets) if m is None else m
    k = np.mean([s.size for s in sets[:m]])
    return float(sorted_unique(np.concatenate(sets[:m])).size / k) if k else 1.0


def skew_ratio(units: np.ndarray, M: int, n: int) -> float:
    if units.size == 0:
        return 1.0
    bounds = np.arange(n + 1, dtype=np.int64) * M // n
    per_part = np.diff(np.searchsorted(units, bounds)) / np.maximum(np.diff(bounds), 1)
    return float(per_part.max() / (units.size / M))


def imbalance(sets, M: int, seed: int = 12345) -> tuple:
    """(Push, Pull) imbalance ratios of Zen's h0 partition over len(sets) servers."""
    from .cuda_kernels import h0, hierarchical_hashing

    n, keys = len(sets), h0.derive_keys(seed)
    push = np.stack([hierarchical_hashing.group_by_partition_cpu(s, M, n, keys)[1] for s in sets])
    union = sorted_unique(np.concatenate(sets))
    pull = hierarchical_hashing.group_by_partition_cpu(union, M, n, keys)[1]
    return stats.push_imbalance(push.astype(np.int64)), stats.pull_imbalance(pull.astype(np.int64))


def block_sets(sets, D: int):
    from .baselines import block_units

    B = block_units(D)
    return [sorted_unique(s // B) for s in sets], B


def characterize(sets, M: int, D: int = 1) -> dict:
    """Everything above for the ranks' unit sets (sorted unique int64 arrays)."""
    n = len(sets)
    k = float(np.mean([s.size for s in sets]))
    union = sorted_unique(np.concatenate(sets))
    p = 1 << (n.bit_length() - 1)
    push, pull = imbalance(sets, M)
    return dict(n=n, M=M, D=D, k=k, d_G=k / M, overlap=mean_overlap(sets),
                gamma_n=densification(sets),
                stage_gammas=[densification(sets, (1 << i) * n // p) for i in range(p.bit_length() - 1)],
                skew_worker=float(np.mean([skew_ratio(s, M, n) for s in sets])),
                skew_union=skew_ratio(union, M, n), push_imbalance=push, pull_imbalance=pull,
                union=int(union.size))


def block_stats(sets, M: int, D: int, n: int | None = None) -> dict:
    """OmniReduce's view: non-zero blocks per worker, in the union, and their skew at n parts."""
    bsets, B = block_sets(sets, D)
    nb = -(-M // B)
    n = n or len(sets)
    ub = sorted_unique(np.concatenate(bsets))
    return dict(B=B, k=float(np.mean([b.size for b in bsets])), union=float(ub.size),
                s_w=float(np.mean([skew_ratio(b, nb, n) for b in bsets])), s_u=skew_ratio(ub, nb, n))


class GradientRecorder:
    """Records the unit sets of a model's sparse (or dense, by non-zero rows) gradients for the
    first `steps` backward passes; gathered() returns {param name: [rank 0 set, rank 1 set, ...]}
    per step (an allgather; call it on every rank)."""

    def __init__(self, model: torch.nn.Module, steps: int = 3):
        from .units import layout_of, to_units

        self.sets: dict = {}
        self.shapes: dict = {}
        self.steps = steps
        self.handles = []
        for pname, param in model.named_parameters():
            def hook(grad, pname=pname):
                rec = self.sets.setdefault(pname, [])
                if len(rec) < self.steps:
                    layout = layout_of(grad)
                    self.shapes[pname] = (layout.num_units, layout.unit_size)
                    rec.append(to_units(grad.detach().cpu(), layout)[0])
                return grad
            self.handles.append(param.register_hook(hook))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def gathered(self, transport=None) -> dict:
        from . import runtime

        tr = transport or runtime.get_transport()
        out = {}
        for pname in sorted(self.sets):
            per_step = []
            for units in self.sets[pname]:
                buf = torch.from_numpy(units.astype(np.int64).view(np.uint8))
                recv, counts = tr.allgatherv(buf)
                raw = recv.numpy().view(np.int64)
                per_step.append(np.split(raw, np.cumsum(np.asarray(counts) // 8)[:-1]))
            out[pname] = per_step
        return out

    def characteristics(self, transport=None) -> dict:
        """{param name: characterize() of each recorded step}."""
        return {pname: [characterize(sets, self.shapes[pname][0], self.shapes[pname][1]) for sets in steps]
                for pname, steps in self.gathered(transport).items()}


# The two workload kinds of the paper's evaluation, shrunk to this machine.
WORKLOADS = {
    "embedding": dict(M=200_000, D=32, density=0.01, overlap=0.3, skew=1.1),  # Zipf rows
    "dgc": dict(M=4_000_000, D=1, density=0.05, overlap=0.1, skew=0.2),       # top-5% elements
}


def workload_sets(kind: str, n: int, seed: int = 0, **override):
    from . import workloads

    w = dict(WORKLOADS[kind], **override)
    return workloads.rank_units(w["M"], n, w["density"], w["overlap"], w["skew"], seed), w


# The table's columns and what each says, printed under the table.
COLUMNS = {
    "n": "number of workers (ranks)",
    "d_G": "mean density of one worker's gradient: mean |I_i| / M",
    "overlap": "overlap ratio (Def. 3): |I_i & I_j| / min(|I_i|, |I_j|), mean over pairs; 1 = same units",
    "gamma_n": "densification (Def. 4): |I_1 u .. u I_n| / mean |I_i|; from 1 (same units) to n (disjoint)",
    "stage_gammas": "gamma_m at m = n/p, 2n/p, .., n/2 (the hierarchical scheme's stages, p a power of 2)",
    "skew_worker": "skew ratio (Def. 5) of one worker's units over n contiguous parts, mean over workers; "
                   "1 = even",
    "skew_union": "skew ratio of the union of all units over n contiguous parts",
    "push_imbalance": "Push imbalance (Def. 8) of Zen's hash partition: max_ij n |I_i^j| / |I_i|; goal <= 1.1",
    "pull_imbalance": "Pull imbalance (Def. 8): max_j n |I'_j| / |I|; goal <= 1.1",
}


def format_table(rows: list) -> str:
    cols = list(COLUMNS)
    fmt = lambda v: ("[" + ", ".join(f"{x:.3g}" for x in v) + "]") if isinstance(v, list) else f"{v:.4g}"  # noqa: E731
    lines = ["  ".join(f"{c:>14}" for c in ["workload"] + cols)]
    for name, ch in rows:
        lines.append("  ".join(f"{x:>14}" for x in [name] + [fmt(ch[c]) for c in cols]))
    lines.append("columns:")
    lines += [f"  {c:<15}{text}" for c, text in COLUMNS.items()]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="embedding,dgc", help="comma list of " + ", ".join(WORKLOADS))
    ap.add_argument("--ranks", default="2,4,8", help="comma list of worker counts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="CSV file of the table (one row per workload and n)")
    args = ap.parse_args()
    print(f"zen_hvd.characteristics: synthetic workloads ({', '.join(f'{k}: {v}' for k, v in WORKLOADS.items())})")
    print(f"  reproduce: python -m zen_hvd.characteristics --workload {args.workload} --ranks {args.ranks} "
          f"--seed {args.seed}")
    rows = []
    for kind in args.workload.split(","):
        for n in map(int, args.ranks.split(",")):
            sets, w = workload_sets(kind, n, args.seed)
            rows.append((kind, characterize(sets, w["M"], w["D"])))
    print(format_table(rows))
    if args.out:
        from .stats import write_csv

        write_csv(args.out, [dict(workload=name, **{c: ch[c] for c in COLUMNS}) for name, ch in rows])


if __name__ == "__main__":
    main()
