"""Memory follows nnz, not the table: a sync of a 3e9-row table with a thousand non-zeros per
rank costs megabytes on every scheme that sends sparse sets (peak RSS from getrusage), and its
result equals the allgather baseline's. The peak is reset before each sync (/proc/self/clear_refs),
so the growth of one sync shows even below the peak of the imports.

    mpirun -np 3 python tests/mpi/memory_cases.py
"""
import warnings

import numpy as np
import torch

import zen_hvd
from zen_hvd.bench.memory import peak_mb, reset_peak

warnings.filterwarnings("ignore", message="Sparse invariant checks")
zen_hvd.init()
me, n = zen_hvd.rank(), zen_hvd.size()
M, NNZ, LIMIT_MB = 3_000_000_000, 1000, 64


rng = np.random.default_rng(me)
idx = np.unique(rng.integers(0, M, NNZ))
big = torch.sparse_coo_tensor(torch.from_numpy(idx).reshape(1, -1), torch.ones(idx.size, 1), (M, 1))
small = torch.sparse_coo_tensor(torch.tensor([[1, 5]]), torch.ones(2, 1), (1000, 1))
reference = zen_hvd.sparse_allreduce(big, name="memory.reference", scheme="agsparse", op=zen_hvd.Sum)
for scheme in ("balanced", "hierarchical", "auto", "sparse_ps"):
    zen_hvd.sparse_allreduce(small, name=f"memory.warm.{scheme}", scheme=scheme)  # compile, first use
    before = reset_peak()
    out = zen_hvd.sparse_allreduce(big, name=f"memory.{scheme}", scheme=scheme, op=zen_hvd.Sum)
    grown_mb = peak_mb() - before
    assert grown_mb < LIMIT_MB, f"{scheme}: peak memory grew {grown_mb:.0f} MB for {NNZ} non-zeros"
    assert torch.equal(out.indices(), reference.indices()) and torch.equal(out.values(), reference.values()), scheme
    print(f"rank {me}: {scheme}: +{grown_mb:.1f} MB peak for a {M:.0e}-row table", flush=True)
if me == 0:
    print("memory_cases: all cases passed")
