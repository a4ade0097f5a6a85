"""Transport over mpi4py on a private communicator: Push and Pull point to point.

Push and Pull: one Isend per peer, then a matched probe (Mprobe) per incoming message gives its
size; all incoming messages land in one receive buffer allocated once their sizes are known.
So a round costs one message per peer, and no size exchange. The collectives (Alltoallv,
Allgatherv, Allgather, Allreduce) serve the baselines and control values.
Buffers are the torch tensors' own memory (no copies); counts and displacements are explicit.
Needs a real MPI job (mpirun, or horovodrun with MPI); under `horovodrun --gloo` there is none.
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch

from .transport import Transport, displacements, split

PUSH_TAG, PULL_TAG, STEP_TAG = 101, 102, 103
POLL_VAR = "ZEN_HVD_POLL_SECONDS"   # sleep between probes while a message is awaited


class Mpi4pyTransport(Transport):
    name = "mpi4py"

    def __init__(self, process_set=None):
        from mpi4py import MPI

        self._MPI = MPI
        world = MPI.COMM_WORLD
        ranks = None
        if process_set is not None:
            ranks = getattr(process_set, "ranks", None)
        if ranks is None or sorted(ranks) == list(range(world.Get_size())):
            self.comm = world.Dup()
        else:
            # Ranks outside the set get COMM_NULL and never build this transport.
            group = world.Get_group().Incl(sorted(ranks))
            self.comm = world.Create_group(group)
            group.Free()
        super().__init__(self.comm.Get_rank(), self.comm.Get_size())
        self.poll_seconds = float(os.environ.get(POLL_VAR, "0.00005"))

    def _exchange(self, sends, tag):
        """sends[r] (numpy uint8 or None) goes to rank r; returns the received parts as views
        of one buffer (the part from this rank is empty)."""
        MPI, comm, me = self._MPI, self.comm, self.rank
        reqs = [comm.Isend([buf, MPI.BYTE], dest=r, tag=tag)
                for r, buf in enumerate(sends) if r != me]
        # Probe per source, not ANY_SOURCE: a peer that raised a header error may already
        # have sent its next sync's message, which must wait behind this one (MPI keeps each
        # source's messages in order).
        msgs, counts, status = [None] * self.size, [0] * self.size, MPI.Status()
        for src in range(self.size):
            if src != me:
                msgs[src] = self._probe(src, tag, status)
                counts[src] = status.Get_count(MPI.BYTE)
        parts = split(np.empty(sum(counts), np.uint8), counts)
        for src, msg in enumerate(msgs):
            if msg is not None:
                msg.Recv([parts[src], MPI.BYTE])
        self._wait(reqs)
        return parts

    def _probe(self, src, tag, status):
        """A matched probe that sleeps while it waits: MPI's own blocking probe spins, and on
        ranks that share cores the spinning takes the cores from the ranks still computing."""
        msg = self.comm.Improbe(source=src, tag=tag, status=status)
        while msg is None:
            time.sleep(self.poll_seconds)
            msg = self.comm.Improbe(source=src, tag=tag, status=status)
        return msg

    def _push(self, send, send_counts):
        mine = split(send, send_counts)
        parts = self._exchange(mine, PUSH_TAG)
        parts[self.rank] = mine[self.rank]
        return parts

    def _pull(self, send):
        parts = self._exchange([send] * self.size, PULL_TAG)
        parts[self.rank] = send
        return parts

    def _alltoallv(self, send, send_counts, recv_counts):
        recv = torch.empty(sum(recv_counts), dtype=torch.uint8)
        B = self._MPI.BYTE
        self.comm.Alltoallv([send.numpy(), (send_counts, displacements(send_counts)), B],
                            [recv.numpy(), (recv_counts, displacements(recv_counts)), B])
        return recv

    def _allgatherv(self, send, recv_counts):
        recv = torch.empty(sum(recv_counts), dtype=torch.uint8)
        self.comm.Allgatherv([send.numpy(), self._MPI.BYTE],
                             [recv.numpy(), (recv_counts, displacements(recv_counts)), self._MPI.BYTE])
        return recv

    def _allgather_int64(self, row):
        out = np.empty(self.size * row.size, dtype=np.int64)
        self.comm.Allgather([row, self._MPI.INT64_T], [out, self._MPI.INT64_T])
        return out

    def _allreduce_sum(self, tensor):
        t = tensor.detach().contiguous().clone()
        if t.dtype in (torch.float16, torch.bfloat16):
            raise TypeError(f"mpi4py transport cannot sum {t.dtype}; use the horovod transport")
        self.comm.Allreduce(self._MPI.IN_PLACE, t.numpy())
        return t

    def _swap(self, send, peer, receive):
        if peer is None:
            return None
        MPI = self._MPI
        reqs = [self.comm.Isend([send, MPI.BYTE], dest=peer, tag=STEP_TAG)] if send is not None else []
        got = None
        if receive:
            status = MPI.Status()
            msg = self._probe(peer, STEP_TAG, status)
            got = np.empty(status.Get_count(MPI.BYTE), np.uint8)
            msg.Recv([got, MPI.BYTE])
        self._wait(reqs)
        return got

    def _wait(self, reqs):
        """Wait for sends, sleeping between tests (MPI's own wait spins, see _probe)."""
        while reqs and not self._MPI.Request.Testall(reqs):
            time.sleep(self.poll_seconds)
