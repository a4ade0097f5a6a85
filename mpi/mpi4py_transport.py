"""Transport over mpi4py on a private communicator: Push and Pull point to point.

Push and Pull: one Isend per peer, then a matched probe (Improbe) per incoming message gives its
size, and its receive starts at once, so every peer's message moves at the same time. A round
costs one message per peer, and no size exchange. Between hosts the Pull goes around a ring
instead (Transport.pull_route); inside one host its bodies are received in place, back to
back. The collectives (Alltoallv,
Allgatherv, Allgather, Allreduce) serve the baselines and control values. Every wait (probes,
sends, the collectives in their non-blocking form) polls under the stall policy (stall.py): a
dead or departed peer ends the wait with an error naming the tensor and the missing ranks.
A rank whose process ends sends each peer a farewell (its sync count) at exit; a wait for a
rank that said farewell raises PeerLeftError within a second (stall.LAST_MESSAGES: what the
rank sent before it left may still land), naming the ranks and their counts, so a rank that
exits or runs ahead ends the job without waiting for the stall deadline.
Buffers are the torch tensors' own memory (no copies); counts and displacements are explicit.
The device data path's buffers (CUDA tensors) go to MPI as they are when the library is
CUDA-aware (cuda_aware), after the tensor's stream has finished writing them; otherwise they
are staged through host memory (Transport.push of a tensor).
Needs a real MPI job (mpirun, or horovodrun with MPI); under `horovodrun --gloo` there is none.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import time

import numpy as np
import torch

from . import stall
from .torch_transport import host_key
from .transport import PointToPoint, body_of, copy, displacements, empty_like, pad8

PUSH_TAG, PULL_TAG, STEP_TAG, FAREWELL_TAG = 101, 102, 103, 104
CUDA_AWARE_VAR = "ZEN_HVD_CUDA_AWARE_MPI"   # "1" or "0": overrides what the library reports


def cuda_aware(MPI) -> bool:
    """Whether the MPI library sends and receives CUDA memory itself: ZEN_HVD_CUDA_AWARE_MPI
    ("1" or "0") if set, else Open MPI's MPIX_Query_cuda_support() (the cuda extension, which
    reports the run time's support), else no (other libraries: set the variable)."""
    forced = os.environ.get(CUDA_AWARE_VAR)
    if forced:
        if forced not in ("0", "1"):
            raise ValueError(f"{CUDA_AWARE_VAR} must be 0 or 1, not {forced!r}")
        return forced == "1"
    try:
        query = ctypes.CDLL(MPI.__file__).MPIX_Query_cuda_support   # found through libmpi
    except (OSError, AttributeError):
        return False
    return bool(query())


class Mpi4pyTransport(PointToPoint):
    name = "mpi4py"
    push_tag, pull_tag, step_tag = PUSH_TAG, PULL_TAG, STEP_TAG
    ring_capable = True

    def __init__(self, ranks=None, comm=None):
        """Among the MPI ranks `ranks` (ascending; None: every rank of the job), or on `comm`
        (a communicator of its own, from split)."""
        from mpi4py import MPI

        self._MPI = MPI
        world = MPI.COMM_WORLD
        self.policy = stall.transport_policy()
        if comm is not None:
            self.comm = comm
        elif ranks is None or sorted(ranks) == list(range(world.Get_size())):
            # Non-blocking, under the stall policy: a rank that never builds this transport
            # (it chose another) must not leave the others blocked here.
            self.comm, request = world.Idup()
            stall.wait(request.Test, self.policy, lambda: "the mpi4py transport's communicator",
                       lambda: "every rank to create it (do all ranks use the mpi4py transport?)")
        else:
            # Ranks outside the set get COMM_NULL and never build this transport.
            group = world.Get_group().Incl(sorted(ranks))
            self.comm = world.Create_group(group)
            group.Free()
        super().__init__(self.comm.Get_rank(), self.comm.Get_size())
        self._left = {}   # rank -> its sync count, for the ranks that said farewell
        self.group_hosts(self.allgather_int64(self.host_row(host_key())))
        self._cuda_aware = cuda_aware(MPI)
        atexit.register(self._farewell)   # before mpi4py's MPI_Finalize (registered earlier)

    def close(self):
        atexit.unregister(self._farewell)

    def _split(self, color, members):
        return Mpi4pyTransport(comm=self.comm.Split(int(color), self.rank))

    # -- departed peers ------------------------------------------------------------------
    def _farewell(self):
        """At exit: this rank's sync count to every peer (a small, eager message)."""
        MPI = self._MPI
        if MPI.Is_finalized() or self.size == 1:
            return
        note = np.array([self.syncs], np.int64)
        reqs = [self.comm.Isend([note, MPI.INT64_T], dest=r, tag=FAREWELL_TAG)
                for r in range(self.size) if r != self.rank]
        deadline = time.monotonic() + 1.0
        while not MPI.Request.Testall(reqs) and time.monotonic() < deadline:
            time.sleep(0.001)

    def _gone(self, ranks):
        """None, or a phrase naming those of `ranks` that said farewell and their counts."""
        MPI, status = self._MPI, self._MPI.Status()
        for r in ranks:
            if r not in self._left and self.comm.Iprobe(source=r, tag=FAREWELL_TAG, status=status):
                note = np.empty(1, np.int64)
                self.comm.Recv([note, MPI.INT64_T], source=r, tag=FAREWELL_TAG)
                self._left[r] = int(note[0])
        counts = {}
        for r in ranks:
            if r in self._left:
                counts.setdefault(self._left[r], []).append(r)
        if not counts:
            return None
        each = "; ".join(f"{self.ranks_phrase(rs)} left after {c} syncs" for c, rs in sorted(counts.items()))
        return f"{each} (this rank is in sync {self.syncs})"

    def _exchange(self, sends, tag):
        """sends[r] (uint8 numpy, a tensor, or None) goes to rank r; returns the received parts,
        each in its own buffer where the sends live (the part from this rank is empty)."""
        comm, me = self.comm, self.rank
        reqs = [(r, comm.Isend(self._buffer(buf), dest=r, tag=tag))
                for r, buf in enumerate(sends) if r != me]
        like = next(b for b in sends if b is not None)
        parts = self._receive([r for r in range(self.size) if r != me], tag,
                              lambda src, nbytes: empty_like(like, nbytes))
        self._wait(reqs)
        parts[me] = empty_like(like, 0)
        return parts

    def _buffer(self, buf):
        """MPI's view of a uint8 buffer: numpy as it is, a CPU tensor's numpy view, a CUDA
        tensor itself (a CUDA-aware MPI reads its __cuda_array_interface__)."""
        if isinstance(buf, torch.Tensor) and not buf.is_cuda:
            buf = buf.numpy()
        return [buf, self._MPI.BYTE]

    def _receive(self, sources, tag, alloc):
        """One message from each source, each received as soon as it is there: its matched
        probe gives its size, alloc(source, nbytes) its buffer, and its receive starts at once.
        So every peer's message moves at the same time: the bulk of a long message (MPI's
        rendezvous) flows only once its receive is posted, and receiving the messages one
        after another would move one peer's at a time. Returns the buffers, a list indexed by
        rank (None where no message was expected)."""
        got, reqs = [None] * self.size, []

        def matched(src, msg, nbytes):
            got[src] = alloc(src, nbytes)
            reqs.append((src, msg.Irecv(self._buffer(got[src]))))

        self._probe(sources, tag, matched)
        self._wait(reqs, tag, "the rest of the messages of")
        return got

    def _probe(self, sources, tag, matched):
        """matched(source, message, nbytes) for the next message from each source on `tag`,
        as its matched probe (Improbe) finds it. Probes go per source, not ANY_SOURCE: a peer
        that raised a header error may already have sent its next sync's message, which must
        wait behind this one (MPI keeps each source's messages in order); one ANY_SOURCE
        Iprobe skips them while nothing has arrived. Polled under the stall policy (MPI's
        blocking calls spin, and on ranks that share cores the spinning takes the cores from
        the ranks still computing)."""
        MPI, status = self._MPI, self._MPI.Status()
        pending = list(sources)

        def arrived():
            if pending and self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=tag):
                for src in list(pending):
                    msg = self.comm.Improbe(source=src, tag=tag, status=status)
                    if msg is not None:
                        pending.remove(src)
                        matched(src, msg, status.Get_count(MPI.BYTE))
            return not pending

        def gone():   # a message sent before its sender's farewell is taken first
            return None if arrived() else self._gone(pending)

        stall.wait(arrived, self.policy, lambda: self._what(tag),
                   lambda: f"the messages of {self.ranks_phrase(pending)}", gone)

    def _pull_joined(self, send, body_nbytes):
        """Around the ring: PointToPoint's (each message as it comes round, then the bodies
        copied together). Direct: the bodies received in place, with no pass over them besides
        MPI's own: message r is received where body r starts, right after body r - 1, so its
        tail lands where body r + 1 will go, and the tail is copied out before the next
        receive overwrites it (one receive after another: a body's length is in its tail).
        numpy buffers, or tensors on one device (the device route)."""
        if self.pull_route() == "ring":
            return super()._pull_joined(send, body_nbytes)
        me = self.rank
        reqs = [(r, self.comm.Isend(self._buffer(send), dest=r, tag=PULL_TAG)) for r in range(self.size) if r != me]
        msgs, counts = [None] * self.size, [0] * self.size

        def matched(src, msg, nbytes):
            msgs[src], counts[src] = msg, nbytes

        self._probe([r for r in range(self.size) if r != me], PULL_TAG, matched)
        counts[me] = len(send)
        buf = empty_like(send, sum(counts))
        off, tails = 0, []
        for r in range(self.size):
            message = buf[off:off + counts[r]]
            if r == me:
                b = body_of(send, body_nbytes)
                message[:b] = send[:b]
                tails.append(send[pad8(b):])
            else:
                msgs[r].Recv(self._buffer(message))
                b = body_of(message, body_nbytes)
                tails.append(copy(message[pad8(b):]))
            off += b
        self._wait(reqs, PULL_TAG)
        return (buf[:off], tails), counts

    def _wait(self, reqs, tag=None, waiting_for="receives by"):
        """Wait for (peer, request) pairs under the stall policy."""
        if not reqs:
            return
        requests = [q for _, q in reqs]

        def waiting():
            return [r for r, q in reqs if q != self._MPI.REQUEST_NULL and not q.Test()]

        stall.wait(lambda: self._MPI.Request.Testall(requests), self.policy, lambda: self._what(tag),
                   lambda: f"{waiting_for} {self.ranks_phrase(waiting())}",
                   lambda: self._gone(waiting()))

    def _collective(self, request):
        """Wait for a non-blocking collective under the stall policy."""
        stall.wait(request.Test, self.policy, self._what, lambda: "every rank to join a collective",
                   lambda: self._gone([r for r in range(self.size) if r != self.rank]))


    def _start_send(self, message, peer, tag):
        return [(peer, self.comm.Isend(self._buffer(message), dest=peer, tag=tag))]

    def _receive_from(self, peer, tag, like):
        return self._receive([peer], tag, lambda src, nbytes: empty_like(like, nbytes))[peer]

    # -- device buffers: the same rounds on tensors, for a CUDA-aware MPI -----------------
    def moves_cuda(self, device):
        return self._cuda_aware

    def _push_device(self, send, send_counts):
        _written(send)
        return self._push(send, send_counts)

    def _pull_joined_device(self, send, body_nbytes):
        _written(send)
        return self._pull_joined(send, body_nbytes)

    def _swap_device(self, send, peer, receive, device):
        if send is not None:
            _written(send)
        return self._swap(send, peer, receive, device)

    def _alltoallv(self, send, send_counts, recv_counts):
        recv = torch.empty(sum(recv_counts), dtype=torch.uint8)
        B = self._MPI.BYTE
        self._collective(self.comm.Ialltoallv(
            [send.numpy(), (send_counts, displacements(send_counts)), B],
            [recv.numpy(), (recv_counts, displacements(recv_counts)), B]))
        return recv

    def _allgatherv(self, send, recv_counts):
        recv = torch.empty(sum(recv_counts), dtype=torch.uint8)
        self._collective(self.comm.Iallgatherv(
            [send.numpy(), self._MPI.BYTE],
            [recv.numpy(), (recv_counts, displacements(recv_counts)), self._MPI.BYTE]))
        return recv

    def _allgather_int64(self, row):
        out = np.empty(self.size * row.size, dtype=np.int64)
        self._collective(self.comm.Iallgather([row, self._MPI.INT64_T], [out, self._MPI.INT64_T]))
        return out

    def _allreduce_sum(self, tensor):
        t = tensor.detach().contiguous().clone()
        if t.dtype in (torch.float16, torch.bfloat16):
            raise TypeError(f"mpi4py transport cannot sum {t.dtype}; use the horovod transport")
        self._collective(self.comm.Iallreduce(self._MPI.IN_PLACE, t.numpy()))
        return t

    def _swap(self, send, peer, receive, device=None):
        """One step of a hierarchy; the received message lands in a numpy buffer, or in a
        tensor on `device` (the device route)."""
        if peer is None:
            return None
        MPI = self._MPI
        reqs = [(peer, self.comm.Isend(self._buffer(send), dest=peer, tag=STEP_TAG))] if send is not None else []
        got = None
        if receive:
            got = self._receive([peer], STEP_TAG, lambda src, nbytes: np.empty(nbytes, np.uint8) if device is None
                                else torch.empty(nbytes, dtype=torch.uint8, device=device))[peer]
        self._wait(reqs)
        return got


def _written(t: torch.Tensor) -> None:
    """Wait until the kernels queued on t's stream have written it: MPI reads device memory
    outside CUDA's stream order."""
    if t.is_cuda:
        torch.cuda.current_stream(t.device).synchronize()
