"""Ranks that disagree on how they group into hosts: rank 1 alone says two ranks to a host.

    mpirun -np 3 python tests/mpi/grouping_case.py

Every rank must raise the same error when the transport is built, and print it.
"""
import os

import torch

import zen_hvd

zen_hvd.init()
me = zen_hvd.rank()
if me == 1:
    os.environ["ZEN_HVD_RANKS_PER_HOST"] = "2"
grad = torch.sparse_coo_tensor(torch.tensor([[me, 5]]), torch.ones(2, 3), (10, 3))
try:
    zen_hvd.sparse_allreduce(grad, name="grouping", transport="mpi4py")
    print(f"rank {me}: the sync returned", flush=True)
except ValueError as e:
    print(f"rank {me} raised: {e}", flush=True)
