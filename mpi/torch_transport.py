"""Transport over torch.distributed point-to-point (isend / irecv): gloo for CPU tensors.

Works under mpirun and under `horovodrun --gloo` alike: the process group is initialised from
Horovod's rank and size, with the rendezvous address agreed through Horovod (rank 0 picks a
free port and broadcasts it with its address in one hvd.broadcast). If the application has
already initialised torch.distributed with the same ranks, a gloo group is made beside its
default group instead. The NCCL backend takes the same calls for CUDA tensors (the GPU path).

Push and Pull: every message travels as an 8-byte length followed by its bytes; the sender
posts both at once, the receiver posts the payload's irecv once the length is in. So a round
costs one small and one data message per peer, no collective. Tags keep Push, Pull and the
two parts of a message apart.

A failed wait (a peer closed or reset its connection, or gloo's timeout, the stall shutdown
time, passed) raises HorovodInternalError naming the tensor, as Horovod's own collectives do
when a peer is lost: elastic Horovod (zen_hvd.elastic.run) then resets and rebuilds the
transport; elsewhere the error ends the job.
"""
from __future__ import annotations

import atexit
import datetime
import functools
import os
import socket

import numpy as np
import torch

from . import stall
from .transport import Transport, as_tensor, split

PUSH_TAG, PULL_TAG, STEP_TAG = 16, 32, 48   # lengths travel on tag, payloads on tag + 1
ADDR_VAR = "ZEN_HVD_RENDEZVOUS_ADDR"


def _peer_loss(method):
    """A RuntimeError of a gloo wait inside `method` -> HorovodInternalError naming the tensor;
    the transport is marked broken so the next sync builds a new one."""
    @functools.wraps(method)
    def wrapper(self, *args):
        try:
            return method(self, *args)
        except RuntimeError as e:
            from horovod.common.exceptions import HorovodInternalError

            if isinstance(e, HorovodInternalError):
                raise
            self.broken = True
            raise HorovodInternalError(f"zen_hvd: tensor {self.activity!r}: transport 'torch' "
                                       f"lost a peer ({e})") from e
    return wrapper


def _own_address() -> str:
    """This host's address as peers reach it: ZEN_HVD_RENDEZVOUS_ADDR, else the address of the
    interface that routes outward, else the host name's address."""
    if os.environ.get(ADDR_VAR):
        return os.environ[ADDR_VAR]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.254.254.254", 1))   # no packet is sent: only picks the route
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class TorchTransport(Transport):
    name = "torch"

    def __init__(self, process_set=None):
        import horovod.torch as hvd
        import torch.distributed as dist

        if process_set is not None:
            raise ValueError("transport 'torch' serves the global process set only; use "
                             "transport='mpi4py' or 'horovod' with a process set")
        self._dist = dist
        rank, size = hvd.rank(), hvd.size()
        if dist.is_initialized():
            if (dist.get_rank(), dist.get_world_size()) != (rank, size):
                raise RuntimeError("torch.distributed is initialised with other ranks than Horovod's")
            self._group = dist.new_group(backend="gloo")
        else:
            local = hvd.local_size() == size
            info = torch.zeros(5, dtype=torch.int64)
            if rank == 0:
                addr = "127.0.0.1" if local and not os.environ.get(ADDR_VAR) else _own_address()
                info[0] = _free_port()
                info[1:] = torch.tensor([int(b) for b in socket.inet_aton(
                    socket.gethostbyname(addr))])
            info = hvd.broadcast(info, root_rank=0, name="zen_hvd.torch_transport.rendezvous")
            addr = ".".join(str(int(b)) for b in info[1:])
            # Every wait of the group ends after the stall shutdown time (stall.py).
            shutdown = stall.Policy.from_env(0.0).shutdown
            kw = dict(timeout=datetime.timedelta(seconds=shutdown)) if shutdown > 0 else {}
            dist.init_process_group("gloo", init_method=f"tcp://{addr}:{int(info[0])}",
                                    rank=rank, world_size=size, **kw)
            self._group = None
        super().__init__(rank, size)
        # At exit too: a gloo thread still alive while the interpreter finalizes can abort
        # the process when it drops its last reference to a tensor.
        atexit.register(self.close)

    def close(self):
        """Destroy the group this transport made (the default group, if it initialised
        torch.distributed), so that a later transport can make another."""
        atexit.unregister(self.close)
        if not self._dist.is_initialized():
            return
        try:
            self._dist.destroy_process_group(self._group)
        except (RuntimeError, ValueError, AssertionError):   # already gone with its peers
            pass

    # -- point to point ------------------------------------------------------------------
    @_peer_loss
    def _exchange(self, sends, tag):
        """sends[r] (a uint8 tensor) goes to rank r; returns the received parts as views of one
        buffer (the part from this rank is empty)."""
        dist, me, g = self._dist, self.rank, self._group
        peers = [r for r in range(self.size) if r != me]
        sends = [as_tensor(b) for b in sends]
        lens_out = {r: torch.tensor([sends[r].numel()], dtype=torch.int64) for r in peers}
        lens_in = {r: torch.empty(1, dtype=torch.int64) for r in peers}
        reqs = [dist.irecv(lens_in[r], r, group=g, tag=tag) for r in peers]
        reqs += [dist.isend(lens_out[r], r, group=g, tag=tag) for r in peers]
        reqs += [dist.isend(sends[r], r, group=g, tag=tag + 1) for r in peers if sends[r].numel()]
        for q in reqs[:len(peers)]:
            q.wait()
        counts = [0 if r == me else int(lens_in[r][0]) for r in range(self.size)]
        recv = torch.empty(sum(counts), dtype=torch.uint8)
        parts = split(recv, counts)
        reqs += [dist.irecv(parts[r], r, group=g, tag=tag + 1) for r in peers if counts[r]]
        for q in reqs[len(peers):]:
            q.wait()
        return split(recv.numpy(), counts)

    def _push(self, send, send_counts):
        mine = split(send, send_counts)
        parts = self._exchange(mine, PUSH_TAG)
        parts[self.rank] = mine[self.rank]
        return parts

    def _pull(self, send):
        parts = self._exchange([send] * self.size, PULL_TAG)
        parts[self.rank] = send
        return parts

    # -- what the baselines use, on the same primitives -----------------------------------
    def _alltoallv(self, send, send_counts, recv_counts):
        return as_tensor(np.concatenate(self._push(send.numpy(), send_counts)))

    def _allgatherv(self, send, recv_counts):
        return as_tensor(np.concatenate(self._pull(send.numpy())))

    @_peer_loss
    def _allgather_int64(self, row):
        t = torch.from_numpy(row)
        out = [torch.empty_like(t) for _ in range(self.size)]
        self._dist.all_gather(out, t, group=self._group)
        return torch.cat(out).numpy()

    @_peer_loss
    def _allreduce_sum(self, tensor):
        t = tensor.detach().contiguous().clone()
        self._dist.all_reduce(t, group=self._group)
        return t

    @_peer_loss
    def _swap(self, send, peer, receive):
        if peer is None:
            return None
        dist, g = self._dist, self._group
        reqs, length = [], torch.tensor([0 if send is None else send.size], dtype=torch.int64)
        if send is not None:
            reqs.append(dist.isend(length, peer, group=g, tag=STEP_TAG))
            payload = as_tensor(send)   # held until the sends complete
            if send.size:
                reqs.append(dist.isend(payload, peer, group=g, tag=STEP_TAG + 1))
        got = None
        if receive:
            n_in = torch.empty(1, dtype=torch.int64)
            dist.irecv(n_in, peer, group=g, tag=STEP_TAG).wait()
            got = torch.empty(int(n_in[0]), dtype=torch.uint8)
            if got.numel():
                dist.irecv(got, peer, group=g, tag=STEP_TAG + 1).wait()
            got = got.numpy()
        for q in reqs:
            q.wait()
        return got
