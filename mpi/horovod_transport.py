"""Transport over Horovod's collectives: hvd.alltoall with splits (Push), hvd.allgather (Pull).

Works under `horovodrun --gloo` (no MPI job) as well as under mpirun, and with any process set.
"""
from __future__ import annotations

import numpy as np
import torch

from .transport import Transport


class HorovodTransport(Transport):
    name = "horovod"

    def __init__(self, process_set=None):
        import horovod.torch as hvd

        self._hvd = hvd
        self._ps = process_set if process_set is not None else hvd.global_process_set
        super().__init__(self._ps.rank(), self._ps.size())

    def _alltoallv(self, send, send_counts, recv_counts):
        splits = torch.tensor(send_counts, dtype=torch.int32)
        out, received = self._hvd.alltoall(send, splits=splits, process_set=self._ps)
        if received.tolist() != recv_counts:
            raise RuntimeError(f"alltoall received splits {received.tolist()}, expected {recv_counts}")
        return out

    def _allgatherv(self, send, recv_counts):
        return self._hvd.allgather(send, process_set=self._ps)

    def _allgather_int64(self, row):
        t = torch.from_numpy(row).reshape(1, -1)
        return self._hvd.allgather(t, process_set=self._ps).numpy()

    def _allreduce_sum(self, tensor):
        return self._hvd.allreduce(tensor, op=self._hvd.Sum, process_set=self._ps)
