"""The transport contract: how bytes move between ranks, and how many moved.

Every scheme talks to the other ranks only through a `Transport`. A transport moves flat uint8
torch tensors (callers pack indices and values into one buffer, so each step is one collective)
and counts, per call, the bytes this rank sent to and received from *other* ranks:

- alltoallv: sent = sum(send_counts) - send_counts[rank], received likewise with recv_counts;
- allgatherv: sent = len(send) * (size - 1) (each peer gets a copy), received = the peers' parts;
- swap (one step of a hierarchy): the bytes sent to and received from the one peer;
- small integer exchanges (headers, counts, seeds) are counted the same way, as "control" bytes.

Buffer layout is always rank-major: part r of a send (or receive) buffer goes to (came from)
rank r, parts back to back in rank order.

Push and Pull (balanced parallelism's two rounds, and every scheme's first round) are
point-to-point where the transport allows it, and the receiver learns each message's size from
the message itself (a matched probe, or a length sent with it), so no round is spent on sizes:

- push(send, send_counts): part r of `send` goes to rank r; returns the n parts received;
- pull(send): `send` goes to every other rank; returns the n parts received;
- push_all(send): the same in the Push round (a one-shot scheme's only round);
- pull_joined(send, body_nbytes): a pull of messages laid out [body][pad to 8][tail] whose
  bodies are wanted back to back in one buffer (balanced parallelism's aggregated values: the
  result without another copy); returns (bodies, tails).
Both take and return flat uint8 numpy arrays (the data path works on numpy views of them), a
list of n parts, part `rank` being this rank's own (not sent). The first
`control` bytes of every part (a header) are counted as control bytes, the rest as data.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os

import numpy as np
import torch

DEVICE_BUFFERS_VAR = "ZEN_HVD_DEVICE_BUFFERS"   # "1": CPU buffers take the device route too
PULL_VAR = "ZEN_HVD_PULL"                       # Transport.pull_route
RANKS_PER_HOST_VAR = "ZEN_HVD_RANKS_PER_HOST"   # Transport.group_hosts: consecutive ranks per host
# Settings that change which messages a rank sends: every rank must hold the same values, and
# a transport's construction compares them (group_hosts).
AGREED_VARS = (PULL_VAR, RANKS_PER_HOST_VAR, "ZEN_HVD_TWO_LEVEL")


@dataclasses.dataclass
class CommStats:
    """Bytes and calls of one transport (this rank's view)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    control_bytes_sent: int = 0
    control_bytes_received: int = 0
    calls: int = 0
    off_host_sent: int = 0        # of the bytes above (data and control), those to and from
    off_host_received: int = 0    # ranks on other hosts (where the transport knows the hosts)

    def add(self, sent: int, received: int, control: bool = False, off_host=(0, 0)) -> None:
        if control:
            self.control_bytes_sent += int(sent)
            self.control_bytes_received += int(received)
        else:
            self.bytes_sent += int(sent)
            self.bytes_received += int(received)
        self.off_host_sent += int(off_host[0])
        self.off_host_received += int(off_host[1])
        self.calls += 1

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class Transport:
    """Base class: rank bookkeeping and byte accounting; subclasses move the bytes."""

    name = "abstract"
    activity = "(none yet)"   # the tensor being synchronized, for errors (set by the sync)
    broken = False            # a peer was lost: the next sync builds a new transport
    syncs = 0                 # syncs begun on this transport (set by the sync, for errors)
    sizes_first = False       # its device route sends other messages than its host route
    ring_capable = False      # its Pull can go around a ring (pull_route)
    hosts = 1                 # the hosts its ranks run on, where it can tell (pull_route)
    host_of = None            # every rank's host, 0..hosts-1 in order of first rank (group_hosts)
    names = None              # a split transport's ranks as the transport it came from numbers them

    def __init__(self, rank: int, size: int):
        self.rank = rank
        self.size = size
        self.stats = CommStats()
        self._cpu_by_device_route = os.environ.get(DEVICE_BUFFERS_VAR) == "1"

    def close(self) -> None:
        """Release what the transport holds (a reset: the ranks are about to change)."""

    # -- hosts -----------------------------------------------------------------------------
    @staticmethod
    def host_row(key: int) -> list:
        """What this rank tells the others at construction for group_hosts: its host's key
        (equal on the ranks of one host) and a digest of the AGREED_VARS it holds."""
        held = "\0".join(f"{v}={os.environ.get(v, '')}" for v in AGREED_VARS)
        return [int(key), int.from_bytes(hashlib.blake2b(held.encode(), digest_size=7).digest(), "little")]

    def group_hosts(self, table) -> None:
        """host_of and hosts from every rank's host_row (the same table on every rank):
        ranks with one key share a host, unless ZEN_HVD_RANKS_PER_HOST=k groups them k
        consecutive ranks to a host (several hosts emulated on one machine). Ranks holding
        different AGREED_VARS raise this error on every rank: their rounds would not meet."""
        table = np.asarray(table, np.int64).reshape(self.size, 2)
        if len(set(table[:, 1].tolist())) > 1:
            held = "\n".join(f"  {v}={os.environ.get(v, '(unset)')}" for v in AGREED_VARS)
            raise ValueError("zen_hvd: the ranks hold different values of " + ", ".join(AGREED_VARS)
                             + f" (they must agree on every rank); rank {self.rank} holds:\n{held}")
        keys = table[:, 0].tolist()
        per = int(os.environ.get(RANKS_PER_HOST_VAR) or 0)
        if per > 0:
            keys = [r // per for r in range(self.size)]
        index: dict = {}
        self.host_of = [index.setdefault(k, len(index)) for k in keys]
        self.hosts = len(index)

    def off_host(self, peer: int) -> bool:
        """Whether `peer` runs on another host than this rank (False where hosts are unknown)."""
        return self.host_of is not None and self.host_of[peer] != self.host_of[self.rank]

    def split(self, color: int):
        """A transport of the same kind over the ranks that pass the same `color` (every rank
        calls it together), ranked as here, its ranks on the hosts they are on here; None
        where the transport cannot make one."""
        colors = self.allgather_int64([int(color)])[:, 0]
        members = [r for r in range(self.size) if colors[r] == color]
        sub = self._split(color, members)
        if sub is not None:
            index: dict = {}
            sub.host_of = [index.setdefault(self.host_of[r], len(index)) for r in members]
            sub.hosts = len(index)
            sub.names = [self.name_of(r) for r in members]
        return sub

    def name_of(self, rank: int) -> int:
        """How errors name `rank`: as the transport this one was split from does."""
        return self.names[rank] if self.names else rank

    def ranks_phrase(self, ranks) -> str:
        from . import stall

        return stall.ranks_phrase([self.name_of(r) for r in ranks])

    def _split(self, color: int, members: list):
        """split's transport over `members` (ranks here, ascending), or None."""
        return None

    # -- what subclasses implement -------------------------------------------------------
    def _alltoallv(self, send: torch.Tensor, send_counts, recv_counts) -> torch.Tensor:
        raise NotImplementedError

    def _allgatherv(self, send: torch.Tensor, recv_counts) -> torch.Tensor:
        raise NotImplementedError

    def _allgather_int64(self, row: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _push(self, send: np.ndarray, send_counts: list) -> list:
        """Point-to-point all-to-all with sizes carried by the messages (see the module doc)."""
        raise NotImplementedError

    def _pull(self, send: np.ndarray) -> list:
        """`send` to every other rank; what every rank sent, sizes carried by the messages."""
        raise NotImplementedError

    # -- the counted interface -----------------------------------------------------------
    def alltoallv(self, send: torch.Tensor, send_counts, recv_counts) -> torch.Tensor:
        """Part r of `send` (send_counts[r] bytes) goes to rank r; returns the received parts,
        rank-major, recv_counts[r] bytes from rank r."""
        send_counts = [int(c) for c in send_counts]
        recv_counts = [int(c) for c in recv_counts]
        assert send.dtype == torch.uint8 and send.numel() == sum(send_counts)
        out = self._alltoallv(send, send_counts, recv_counts)
        self.stats.add(sum(send_counts) - send_counts[self.rank],
                       sum(recv_counts) - recv_counts[self.rank],
                       off_host=(self._off(send_counts), self._off(recv_counts)))
        return out

    def allgatherv(self, send: torch.Tensor, recv_counts=None):
        """Every rank gets every rank's `send`, rank-major. If `recv_counts` is not known it is
        exchanged first (control bytes). Returns (received, recv_counts)."""
        assert send.dtype == torch.uint8
        if recv_counts is None:
            recv_counts = self.allgather_int64(np.array([send.numel()], dtype=np.int64))[:, 0]
        recv_counts = [int(c) for c in recv_counts]
        assert recv_counts[self.rank] == send.numel()
        out = self._allgatherv(send, recv_counts)
        self.stats.add(send.numel() * (self.size - 1), sum(recv_counts) - send.numel(),
                       off_host=(self._off([send.numel()] * self.size), self._off(recv_counts)))
        return out, recv_counts

    def push(self, send, send_counts, control: int = 0) -> list:
        """Part r of `send` (send_counts[r] bytes) goes to rank r. Returns the n parts received
        (part `rank` is this rank's own slice of `send`), rank-major, sizes from the messages.
        `send` is a uint8 numpy buffer, or a flat uint8 torch tensor on any device (the device
        data path): then the parts are tensors on its device, moved there by the transport
        (_push_device) or staged through host memory."""
        send_counts = [int(c) for c in send_counts]
        if isinstance(send, torch.Tensor):
            assert send.dtype == torch.uint8
            if self.size == 1:
                return [send]
            if not self.moves_device_memory(send.device):
                return [as_tensor(p).to(send.device) for p in self.push(send.cpu().numpy(), send_counts, control)]
            parts = self._push_device(send, send_counts)
            nbytes = [p.numel() for p in parts]
        else:
            assert send.dtype == np.uint8 and send.size == sum(send_counts)
            parts = self._push(send, send_counts)
            nbytes = [p.size for p in parts]
        self._count(sum(send_counts) - send_counts[self.rank], sum(nbytes) - nbytes[self.rank], control,
                    (self._off(send_counts), self._off(nbytes)))
        return parts

    def pull(self, send: np.ndarray, control: int = 0) -> list:
        """`send` goes to every other rank. Returns the n parts received, part `rank` being
        `send` itself."""
        assert send.dtype == np.uint8
        parts = self._pull(send) if self.size > 1 else [send]
        self._count(*self._pull_bytes([p.size for p in parts], control))
        return parts

    def push_all(self, send: np.ndarray, control: int = 0) -> list:
        """A Push whose every part is `send` (a one-shot scheme's round: every peer gets the
        same message). A pull in the Push round: a rank that runs another scheme meets it
        there, and the header check names the difference. Returns the n parts received."""
        assert send.dtype == np.uint8
        parts = self._push_all(send) if self.size > 1 else [send]
        nbytes = [p.size for p in parts]
        self._count(send.size * (self.size - 1), sum(nbytes) - send.size, control,
                    (self._off([send.size] * self.size), self._off(nbytes)))
        return parts

    def _push_all(self, send):
        """Default: a push of `send` repeated for every rank."""
        parts = self._push(np.tile(send, self.size), [send.size] * self.size)
        parts[self.rank] = send
        return parts

    def pull_joined(self, send, body_nbytes, control: int = 0):
        """A pull of messages [body][pad to 8][tail], the tail ending in an int64 from which
        body_nbytes(that int64) gives the body's length. Returns (bodies, tails): one uint8
        buffer holding every rank's body in rank order, and each rank's tail (from the next
        multiple of 8 after its body). A message too short for its int64, or whose body would
        not fit, comes back whole as its tail with an empty body (the caller's size checks
        then name it). Here: a pull, then the bodies copied together; transports that can
        receive in place override _pull_joined. `send` is a uint8 numpy buffer or torch tensor
        (as in push: then bodies and tails are tensors on its device)."""
        if self.size == 1:
            return joined([send], body_nbytes)
        if isinstance(send, torch.Tensor):
            assert send.dtype == torch.uint8
            if not self.moves_device_memory(send.device):
                bodies, tails = self.pull_joined(send.cpu().numpy(), body_nbytes, control)
                return as_tensor(bodies).to(send.device), [as_tensor(t).to(send.device) for t in tails]
            got, sizes = self._pull_joined_device(send, body_nbytes)
            self._count(*self._pull_bytes(sizes, control))
            return got
        assert send.dtype == np.uint8
        got, sizes = self._pull_joined(send, body_nbytes)
        self._count(*self._pull_bytes(sizes, control))
        return got

    def _pull_joined(self, send, body_nbytes):
        """((bodies, tails), every rank's message size): a pull, then the bodies copied
        together (numpy buffers, or tensors on one device: the device route)."""
        parts = self._pull(send)
        return joined(parts, body_nbytes), [len(p) for p in parts]

    def _pull_bytes(self, sizes, control):
        """_count's arguments (sent, received, control, (of them off host)) for a pull of messages of `sizes` bytes by
        rank: this rank's message to every peer and every peer's from it, or around the ring
        every message but its right neighbour's to that neighbour (the last to reach it), and
        every message but its own from its left one."""
        n, me = self.size, self.rank
        if n == 1:
            return 0, 0, control, (0, 0)
        received = sum(sizes) - sizes[me]
        if self.pull_route() == "ring":
            right, left = (me + 1) % n, (me - 1) % n
            sent = sum(sizes) - sizes[right]
            return sent, received, control, (sent * self.off_host(right), received * self.off_host(left))
        return sizes[me] * (n - 1), received, control, (self._off([sizes[me]] * n), self._off(sizes))

    def _off(self, nbytes) -> int:
        """Of nbytes[r] to or from every rank r, those to or from other hosts."""
        return sum(int(b) for r, b in enumerate(nbytes) if self.off_host(r))

    def pull_route(self) -> str:
        """How a Pull reaches every rank: "direct" (every rank sends its message to every
        peer at once) or "ring" (n - 1 steps, each rank forwarding to its right neighbour what
        its left one sent: each link carries one message at a time). The same bytes received.
        Between hosts the ring wins: its links stay busy and few flows compete for them,
        while many short concurrent flows, each restarting from TCP's initial window after
        the idle time between syncs, leave a rate-limited link idle half the time. Inside one
        host (shared memory, no link to fill) the direct Pull wins: its messages move at once
        instead of in n - 1 steps. ZEN_HVD_PULL: "direct", "ring", or "auto" (the default: the
        ring when the ranks span several hosts, on a transport that can run it). The same on
        every rank, or the rounds do not meet."""
        choice = os.environ.get(PULL_VAR) or "auto"
        if choice not in ("auto", "direct", "ring"):
            raise ValueError(f"{PULL_VAR} must be 'auto', 'direct' or 'ring', not {choice!r}")
        if not self.ring_capable or self.size < 3:
            return "direct"
        if choice == "auto":
            return "ring" if self.hosts > 1 else "direct"
        return choice

    # -- device buffers (the device data path, zen_hvd/device.py) ------------------------
    def moves_device_memory(self, device) -> bool:
        """Whether this transport sends and receives the device path's buffers on `device`
        itself (_push_device, _pull_joined_device, _swap_device) rather than through host copies: CUDA
        buffers when the transport can move them (moves_cuda); CPU buffers when
        ZEN_HVD_DEVICE_BUFFERS=1, which runs the same route on the CUDA simulator's CPU
        tensors (how the suite tests it without a GPU)."""
        return self.moves_cuda(device) if device.type == "cuda" else self._cpu_by_device_route

    def route(self, device) -> int:
        """The header's "route" for a tensor on `device` on the device data path: 1 when its
        messages follow another protocol than the host path's (sizes_first), else 0."""
        return int(self.sizes_first and self.size > 1 and self.moves_device_memory(device))

    def moves_cuda(self, device) -> bool:
        """Whether the transport moves CUDA memory on `device` itself (NCCL, CUDA-aware MPI,
        Horovod's GPU operations)."""
        return False

    def _push_device(self, send, send_counts):
        raise NotImplementedError

    def _pull_joined_device(self, send, body_nbytes):
        raise NotImplementedError

    def _swap_device(self, send, peer, receive, device):
        raise NotImplementedError

    def _count(self, sent: int, received: int, control: int, off_host=(0, 0)) -> None:
        """Counts one point-to-point round: `control` header bytes per message, rest data;
        off_host: of the bytes, those sent to and received from other hosts."""
        peers = self.size - 1
        self.stats.add(sent - control * peers, received - control * peers, off_host=off_host)
        if control:
            self.stats.add(control * peers, control * peers, control=True)
            self.stats.calls -= 1

    def allgather_int64(self, row) -> np.ndarray:
        """Gather one fixed-length int64 row from every rank: returns shape (size, len(row))."""
        row = np.ascontiguousarray(row, dtype=np.int64)
        table = self._allgather_int64(row)
        self.stats.add(row.nbytes * (self.size - 1), row.nbytes * (self.size - 1), control=True)
        return table.reshape(self.size, row.size)

    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Dense sum over ranks (used by the AllReduce baseline and dense fallbacks). Counted as
        a ring allreduce moves data: 2 (n-1)/n of the buffer each way."""
        out = self._allreduce_sum(tensor)
        nbytes = tensor.numel() * tensor.element_size()
        moved = 2 * (self.size - 1) * nbytes // self.size
        n, me = self.size, self.rank
        self.stats.add(moved, moved, off_host=(moved * self.off_host((me + 1) % n), moved * self.off_host((me - 1) % n)))
        return out

    def _swap(self, send, peer, receive):
        """Default: a push in which this rank's only non-empty part goes to `peer` (a
        collective, so every rank of the set calls it, those sitting the step out too)."""
        counts = [0] * self.size
        if peer is not None and send is not None:
            counts[peer] = send.size
        parts = self._push(send if send is not None else np.zeros(0, np.uint8), counts)
        return parts[peer] if receive and peer is not None else None

    def swap(self, send, peer, receive: bool = True, device=None):
        """One point-to-point step of a hierarchy: `send` (uint8 numpy, or None) goes to
        `peer`; returns the message `peer` sent this rank (if receive), its size carried by
        the message, else None. peer None: this rank sits the step out. Every rank of the set
        calls it at the same step. With `device` (the device data path) `send` is a uint8
        tensor there (or None) and so is the message returned, moved by the transport
        (_swap_device) or staged through host memory."""
        if device is not None and self.moves_device_memory(device):
            got = self._swap_device(send, peer, receive, device)
            self._count_swap(0 if send is None or peer is None else send.numel(), 0 if got is None else got.numel(), peer)
            return got
        if device is not None:
            got = self.swap(None if send is None else send.cpu().numpy(), peer, receive)
            return None if got is None else as_tensor(got).to(device)
        assert send is None or send.dtype == np.uint8
        got = self._swap(send, peer, receive)
        self._count_swap(0 if send is None or peer is None else send.size, 0 if got is None else got.size, peer)
        return got

    def _count_swap(self, sent, received, peer):
        off = peer is not None and self.off_host(peer)
        self.stats.add(sent, received, off_host=(sent * off, received * off))

    def broadcast_int(self, value: int, root: int = 0) -> int:
        """Rank `root`'s integer, on every rank."""
        return int(self.allgather_int64([int(value)])[root, 0])


class PointToPoint(Transport):
    """A transport whose rounds are point-to-point messages (mpi4py, torch.distributed): the
    subclass's _exchange(sends, tag) sends sends[r] to rank r and returns what every peer sent
    this rank; its tags name the round in its messages and errors."""

    push_tag = pull_tag = step_tag = None

    def _exchange(self, sends, tag) -> list:
        raise NotImplementedError

    def _push(self, send, send_counts):
        mine = split(send, send_counts)
        parts = self._exchange(mine, self.push_tag)
        parts[self.rank] = mine[self.rank]
        return parts

    def _pull(self, send):
        return self._ring(send, self.pull_tag) if self.pull_route() == "ring" else self._to_all(send, self.pull_tag)

    def _ring(self, send, tag):
        """Every rank's `send` to every rank around the ring (pull_route): at step
        t = 0..n-2 this rank sends its right neighbour the message it received at step t - 1
        (its own at t = 0) and receives from its left neighbour the message of rank
        (me - 1 - t) mod n. Each link carries one message at a time, back to back. Returns the
        messages by rank."""
        n, me = self.size, self.rank
        right, left = (me + 1) % n, (me - 1) % n
        parts, sends, message = [None] * n, [], send
        parts[me] = send
        for t in range(n - 1):
            sends += self._start_send(message, right, tag)
            message = self._receive_from(left, tag, send)
            parts[(me - 1 - t) % n] = message
        self._wait(sends, tag)
        return parts

    def _start_send(self, message, peer, tag) -> list:
        """Starts sending `message` to `peer`: the (peer, request) pairs for _wait."""
        raise NotImplementedError

    def _receive_from(self, peer, tag, like):
        """The next message from `peer` on `tag`, in a buffer where `like` lives."""
        raise NotImplementedError

    def _wait(self, pending, tag=None) -> None:
        raise NotImplementedError

    def _push_all(self, send):
        return self._to_all(send, self.push_tag)

    def _to_all(self, send, tag):
        parts = self._exchange([send] * self.size, tag)
        parts[self.rank] = send
        return parts

    def _what(self, tag=None) -> str:
        step = {self.push_tag: "Push", self.pull_tag: "Pull", self.step_tag: "hierarchy step"}.get(tag, "sync")
        return f"tensor {self.activity!r} ({step})"


def as_tensor(a: np.ndarray) -> torch.Tensor:
    """A uint8 numpy buffer as a torch tensor sharing its memory (numpy gives empty arrays a
    stride of 0, which torch then refuses to view as another dtype)."""
    return torch.from_numpy(a) if a.size else torch.zeros(0, dtype=torch.uint8)


def body_of(message, body_nbytes) -> int:
    """The body length of one [body][pad to 8][tail] message (pull_joined; numpy or a torch
    tensor on any device), or 0 when the message is too short for its closing int64 or for the
    body it announces."""
    return body_length(len(message), closing_int64(message), body_nbytes)


def closing_int64(message) -> int:
    """A message's last 8 bytes as an int64 (-1 when it is shorter); a tensor's come to the
    host as 8 bytes."""
    if len(message) < 8:
        return -1
    last = message[-8:]
    last = last.cpu().numpy() if isinstance(last, torch.Tensor) else last
    return int(np.ascontiguousarray(last).view(np.int64)[0])


def body_length(nbytes: int, tag: int, body_nbytes) -> int:
    """body_of from a message's size and its closing int64 (any value when nbytes < 8)."""
    if nbytes < 8:
        return 0
    b = int(body_nbytes(tag))
    return b if 0 <= b and pad8(b) + 8 <= nbytes else 0


def joined(parts, body_nbytes):
    """(bodies, tails) of pull_joined from the n messages received whole (numpy, or torch
    tensors on one device): the bodies copied together, each tail copied out (8-aligned
    whatever the buffer it came in)."""
    lengths = [body_of(p, body_nbytes) for p in parts]
    bodies = empty_like(parts[0], sum(lengths))
    off, tails = 0, []
    for p, b in zip(parts, lengths):
        bodies[off:off + b] = p[:b]
        tails.append(copy(p[pad8(b):]))
        off += b
    return bodies, tails


def empty_like(buf, nbytes: int):
    """An uninitialised uint8 buffer of nbytes where `buf` lives (numpy, or a tensor's device)."""
    if isinstance(buf, torch.Tensor):
        return torch.empty(nbytes, dtype=torch.uint8, device=buf.device)
    return np.empty(nbytes, np.uint8)


def copy(buf):
    return buf.clone() if isinstance(buf, torch.Tensor) else buf.copy()


def pad8(nbytes: int) -> int:
    """nbytes rounded up to a multiple of 8 (every part of a message starts 8-aligned)."""
    return (int(nbytes) + 7) & ~7


def split(buf, counts) -> list:
    """Rank-major buffer (numpy or torch) -> its parts (views, no copies)."""
    parts, off = [], 0
    for c in counts:
        parts.append(buf[off:off + c])
        off += c
    return parts


def displacements(counts) -> np.ndarray:
    """Exclusive prefix sum: where part r starts in a rank-major buffer."""
    d = np.zeros(len(counts), dtype=np.int64)
    if len(counts) > 1:
        np.cumsum(np.asarray(counts[:-1], dtype=np.int64), out=d[1:])
    return d
