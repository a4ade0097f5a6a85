"""Memory follows nnz, not the table: peak memory per rank of one sync against its non-zeros.

    python -m zen_hvd.bench.memory [--ranks 3] [--tables 5e7,3e9] [--nnz 1000,50000] [--out F.csv]

Starts itself under mpirun with --ranks ranks when launched plainly. For each table of M rows
(D = 1 column, float32) and each number of non-zeros per rank (distinct random rows), it syncs
once with every sparse scheme and prints the growth of each rank's peak resident memory during
that sync (VmHWM, reset before the sync through /proc/self/clear_refs; the least and the most
over the ranks), next to the input's own size (nnz x (8 B index + 4 B value)). The result of
every scheme is checked against the allgather baseline's.
"""
from __future__ import annotations

import argparse
import warnings

import numpy as np
import torch

from .common import ensure_launched, gather, reproduce, write_csv

SCHEMES = ("balanced", "hierarchical", "auto", "agsparse", "sparse_ps", "sparcml", "omnireduce")


def peak_mb() -> float:
    """This process's peak resident memory since the last reset (VmHWM), in MB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def reset_peak() -> float:
    """Reset the peak to the current resident memory (Linux clear_refs 5) and return it."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return peak_mb()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--tables", type=lambda x: [int(float(v)) for v in x.split(",")], default=[50_000_000, 3_000_000_000])
    ap.add_argument("--nnz", type=lambda x: [int(float(v)) for v in x.split(",")], default=[1000, 50_000])
    ap.add_argument("--schemes", type=lambda x: x.split(","), default=list(SCHEMES))
    ap.add_argument("--out", default=None, help="CSV file of the rows printed")
    args = ap.parse_args()
    ensure_launched(args.ranks, "zen_hvd.bench.memory")

    import zen_hvd

    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    zen_hvd.init()
    me, n = zen_hvd.rank(), zen_hvd.size()
    small = torch.sparse_coo_tensor(torch.tensor([[1, 5]]), torch.ones(2, 1), (1000, 1))
    for scheme in args.schemes:  # compile and first use outside the measured syncs
        zen_hvd.sparse_allreduce(small, name=f"bench.memory.warm.{scheme}", scheme=scheme)

    rows = []
    for M in args.tables:
        for nnz in args.nnz:
            rng = np.random.default_rng([me, M, nnz])
            idx = np.unique(rng.integers(0, M, nnz))
            grad = torch.sparse_coo_tensor(torch.from_numpy(idx).reshape(1, -1), torch.ones(idx.size, 1), (M, 1))
            reference = zen_hvd.sparse_allreduce(grad, name="bench.memory.reference", scheme="agsparse", op=zen_hvd.Sum)
            for scheme in args.schemes:
                before = reset_peak()
                out = zen_hvd.sparse_allreduce(grad, name=f"bench.memory.{scheme}", scheme=scheme, op=zen_hvd.Sum)
                grown = peak_mb() - before
                exact = torch.equal(out.indices(), reference.indices()) and torch.equal(out.values(), reference.values())
                del out
                each = gather([grown, exact])
                per_rank, exact_all = [g for g, _ in each], all(e for _, e in each)
                rows.append(dict(rows_M=M, nnz_per_rank=nnz, input_mb=round(nnz * 12 / 2 ** 20, 3), scheme=scheme,
                                 peak_growth_mb_min=round(min(per_rank), 1),
                                 peak_growth_mb_max=round(max(per_rank), 1), exact=exact_all))
            del grad, reference
    if me:
        return
    print(f"Peak memory of one sync against nnz ({n} ranks, D = 1, float32)")
    print(reproduce("zen_hvd.bench.memory"))
    print(f"{'M rows':>8} {'nnz/rank':>9} {'input':>9} {'scheme':<13} {'peak growth per rank (MB)':>26}  exact")
    for r in rows:
        growth = f"{r['peak_growth_mb_min']:.1f} .. {r['peak_growth_mb_max']:.1f}"
        print(f"{r['rows_M']:>8.0e} {r['nnz_per_rank']:>9} {r['input_mb']:>6.2f} MB {r['scheme']:<13} "
              f"{growth:>26}  {'yes' if r['exact'] else 'NO'}")
    write_csv(args.out, rows)
    if not all(r["exact"] for r in rows):
        raise SystemExit("memory: a scheme's result differs from the allgather baseline's")


if __name__ == "__main__":
    main()
