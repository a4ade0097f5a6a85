"""Balanced parallelism with the GPU partitioner (hierarchical hashing, Algorithm 1) inside real
multi-rank syncs. Run with NUMBA_ENABLE_CUDASIM=1 ZEN_HVD_PARTITIONER=gpu under mpirun: the
kernel runs in Numba's CUDA simulator, so sizes stay small."""
import numpy as np
import torch

import zen_hvd
from zen_hvd import workloads

zen_hvd.init()
import horovod.torch as hvd  # noqa: E402

n, me = hvd.size(), hvd.rank()
for case, (M, D, density, overlap) in enumerate([(400, 4, 0.2, 0.5), (2000, 1, 0.05, 0.0), (50, 3, 1.0, 1.0)]):
    all_units = workloads.rank_units(M, n, density, overlap, 1.0, case)
    inputs = [torch.sparse_coo_tensor(torch.from_numpy(u).reshape(1, -1),
                                      torch.from_numpy(workloads.rank_values(u, D, r, case)), (M, D),
                                      check_invariants=True) for r, u in enumerate(all_units)]
    out = zen_hvd.sparse_allreduce(inputs[me], name=f"gpu_partition_{case}", op=zen_hvd.Sum)
    ref = sum(t.to_dense().double() for t in inputs)
    assert torch.allclose(out.to_dense().double(), ref, atol=1e-5), f"case {case}: wrong sum"
    union = np.unique(np.concatenate(all_units))
    assert np.array_equal(out.indices()[0].numpy(), union), f"case {case}: units lost or duplicated"
if me == 0:
    print("gpu_partition_cases: all cases passed")
