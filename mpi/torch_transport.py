"""Transport over torch.distributed point-to-point (isend / irecv): gloo for CPU tensors.

Its gloo group: under torch.distributed (torchrun, DDP) a gloo group of the sync's ranks made
beside the application's groups (runtime.State.gloo: no second rendezvous); under Horovod
(mpirun, `horovodrun --gloo`) the process group is initialised from Horovod's rank and size,
with the rendezvous address agreed through Horovod (rank 0 picks a free port and broadcasts it
with its address in one hvd.broadcast), or, if the application has already initialised
torch.distributed with the same ranks, made beside its default group. The NCCL backend takes
the same calls for CUDA tensors (the GPU path).

Push and Pull: a message's first part is its 8-byte length and up to EAGER - 8 of its bytes,
received into an EAGER-byte buffer (gloo takes a message shorter than the buffer it lands in);
a longer message sends its rest at once as a second part, whose irecv the receiver posts once
it has read the length. So a round is one message per peer, no collective, and a second only
for messages over EAGER bytes. Tags keep Push, Pull and the two parts of a message apart.

Device buffers (the device data path, backend.Device) travel over NCCL, which
receives only the exact size sent: each round first sends every peer its message's size (and
a Pull message's tag) in a small gloo message on the round's tag, then the data point to point in one
batch_isend_irecv on an NCCL group made beside the gloo one at the first device sync. A Pull
message's body and tail go as two sends, so the body lands straight in its place among the
others. ZEN_HVD_DEVICE_BUFFERS=1 runs this sized protocol over gloo on CPU tensors as well (how
the suite tests it without a GPU).

Every wait ends at the group's timeout, the stall shutdown time (stall.py): gloo's
point-to-point works complete only in wait(), so there is no earlier warning. A wait that timed
out raises StallError (the peer is alive but does not send: stuck, or out of step); a failed
wait (a peer closed or reset its connection: it died or exited) raises PeerLostError; both
name the tensor and the rank. Where Horovod runs, either is also Horovod's HorovodInternalError,
as Horovod's own collectives raise when a peer is lost or the job stalls: elastic Horovod
(zen_hvd.elastic.run) then resets and rebuilds the transport; elsewhere the error ends the job.
"""
from __future__ import annotations

import atexit
import datetime
import functools
import hashlib
import logging
import os
import socket
import sys

import numpy as np
import torch

from . import stall
from .transport import PointToPoint, as_tensor, body_length, pad8, split

PUSH_TAG, PULL_TAG, STEP_TAG = 16, 32, 48   # first parts travel on tag, the rest on tag + 1
SIZED = 0x5A454E53495A4544   # first word of a device round's size message
EAGER = 1 << 18   # bytes of a message's first part, length included
ADDR_VAR = "ZEN_HVD_RENDEZVOUS_ADDR"
log = logging.getLogger("zen_hvd")




def peer_error(message: str, kind: type = stall.PeerLostError) -> Exception:
    """The error of a sync that lost a peer (PeerLostError) or timed out waiting on one
    (StallError); where Horovod runs, also Horovod's HorovodInternalError, after which elastic
    Horovod resets and carries on."""
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized():
        return _with_horovod(kind)(message)
    return kind(message)


@functools.cache
def _with_horovod(kind: type) -> type:
    from horovod.common.exceptions import HorovodInternalError

    return type(kind.__name__, (kind, HorovodInternalError), {"__module__": kind.__module__})


# A process that ends leaves a note in torch.distributed's store (the default group's) with its
# sync count, so a rank whose wait fails can say which ranks left: gloo only says that a
# connection closed.
_FAREWELL = "zen_hvd.left.{}"


def _store():
    try:
        return torch.distributed.distributed_c10d._get_default_store()
    except (RuntimeError, AttributeError, ValueError):
        return None


def departed(members) -> "str | None":
    """A phrase naming those of `members` (global ranks; their index in the list is their rank
    in the group) that ended their process, with their sync counts; None when none did, or it
    cannot be known."""
    store = _store()
    if store is None:
        return None
    left = {}
    for r, g in enumerate(members):
        try:
            if store.check([_FAREWELL.format(g)]):
                left.setdefault(int(store.get(_FAREWELL.format(g))), []).append(r)
        except RuntimeError:   # the store's host has gone too
            return None
    if not left:
        return None
    return "; ".join(f"{stall.ranks_phrase(rs)} left after {c} syncs" for c, rs in sorted(left.items()))


def _peer_loss(method):
    """A RuntimeError of a gloo collective inside `method` -> peer_error naming the tensor; the
    transport is marked broken so the next sync builds a new one."""
    @functools.wraps(method)
    def wrapper(self, *args):
        try:
            return method(self, *args)
        except RuntimeError as e:
            if isinstance(e, stall.StallError):
                raise
            self.broken = True
            raise peer_error(f"zen_hvd: tensor {self.activity!r}: transport 'torch' lost a peer ({e})") from e
    return wrapper


def host_key() -> int:
    """This host's key among the ranks (Transport.group_hosts): its host name and its outward
    address, the same on the ranks of one host (network namespaces on one machine, as the
    emulated cluster's hosts, share the name and differ in the address)."""
    where = f"{socket.gethostname()} {own_address()}".encode()
    return int.from_bytes(hashlib.blake2b(where, digest_size=7).digest(), "little")


def own_address() -> str:
    """This host's address as peers reach it: ZEN_HVD_RENDEZVOUS_ADDR, else the address of the
    interface that routes outward, else (no default route, as on a private cluster network)
    the first non-loopback interface's address, else the host name's address."""
    if os.environ.get(ADDR_VAR):
        return os.environ[ADDR_VAR]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.254.254.254", 1))   # no packet is sent: only picks the route
            return s.getsockname()[0]
    except OSError:
        return _interface_address() or socket.gethostbyname(socket.gethostname())


def _interface_address() -> "str | None":
    """The IPv4 address of the first interface other than loopback that has one."""
    return next((addr for name, addr in _interfaces() if name != "lo"), None)


def _interfaces() -> list:
    """(name, IPv4 address) of this host's interfaces that have one (Linux; else none)."""
    try:
        import fcntl
        import struct

        names = [name for _, name in socket.if_nameindex()]
    except (ImportError, OSError):
        return []
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names:
            try:   # SIOCGIFADDR: the address sits at bytes 20..24 of the ifreq
                ifreq = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            found.append((name, socket.inet_ntoa(ifreq[20:24])))
    return found


def _pin_gloo_interface(rendezvous: str) -> None:
    """Gloo tells its peers the address of this host's name, unless GLOO_SOCKET_IFNAME names an
    interface; where the name resolves to loopback (a common default), peers on other hosts
    cannot connect. Then pin gloo to the interface that routes to the rendezvous address."""
    if os.environ.get("GLOO_SOCKET_IFNAME") or rendezvous.startswith("127."):
        return
    try:
        if not socket.gethostbyname(socket.gethostname()).startswith("127."):
            return
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((rendezvous, 1))   # no packet is sent: only picks the route
            mine = s.getsockname()[0]
    except OSError:
        return
    name = next((name for name, addr in _interfaces() if addr == mine), None)
    if name:
        os.environ["GLOO_SOCKET_IFNAME"] = name


def _timeout() -> datetime.timedelta:
    """The timeout of a gloo group this transport makes: the stall shutdown time (stall.py),
    after which every wait of the group ends (a week for 0, which waits forever elsewhere)."""
    shutdown = stall.Policy.from_env(0.0).shutdown
    return datetime.timedelta(seconds=shutdown if shutdown > 0 else 7 * 24 * 3600)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _first_part(payload: torch.Tensor) -> torch.Tensor:
    """[int64 length | the payload's first EAGER - 8 bytes]."""
    head = torch.empty(8 + min(payload.numel(), EAGER - 8), dtype=torch.uint8)
    head[:8].view(torch.int64)[0] = payload.numel()
    head[8:] = payload[:EAGER - 8]
    return head


class TorchTransport(PointToPoint):
    name = "torch"
    sizes_first = True   # device buffers: each message's size over gloo first (NCCL's need)
    ring_capable = True
    push_tag, pull_tag, step_tag = PUSH_TAG, PULL_TAG, STEP_TAG

    def __init__(self, group, state, members=None):
        """Point to point among the ranks of `group` (runtime.Group): under torch.distributed
        over the group's own gloo group (state.gloo()); under Horovod over a gloo group of
        Horovod's ranks (see the module doc). Or (split) over a new gloo group of the global
        ranks `members`, which this transport owns."""

        import torch.distributed as dist

        self._dist = dist
        self._owned = group is None or group.runtime == "horovod"   # a group it made and destroys
        self._subgroup = members is not None
        if members is not None:
            self._group = dist.new_group(ranks=members, backend="gloo", timeout=_timeout(),
                                         use_local_synchronization=True)
            self._global = list(members)
            rank, size = members.index(dist.get_rank()), len(members)
        elif not self._owned:
            rank, size = group.world()
            self._group = state.gloo()
            members = group.members()
            self._global = list(range(size)) if members is None else members
        elif group.handle is not None:
            raise ValueError("transport 'torch' serves Horovod's global process set only; use "
                             "transport='mpi4py' or 'horovod' with a process set")
        else:
            rank, size = group.world()
            self._group = self._horovod_group(rank, size)
            self._global = list(range(size))
        self._nccl = None   # made at the first device sync (_data_group)
        self._nccl_usable = None   # moves_cuda
        super().__init__(rank, size)
        self.group_hosts(self.allgather_int64(self.host_row(host_key())))
        # At exit too: a gloo thread still alive while the interpreter finalizes can abort
        # the process when it drops its last reference to a tensor.
        atexit.register(self.close)
        atexit.register(self._farewell)

    def _split(self, color, members):
        return TorchTransport(None, None, [self._global[r] for r in members])

    def _farewell(self):
        """At exit: this rank's sync count into the store (see departed)."""
        store = _store() if self._dist.is_initialized() else None
        if store is not None:
            try:
                store.set(_FAREWELL.format(self._global[self.rank]), str(self.syncs))
            except RuntimeError:   # the store's host has gone already
                pass

    def _horovod_group(self, rank, size):
        """A gloo group of Horovod's ranks: beside the application's default group if it has
        one, else the default group, initialised at an address rank 0 broadcasts through
        Horovod."""
        import horovod.torch as hvd

        dist = self._dist
        if dist.is_initialized():
            if (dist.get_rank(), dist.get_world_size()) != (rank, size):
                raise RuntimeError("torch.distributed is initialised with other ranks than Horovod's")
            return dist.new_group(backend="gloo")
        local = hvd.local_size() == size
        info = torch.zeros(5, dtype=torch.int64)
        if rank == 0:
            addr = "127.0.0.1" if local and not os.environ.get(ADDR_VAR) else own_address()
            info[0] = free_port()
            info[1:] = torch.tensor([int(b) for b in socket.inet_aton(socket.gethostbyname(addr))])
        info = hvd.broadcast(info, root_rank=0, name="zen_hvd.torch_transport.rendezvous")
        addr = ".".join(str(int(b)) for b in info[1:])
        _pin_gloo_interface(addr)
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{int(info[0])}",
                                rank=rank, world_size=size, timeout=_timeout())
        return None

    def close(self):
        """Destroy the groups this transport made (the default group, if it initialised
        torch.distributed), so that a later transport can make another."""
        atexit.unregister(self.close)
        atexit.unregister(self._farewell)
        if not self._dist.is_initialized():
            return
        groups = [self._nccl] if self._nccl is not None else []
        for group in groups + ([self._group] if self._owned else []):
            try:
                self._dist.destroy_process_group(group)
            except (RuntimeError, ValueError, AssertionError):   # already gone with its peers
                pass

    def _wait(self, pending, tag=None):
        """Wait for (peer, work) pairs. gloo's point-to-point works complete only in wait(),
        which ends at the group's timeout (the stall shutdown time); a work that fails raises
        naming its peer: StallError when it timed out (the peer is alive but does not send:
        out of step, or stuck), else PeerLostError (the peer closed or reset its connection: it
        died or exited)."""
        for peer, work in pending:
            try:
                work.wait()
            except RuntimeError as e:
                raise self._lost(peer, tag, e) from e

    def _post(self, op, tensor, peer, tag):
        """isend or irecv of `tensor` to or from `peer`: (peer, its work). A connection that
        is already gone fails here rather than in the wait, and raises as there."""
        try:
            return peer, op(tensor, self._global[peer], group=self._group, tag=tag)
        except RuntimeError as e:
            raise self._lost(peer, tag, e) from e

    def _lost(self, peer, tag, e) -> Exception:
        """The error of a failed point-to-point work with `peer` (see _wait); the transport
        is then broken, and the next sync builds a new one."""
        self.broken = True
        if "timed out" in str(e).lower() or "timeout" in str(e).lower():
            return peer_error(
                f"zen_hvd: {self._what(tag)}: gave up waiting for rank {self.name_of(peer)} after the stall "
                "shutdown time (ZEN_HVD_STALL_SHUTDOWN_TIME_SECONDS): a rank is stuck, or the "
                f"ranks are out of step ({e})", stall.StallError)
        left = departed(self._global)
        return peer_error(f"zen_hvd: {self._what(tag)}: transport 'torch' lost rank {self.name_of(peer)}: "
                          + (f"{left} (this rank is in sync {self.syncs})" if left else
                             f"it died or exited ({e})"))

    # -- point to point ------------------------------------------------------------------
    def _exchange(self, sends, tag):
        """sends[r] (a uint8 numpy buffer) goes to rank r; returns the received parts (the part
        from this rank is empty)."""
        me = self.rank
        peers = [r for r in range(self.size) if r != me]
        firsts = {r: self._first_recv(r, tag) for r in peers}
        heads, sent = {}, []   # one first part per distinct buffer (Pull sends one to every peer)
        for r in peers:
            payload = as_tensor(sends[r])
            if id(sends[r]) not in heads:
                heads[id(sends[r])] = _first_part(payload)
            sent += self._send(payload, heads[id(sends[r])], r, tag)
        self._wait([(r, firsts[r][1]) for r in peers], tag)
        parts, rests = [np.zeros(0, np.uint8)] * self.size, []
        for r in peers:
            parts[r] = self._message(firsts[r][0], r, tag, rests)
        self._wait(rests + sent, tag)
        return parts

    def _start_send(self, message, peer, tag):
        payload = as_tensor(message)
        return self._send(payload, _first_part(payload), peer, tag)

    def _receive_from(self, peer, tag, like):
        first, work = self._first_recv(peer, tag)
        self._wait([(peer, work)], tag)
        rests = []
        message = self._message(first, peer, tag, rests)
        self._wait(rests, tag)
        return message

    def _first_recv(self, peer, tag):
        """(buffer, work) receiving a message's first part from peer."""
        first = torch.empty(EAGER, dtype=torch.uint8)
        return first, self._post(self._dist.irecv, first, peer, tag)[1]

    def _send(self, payload, head, peer, tag):
        """The (peer, work) pairs that send one message: its first part `head` (_first_part)
        and, past EAGER bytes, its rest."""
        works = [self._post(self._dist.isend, head, peer, tag)]
        if payload.numel() > EAGER - 8:
            works.append(self._post(self._dist.isend, payload[EAGER - 8:], peer, tag + 1))
        return works

    def _message(self, first, peer, tag, rests):
        """The message whose first part has landed in `first`, as a numpy buffer; the
        (peer, work) receiving its rest, if any, is appended to `rests` (the buffer is full
        once they complete)."""
        length = int(first[:8].view(torch.int64)[0])
        if length <= EAGER - 8:
            return first[8:8 + length].numpy()
        whole = torch.empty(length, dtype=torch.uint8)
        whole[:EAGER - 8] = first[8:]
        rests.append(self._post(self._dist.irecv, whole[EAGER - 8:], peer, tag + 1))
        return whole.numpy()

    # -- device buffers: sizes over gloo, then the data over NCCL ----------------------------
    def moves_cuda(self, device):
        """NCCL moves the device path's buffers, unless two ranks drive one GPU, which NCCL
        refuses: then they are staged through host memory over gloo (and rank 0 says so).
        Decided at the first device sync, which every rank reaches together."""
        if self._nccl_usable is None:
            self._nccl_usable = self._dist.is_nccl_available() and not self._gpu_shared(device)
        return self._nccl_usable

    def _gpu_shared(self, device) -> bool:
        """Whether two ranks of this transport use the same GPU (one host, one device UUID)."""
        if self.size == 1:
            return False
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        digest = hashlib.blake2b(f"{socket.gethostname()}/{uuid}".encode(), digest_size=7).digest()
        mine = int.from_bytes(digest, "little")
        table = self.allgather_int64([mine])[:, 0]
        shared = len(set(table.tolist())) < self.size
        if shared and self.rank == 0:
            log.warning("zen_hvd: ranks of transport 'torch' share a GPU, and NCCL refuses two ranks "
                        "on one device: the device path stages its buffers through host memory "
                        "over gloo")
        return shared

    def _data_group(self, device):
        """The group that moves tensors on `device`: an NCCL group for CUDA (made at the first
        device sync, which every rank reaches together, and warmed with one allreduce so that
        later point-to-point batches need not involve every rank), else the gloo group."""
        if device.type != "cuda":
            return self._group
        if self._nccl is None:
            members = self._global if self._subgroup or not self._owned else None
            self._nccl = self._dist.new_group(ranks=members, backend="nccl",
                                              use_local_synchronization=members is not None)
            self._dist.all_reduce(torch.zeros(1, device=device), group=self._nccl)
        return self._nccl

    def _sizes(self, rows, tag):
        """rows[r] (int64 numpy) goes to peer r over gloo, as [SIZED, *row] on the round's own
        tag; returns the rows received."""
        sends = [np.concatenate([[SIZED], r]).astype(np.int64).view(np.uint8) for r in rows]
        got = self._exchange(sends, tag)
        return [g[8:].view(np.int64) if r == self.rank else self._sized(g, sends[0].size, r)
                for r, g in enumerate(got)]

    def _sized(self, got, want, peer):
        """The row of a size message from `peer`. A peer that sent its round's data from host
        memory (its tensor on the CPU, this rank's on a GPU) sent something else on that tag:
        then this rank raises, and that peer, which received a message too short for what it
        expected, raises too (balanced.py, hierarchical.py), instead of both waiting for
        messages that never come."""
        if got.size != want or int(got[:8].view(np.int64)[0]) != SIZED:
            raise ValueError(f"zen_hvd: tensor {self.activity!r}: rank {self.name_of(peer)} sent it from host "
                             "memory while this rank sends it from the GPU: every rank must hold "
                             "the tensor on the same kind of device")
        return got[8:].view(np.int64)

    @_peer_loss
    def _batch(self, device, sends, recvs):
        """One batch_isend_irecv: sends and recvs are (peer, tensor) pairs, empty ones left out
        (both sides know the sizes)."""
        group, dist = self._data_group(device), self._dist
        ops = [dist.P2POp(dist.isend, t, self._global[r], group=group) for r, t in sends if t.numel()]
        ops += [dist.P2POp(dist.irecv, t, self._global[r], group=group) for r, t in recvs if t.numel()]
        for req in dist.batch_isend_irecv(ops) if ops else []:
            req.wait()

    def _push_device(self, send, send_counts):
        me, peers = self.rank, [r for r in range(self.size) if r != self.rank]
        mine = split(send, send_counts)
        sizes = self._sizes([np.array([c], np.int64) for c in send_counts], PUSH_TAG)
        parts = [mine[me] if r == me else torch.empty(int(sizes[r][0]), dtype=torch.uint8,
                                                      device=send.device) for r in range(self.size)]
        self._batch(send.device, [(r, mine[r]) for r in peers], [(r, parts[r]) for r in peers])
        return parts

    def _pull_joined_device(self, send, body_nbytes):
        me, peers = self.rank, [r for r in range(self.size) if r != self.rank]
        tag = int(send[-8:].cpu().view(torch.int64)[0]) if send.numel() >= 8 else -1
        row = np.array([send.numel(), tag], np.int64)
        rows = self._sizes([row] * self.size, PULL_TAG)
        rows[me] = row
        # Each message splits where pull_joined splits it: [body][pad to 8][tail].
        cut = [body_length(int(n), int(t), body_nbytes) for n, t in rows]
        bodies = torch.empty(sum(cut), dtype=torch.uint8, device=send.device)
        starts = np.cumsum(cut) - cut
        tails = [torch.empty(int(n) - pad8(b), dtype=torch.uint8, device=send.device)
                 for (n, _), b in zip(rows, cut)]
        bodies[starts[me]:starts[me] + cut[me]] = send[:cut[me]]
        tails[me] = send[pad8(cut[me]):]
        ours = [send[:cut[me]], send[pad8(cut[me]):]]
        recvs = []
        for r in peers:
            recvs += [(r, bodies[starts[r]:starts[r] + cut[r]]), (r, tails[r])]
        self._batch(send.device, [(r, t) for r in peers for t in ours], recvs)
        return (bodies, tails), [int(n) for n, _ in rows]

    def _swap_device(self, send, peer, receive, device):
        """One step of a hierarchy in the sized protocol: the size over gloo, then the data."""
        if peer is None:
            return None
        size = None if send is None else np.array([SIZED, send.numel()], np.int64).view(np.uint8)
        got = self._swap(size, peer, receive)
        recv = torch.empty(int(self._sized(got, 16, peer)[0]), dtype=torch.uint8, device=device) \
            if receive else None
        self._batch(device, [(peer, send)] if send is not None else [],
                    [(peer, recv)] if receive else [])
        return recv

    # -- what the baselines use, on the same primitives -----------------------------------
    def _alltoallv(self, send, send_counts, recv_counts):
        return as_tensor(np.concatenate(self._push(send.numpy(), send_counts)))

    def _allgatherv(self, send, recv_counts):
        return as_tensor(np.concatenate(self._to_all(send.numpy(), PULL_TAG)))

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

    def _swap(self, send, peer, receive):
        if peer is None:
            return None
        first = self._first_recv(peer, STEP_TAG) if receive else None
        sent = []
        if send is not None:
            payload = as_tensor(send)   # held by its requests until the sends complete
            sent = self._send(payload, _first_part(payload), peer, STEP_TAG)
        got, rests = None, []
        if receive:
            self._wait([(peer, first[1])], STEP_TAG)
            got = self._message(first[0], peer, STEP_TAG, rests)
        self._wait(rests + sent, STEP_TAG)
        return got
