"""Balanced parallelism (docs/algorithm.md §3 and §6): hash-partitioned Push, aggregation, Pull.

Every rank is a worker and a server. With h0 (first-level hash, a keyed bijection pi of the M
units, the same on every rank) unit u belongs to server p = pi(u) mod n at bit j = pi(u) div n.
A sync is two point-to-point rounds and at most three passes over the values
(cuda_kernels/data_path), two when the result may stay in the servers' order:
  1. partition and pack (pass 1): the worker groups its units by server (a fused h0 + counting
     placement on the CPU, hierarchical hashing on the GPU) and writes each server's positions j
     and values straight into that server's part of the Push buffer;
  2. Push (round 1): part p goes to server p, point to point. Every part starts with the
     worker's header (header.py), so every rank holds every rank's header after this round
     and all raise the same error when they disagree; no round is spent on headers or sizes;
  3. aggregate (pass 2): server p builds the hash bitmap of I'_p over I_p from the received
     positions and adds the workers' values in rank order 0..n-1 (so every run computes the
     same bits) straight into the Pull buffer, at each unit's rank in the bitmap; the
     prescale factor rides on this addition, and the postscale factor (Average's 1/n folded
     in) is applied here, once, to server p's 1/n of the union. When the received positions take fewer bytes
     than the bitmap, the union is found by sorting them instead (memory follows nnz, not
     M / n: a 3e9-row table with a thousand non-zeros costs kilobytes);
  4. Pull (round 2, Algorithm 2): server p sends every worker [K x D values][pad to 8]
     [hash bitmap of I'_p, or its K positions when those take fewer bytes][int64 tag =
     2 K + format]; the worker receives each message where its values follow the previous
     server's (Transport.pull_joined), so the K = |I'| values of the result arrive back to
     back, already final;
  5. decode (pass 3 only for an ordered or dense result): bit j of server p is unit
     pi^-1(j n + p). A result in the servers' order (the optimizer's) is the received values
     themselves; an ascending one is one gather; a dense one, one scatter into the output.
Bytes received per worker (data bytes, exact besides <= 7 bytes of alignment padding per part;
the headers are counted as control bytes):
  Push: sum over other workers i of |I_i^p| (index bytes + D value bytes);
  Pull: sum over other servers s of 8 + min(bitmap_nbytes(|I_s|), |I'_s| index bytes)
        + |I'_s| D value bytes,
which is the paper's 2 (n-1)/n (gamma_n + 1) d_G M traffic with the Pull indices replaced by
at most M (n-1) / (8 n) bitmap bytes.

The protocol is written once over a backend (backend.py): numpy and the njit kernels on the
host, torch tensors and the CUDA kernels on the device, the same steps and names. What a rank
receives is checked before any kernel touches it: a Push part's size, its header's counts,
its positions in the server's range and not repeated (a server answers a bad part with a tag
naming its sender, so every rank raises after the Pull); a Pull message's size against its
tag, its bitmap's popcount, its positions ascending and in range.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .cuda_kernels import h0
from .header import COL, COUNTS, InvalidTensorError, check_table, header_nbytes, names_gatherer
from .units import INDEX_OUT_OF_RANGE, OK
from .wire import BITMAP, POSITIONS, index_dtype, pad8

# The Pull tag of a server that cannot aggregate, -2 - w when worker w's Push part does not
# match its header: every rank then raises after the Pull, naming w, rather than the server
# alone in the Push (its peers would wait for its Pull). _UNREADABLE: a Pull message too short
# for a tag.
_UNREADABLE = -1
# The Pull tag of a server whose share failed to sync across hosts (two_level.py): that rank
# raises its own error after the Pull, and the others raise naming it.
_ACROSS_FAILED = -(1 << 62)


def _malformed(worker: int) -> int:
    return -2 - worker


@dataclasses.dataclass
class Servers:
    """h0's partition of M units over n servers: server s holds I_s, size(s) positions j;
    keys: h0's round keys (the same on every rank)."""

    M: int
    n: int
    keys: np.ndarray

    def size(self, s: int) -> int:
        return h0.server_size(self.M, self.n, s)

    def bitmap_nbytes(self, s: int) -> int:
        """Bytes of server s's hash bitmap: one bit per unit of I_s, in whole uint64 words."""
        return (self.size(s) + 63) // 64 * 8

    @property
    def idt(self) -> np.dtype:
        """The dtype of a position on the wire: int32 when every I_s has fewer than 2^31."""
        return index_dtype(self.size(0))


class BalancedParallelism:
    """The protocol above, written once: `be` (backend.py) says where the buffers live and
    which kernels run, numpy and njit on the host, torch tensors and CUDA on the device."""

    name = "balanced"
    code = 0
    device = True
    auto = True
    header_in_push = True

    def sync(self, req, header, ctx, be, across=None, src=None):
        """One sync of req.tensor (req: request.Request; header: this rank's header row, its
        counts still zero). across (two_level.py): between aggregation and Pull, the server's
        aggregated share goes through across(positions, values), which returns the share's
        positions (ascending) and values summed over the hosts, and those are pulled; src: its
        be.source(req.tensor), where the caller has it.
        Returns (units or None, values, info): with req.out (a dense
        [M, D] buffer of the backend, zero outside the union) the result is written there and
        units is None; otherwise values is a new [K, D] buffer of the union's units,
        ascending, or (not req.ordered) in the order the servers sent them, which saves a sort
        and a gather. The units never repeat."""
        tr, layout = ctx.transport, req.layout
        n, me, M, D = tr.size, tr.rank, layout.num_units, layout.unit_size
        servers, vdtype = Servers(M, n, ctx.keys), req.vdtype
        idt = servers.idt
        isz, vsz = idt.itemsize, D * vdtype.itemsize
        if src is None:
            with be.step("units (non-zero rows, or coalesce)"):
                src = be.source(req.tensor, layout)
        header = header.copy()
        header[COL["error"]], header[COL["error_detail"]] = src.error, src.detail

        # 1. partition (Algorithm 1 on the device, h0 + counting placement on the host) and pack
        counts = np.zeros(n, np.int64)
        if header[COL["error"]] == OK and len(src.units):
            with be.step("partition (Algorithm 1)"):
                placement, counts, bad = be.partition(src, servers, h0.second_level_seeds(ctx.seed, me, 3))
            if bad >= 0:
                header[COL["error"]], header[COL["error_detail"]] = INDEX_OUT_OF_RANGE, src.units[bad]
                counts = np.zeros(n, np.int64)
        header[COL["nnz"]] = counts.sum()
        header[COUNTS:] = counts
        H = header.nbytes
        sizes, offs = push_layout(counts, H, isz, vsz)
        with be.step("pack"):
            buf = be.zeros(sizes.sum())
            head = be.constant(header.view(np.uint8))
            for off in offs:
                be.copy(buf[off:off + H], head)
            if counts.sum():
                offsets = ((offs + H) // isz, (offs + H + ((counts * isz + 7) & ~7)) // vdtype.itemsize)
                be.pack(buf, idt, vdtype, offsets, placement, src)

        # 2. Push (round 1), the header check (n headers on the host)
        with be.step("Push"):
            parts = tr.push(buf, sizes, control=H)
        with be.step("header check"):
            sizes_in = [be.nbytes(p) for p in parts]
            heads = be.host([p[:H] for p, size in zip(parts, sizes_in) if size >= H])
            table, short = _header_table(heads, sizes_in, H, header.size)
            check_push(req.name, short)
            check_table(req.name, table, req.scheme_names, names_gatherer(tr))

        # 3. aggregate (pass 2)
        from_worker = table[:, COUNTS + me]                     # |I_i^me| for every worker i
        with be.step("aggregate (bitmap, prefix, rank-order sum, scale)"):
            tag = malformed_push(sizes_in, table, me, H, isz, vsz)
            if tag is None:
                pull, tag = self._aggregate(be, req, servers, parts, from_worker, me)
        failed, host_union = None, 0
        if tag is None and across is not None:
            with be.step("across hosts"):
                host_union = be.ints([be.view(pull[-8:], np.int64)])[0] >> 1
                try:
                    pull = _across(be, req, servers, me, pull, across)
                except Exception as e:   # noqa: BLE001  (raised again after the Pull, below)
                    failed, tag = e, _ACROSS_FAILED
        if tag is not None:   # every rank then raises, from the tags (pull_formats)
            pull = be.constant(np.array([tag], np.int64).view(np.uint8))

        # 4. Pull (round 2): the aggregated values of every server land back to back
        with be.step("Pull"):
            bodies, tails = tr.pull_joined(pull, pull_body_nbytes(vsz))

        if failed is not None:
            raise failed
        sizes = [be.nbytes(t) for t in tails]
        tags = be.ints([be.view(t[-8:], np.int64) if size >= 8 and size % 8 == 0 else _UNREADABLE
                        for t, size in zip(tails, sizes)])
        formats = pull_formats(req.name, servers, tags, sizes, vsz)

        # 5. decode (pass 3: the values are already in place, scaled by their server)
        with be.step("decode (inverse bijection)"):
            all_units, K = _decode(be, req.name, servers, tails, formats)
        values = be.view(bodies, vdtype).reshape(len(all_units), D)
        with be.step("scatter or sort"):
            if req.out is not None or not layout.sparse:
                target = req.out if req.out is not None else be.zeros_rows(M, D, vdtype)
                be.scatter(target, all_units, values)
                units, values = None, target
            elif req.ordered:
                units, values = be.sort_rows(all_units, values)
            else:
                units = all_units
        info = dict(push_counts=table[:, COUNTS:COUNTS + n], pull_counts=np.array(K, np.int64),
                    union_size=int(sum(K)), nnz=table[:, COL["nnz"]], host_union=host_union)
        return units, values, info

    @staticmethod
    def _aggregate(be, req, servers, parts, from_worker, me):
        """(the Pull buffer of server me: [values summed in rank order at their slots, then
        scaled][pad to 8][hash bitmap or positions][int64 tag], None); or (None, the malformed
        tag of the first worker) when a position it sent lies outside I_me or repeats (a
        corrupt Push: the kernels would index with it, or add a value twice)."""
        D, vdtype, idt = req.layout.unit_size, req.vdtype, servers.idt
        isz, vsz, H = idt.itemsize, D * vdtype.itemsize, header_nbytes(servers.n)
        positions, values = [], []
        for b, k in zip(parts, from_worker):
            k = int(k)
            positions.append(be.view(b[H:H + k * isz], idt))
            v0 = H + pad8(k * isz)
            values.append(be.view(b[v0:v0 + k * vsz], vdtype).reshape(k, D))
        nb_bitmap, bound = servers.bitmap_nbytes(me), servers.size(me)
        sparse = nb_bitmap > pad8(sum(len(j) for j in positions) * isz)
        scratch = None if sparse else be.zeros_words(nb_bitmap // 8)
        bad = be.ints([be.count_bad(scratch, j, bound) for j in positions])
        if any(bad):   # a position out of range, or repeated: the kernels would misplace it
            return None, _malformed(int(np.flatnonzero(bad)[0]))
        if sparse:
            # Positions are fewer bytes than the bitmap even before duplicates merge: find the
            # union by sorting them, so memory follows nnz and not M / n.
            union = be.union(positions)
            K = len(union)
            pull, acc, index = _pull_buffer(be, K, pad8(K * isz), POSITIONS, vdtype, D)
            be.copy(be.view(index[:K * isz], idt), union)
            for j, v in zip(positions, values):                # rank order 0..n-1
                be.add_slots(acc, union, j, v, req.prescale)
        else:
            words = scratch                                        # zero again after count_bad
            for j in positions:
                be.set_bits(words, j)
            prefix, total = be.word_prefix(words)
            K = be.ints([total])[0]                                 # K = |I'_me|
            fmt = BITMAP if nb_bitmap <= pad8(K * isz) else POSITIONS
            pull, acc, index = _pull_buffer(be, K, nb_bitmap if fmt == BITMAP else pad8(K * isz), fmt, vdtype, D)
            if fmt == BITMAP:
                be.copy(be.view(index, np.uint64), words)
            else:
                ones = be.empty_units(K)
                be.bitmap_positions(words, prefix, ones)
                be.copy(be.view(index[:K * isz], idt), ones)
            for j, v in zip(positions, values):                    # rank order 0..n-1
                be.add_part(acc, words, prefix, j, v, req.prescale)
        be.scale_rows(acc, req.scale, req.divisor)
        return pull, None


def _across(be, req, servers, me, pull, across):
    """Server me's Pull buffer after across(): its aggregated share (positions j ascending and
    their values, read from the buffer _aggregate made) summed over the hosts, in a new Pull
    buffer of the same format rules (hash bitmap or positions, whichever is smaller)."""
    D, vdtype, idt = req.layout.unit_size, req.vdtype, servers.idt
    K, fmt = divmod(be.ints([be.view(pull[-8:], np.int64)])[0], 2)
    vb = K * D * vdtype.itemsize
    index = pull[pad8(vb):be.nbytes(pull) - 8]
    if fmt == BITMAP:
        words = be.view(index, np.uint64)
        positions = be.empty_units(K)
        be.bitmap_positions(words, be.word_prefix(words)[0], positions)
    else:
        positions = be.view(index[:K * idt.itemsize], idt)
    positions, values = across(positions, be.view(pull[:vb], vdtype).reshape(K, D))
    K, nb_bitmap = len(positions), servers.bitmap_nbytes(me)
    fmt = BITMAP if nb_bitmap <= pad8(K * idt.itemsize) else POSITIONS
    pull, acc, index = _pull_buffer(be, K, nb_bitmap if fmt == BITMAP else pad8(K * idt.itemsize), fmt, vdtype, D)
    be.copy(acc, values)
    if fmt == BITMAP:
        be.set_bits(be.view(index, np.uint64), positions)
    else:
        be.copy(be.view(index[:K * idt.itemsize], idt), positions)
    return pull


def _decode(be, name, servers, tails, formats):
    """(every server's units in server order, K per server), from the Pull tails: the hash
    bitmap or the positions, through the inverse bijection (bit j of server s is unit
    pi^-1(j n + s)). Checked first, with the few integers read in one go: each bitmap's
    popcount against its tag and no bit past |I_s| (a corrupt one could write past its K
    units), and the positions strictly ascending within the server's range, as a server sends
    them (a repeated unit would be added twice)."""
    idt, (tags, K, nbs) = servers.idt, formats
    bitmaps = {s: be.view(tails[s][:nbs[s]], np.uint64) for s, t in enumerate(tags) if t & 1 == BITMAP}
    prefixes = {s: be.word_prefix(w) for s, w in bitmaps.items()}
    positions = {s: be.view(tails[s][:K[s] * idt.itemsize], idt) for s in range(servers.n) if s not in bitmaps}
    outside = [be.outside([j], servers.size(s), ascending=True) for s, j in positions.items()]
    lasts = [w[-1:] if len(w) else 0 for w in bitmaps.values()]
    got = be.ints(outside + [total for _, total in prefixes.values()] + lasts)
    wrong = [s for s, bad in zip(positions, got) if bad]
    for s, found, last in zip(bitmaps, got[len(outside):], got[len(outside) + len(bitmaps):]):
        past = servers.size(s) % 64   # bits of the last word past |I_s| must be clear
        if found != K[s] or (past and (last & ((1 << 64) - 1)) >> past):
            wrong.append(s)
    if wrong:
        raise InvalidTensorError(corrupt_pull(name, sorted(wrong)))
    all_units = be.empty_units(sum(K))
    start = 0
    for s, k in enumerate(K):
        dst = all_units[start:start + k]
        if s in bitmaps:
            be.units_of_bitmap(bitmaps[s], prefixes[s][0], s, servers, dst)
        else:
            be.units_of_positions(positions[s], s, servers, dst)
        start += k
    return all_units, K


def push_layout(counts, H, isz, vsz):
    """(sizes, offsets) of the Push buffer's parts: part p is [header, H bytes][counts[p]
    positions of isz bytes, padded to 8][their values, vsz bytes each, padded to 8]."""
    sizes = H + ((counts * isz + 7) & ~7) + ((counts * vsz + 7) & ~7)
    return sizes, np.cumsum(sizes) - sizes


def check_push(name, short) -> None:
    """Raises when a Push part is too short to hold a header: its sender is not running this
    protocol (a device round's size message, when ranks hold the tensor on different kinds of
    device), and it raises in the same round."""
    if short:
        raise InvalidTensorError(
            f"zen_hvd: tensor {name!r}: ranks {short} sent a Push message too short for a header "
            "(a corrupt message, or a peer running another protocol: does every rank hold the "
            "tensor on the same kind of device?)")


def malformed_push(part_sizes, table, me, H, isz, vsz):
    """The malformed tag of the first worker whose Push part to server `me` is not the size
    its header announces, or whose header's nnz is not the sum of its counts; else None."""
    counts = table[:, COUNTS:]
    expected = push_layout(counts[:, me], H, isz, vsz)[0]
    for w, (size, want) in enumerate(zip(part_sizes, expected)):
        if int(size) != int(want) or table[w, COL["nnz"]] != counts[w].sum():
            return _malformed(w)
    return None


def pull_body_nbytes(vsz):
    """The body length of a Pull message from its tag 2 K + format: K rows of vsz bytes."""
    return lambda tag: (tag >> 1) * vsz if tag >= 0 else 0


def pull_formats(name, servers, tags, tail_sizes, vsz):
    """(tags, K, index bytes) per server from the Pull tags, each checked against its message:
    an InvalidTensorError names the tensor, the servers and the workers when a server could
    not aggregate a Push part, or a message is not the size its tag says."""
    if any(t == _ACROSS_FAILED for t in tags):
        raise InvalidTensorError(
            f"zen_hvd: tensor {name!r}: the sync across hosts of the shares of local ranks "
            f"{[s for s, t in enumerate(tags) if t == _ACROSS_FAILED]} failed (their error names "
            "the cause)")
    if any(t <= -2 for t in tags):
        bad = [s for s, t in enumerate(tags) if t <= -2]
        senders = sorted({-2 - t for t in tags if t <= -2})
        raise InvalidTensorError(
            f"zen_hvd: tensor {name!r}: servers {bad} received a Push message that does not match "
            f"its header from ranks {senders} (its size, or positions outside the server's range: "
            "a peer sent a different tensor or a corrupt message)")
    K, nbs, isz = [t >> 1 for t in tags], [], servers.idt.itemsize
    for s, (t, k, size) in enumerate(zip(tags, K, tail_sizes)):
        nb = servers.bitmap_nbytes(s) if t & 1 == BITMAP else pad8(k * isz)
        if t < 0 or size != nb + 8:
            raise InvalidTensorError(
                f"zen_hvd: tensor {name!r}: the Pull message of server {s} does not have the "
                f"size its tag says ({size} bytes, tag {t})")
        nbs.append(nb)
    return tags, K, nbs


def corrupt_pull(name, servers) -> str:
    return (f"zen_hvd: tensor {name!r}: the Pull message of servers {servers} holds units its tag "
            "does not count, or positions out of order or out of its server's range (a corrupt "
            "message)")


def _pull_buffer(be, K, nb, fmt, vdtype, D):
    """A zeroed Pull buffer for K units: (buffer, its [K, D] values view, its index part)."""
    vb = K * D * vdtype.itemsize
    pull = be.zeros(pad8(vb) + nb + 8)
    be.view(pull[-8:], np.int64)[0] = 2 * K + fmt
    return pull, be.view(pull[:vb], vdtype).reshape(K, D), pull[pad8(vb):pad8(vb) + nb]


def _header_table(heads, sizes, H, width):
    """Every rank's header (heads: the first H bytes of each Push part at least H long, on the
    host), and the ranks whose part is too short to hold one."""
    table = np.zeros((len(sizes), width), np.int64)
    short = [r for r, size in enumerate(sizes) if size < H]
    for r, head in zip([r for r in range(len(sizes)) if r not in short], heads):
        table[r] = head.view(np.int64)
    return table, short
