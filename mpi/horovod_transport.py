"""Transport over Horovod's collectives: hvd.alltoall with splits (Push), hvd.allgather (Pull).

Horovod has no point-to-point operations; its alltoall returns the received splits, so Push and
Pull are one alltoall each (Pull sends the same bytes to every rank) and no round is spent on
sizes.

Works under `horovodrun --gloo` (no MPI job) as well as under mpirun, and with any process set.
The device data path's CUDA buffers go to Horovod's GPU operations as they are (NCCL, or
CUDA-aware MPI) when Horovod is built with CUDA; otherwise they are staged through host memory.
"""
from __future__ import annotations

import torch

from .transport import Transport, as_tensor, joined, split


class HorovodTransport(Transport):
    name = "horovod"

    def __init__(self, process_set=None):
        import horovod.torch as hvd

        self._hvd = hvd
        self._ps = process_set if process_set is not None else hvd.global_process_set
        super().__init__(self._ps.rank(), self._ps.size())
        self._ops = 0
        self._cuda = bool(hvd.cuda_built())

    def _name(self) -> str:
        """Horovod matches collectives across ranks by name; unnamed ones get a per-process
        counter shared with every other unnamed Horovod op, which differs across ranks when
        zen_hvd syncs from a worker thread while backward enqueues allreduces. Our calls come
        in the same order on every rank, so a counter of our own names them consistently."""
        self._ops += 1
        return f"zen_hvd.{self._ps.process_set_id}.{self._ops % 4096}"

    def _alltoallv(self, send, send_counts, recv_counts):
        splits = torch.tensor(send_counts, dtype=torch.int32)
        out, received = self._hvd.alltoall(send, splits=splits, name=self._name(),
                                            process_set=self._ps)
        if received.tolist() != recv_counts:
            raise RuntimeError(f"alltoall received splits {received.tolist()}, expected {recv_counts}")
        return out

    def _push(self, send, send_counts):
        splits = torch.tensor(send_counts, dtype=torch.int32)
        out, received = self._hvd.alltoall(as_tensor(send), splits=splits, name=self._name(),
                                            process_set=self._ps)
        return split(out.numpy(), received.tolist())

    def _pull(self, send):
        return self._push_all(send)

    # -- device buffers: the same alltoalls on tensors where they live ---------------------
    def moves_cuda(self, device):
        return self._cuda

    def _push_device(self, send, send_counts):
        out, received = self._hvd.alltoall(send, splits=torch.tensor(send_counts, dtype=torch.int32),
                                            name=self._name(), process_set=self._ps)
        return split(out, received.tolist())

    def _swap_device(self, send, peer, receive, device):
        counts = [0] * self.size   # a collective: the ranks sitting the step out take part
        if peer is not None and send is not None:
            counts[peer] = send.numel()
        parts = self._push_device(send if send is not None else torch.zeros(0, dtype=torch.uint8, device=device),
                                  counts)
        return parts[peer] if receive and peer is not None else None

    def _pull_joined_device(self, send, body_nbytes):
        parts = self._push_device(send.repeat(self.size), [send.numel()] * self.size)
        return joined(parts, body_nbytes), [p.numel() for p in parts]

    def _allgatherv(self, send, recv_counts):
        return self._hvd.allgather(send, name=self._name(), process_set=self._ps)

    def _allgather_int64(self, row):
        t = torch.from_numpy(row).reshape(1, -1)
        return self._hvd.allgather(t, name=self._name(), process_set=self._ps).numpy()

    def _allreduce_sum(self, tensor):
        return self._hvd.allreduce(tensor, op=self._hvd.Sum, name=self._name(), process_set=self._ps)
