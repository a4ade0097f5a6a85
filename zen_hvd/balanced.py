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
"""
from __future__ import annotations

import os

import numpy as np

from .cuda_kernels import data_path as kernels
from .cuda_kernels import h0, hierarchical_hashing
from .header import COL, COUNTS, InvalidTensorError, check_table, names_gatherer
from .units import INDEX_OUT_OF_RANGE, OK, sorted_unique
from .wire import BITMAP, POSITIONS, bitmap_holds, index_dtype, pad8, positions_in_range

_MALFORMED = -1  # Pull tag of a server that received a Push part of the wrong size


def partitioner(layout) -> str:
    """"gpu" (hierarchical hashing kernel) or "cpu" (fused h0 + counting placement):
    ZEN_HVD_PARTITIONER if set, else where the tensor lives. Both give the same units per
    server."""
    choice = os.environ.get("ZEN_HVD_PARTITIONER") or ("gpu" if layout.device_type == "cuda" else "cpu")
    if choice not in ("gpu", "cpu"):
        raise ValueError(f"ZEN_HVD_PARTITIONER must be 'gpu' or 'cpu', not {choice!r}")
    return choice


def _partition(src, layout, n, seed, rank, keys):
    """(part, local, pos, counts, bad) per input entry, as kernels.partition returns them."""
    M = layout.num_units
    if partitioner(layout) == "cpu":
        return kernels.partition(src.units, M, h0.domain_bits(M), n, keys, src.unique)
    # Algorithm 1 on the GPU (or the CUDA simulator); it takes unique units in range.
    units = src.units
    if units.size and (units.min() < 0 or units.max() >= M):
        bad = int(np.flatnonzero((units < 0) | (units >= M))[0])
        return None, None, None, np.zeros(n, np.int64), bad
    uniq, inverse = (units, None) if src.unique else np.unique(units, return_inverse=True)
    order, counts, pos = hierarchical_hashing.group_by_partition_gpu(
        uniq, M, n, keys, h0.second_level_seeds(seed, rank, 3))
    starts = np.cumsum(counts) - counts
    server = np.repeat(np.arange(n), counts)
    part, local, upos = (np.empty(uniq.size, np.int64) for _ in range(3))
    part[order], local[order], upos[order] = server, np.arange(order.size) - starts[server], pos
    if inverse is not None:
        part, local, upos = part[inverse], local[inverse], upos[inverse]
    return part, local, upos, np.asarray(counts, np.int64), -1


class BalancedParallelism:
    name = "balanced"

    def sync(self, name, src, layout, header, ctx, scheme_names, vdtype, prescale, scale, divisor,
             out=None, ordered=True, repeats=False):
        """One sync of a Source. Returns (units or None, values, info): with `out` (a dense
        [M, D] numpy array, zero outside the union) the result is written there and units is
        None; otherwise values is a new [K, D] array of the union's units, ascending, or (not
        `ordered`) in the order the servers sent them, which saves a sort and a gather. The
        units never repeat, whatever `repeats` allows."""
        tr, keys = ctx.transport, ctx.keys
        n, me, M, D = tr.size, tr.rank, layout.num_units, layout.unit_size
        idt = index_dtype(h0.server_size(M, n, 0))
        isz, vsz = idt.itemsize, D * vdtype.itemsize

        # 1. partition and pack (pass 1)
        counts = np.zeros(n, np.int64)
        if header[COL["error"]] == OK:
            part, local, pos, counts, bad = _partition(src, layout, n, ctx.seed, me, keys)
            if bad >= 0:
                header[COL["error"]], header[COL["error_detail"]] = INDEX_OUT_OF_RANGE, src.units[bad]
                counts = np.zeros(n, np.int64)
        header[COL["nnz"]] = counts.sum()
        header[COUNTS:] = counts
        H = header.nbytes
        sizes, offs = push_layout(counts, H, isz, vsz)
        buf = np.zeros(int(sizes.sum()), np.uint8)
        for off in offs:
            buf[off:off + H].view(np.int64)[:] = header
        if counts.sum():
            idx_off = (offs + H) // isz
            val_off = (offs + H + ((counts * isz + 7) & ~7)) // vdtype.itemsize
            kernels.pack(buf.view(idt), buf.view(vdtype), idx_off, val_off, part, local, pos,
                         src.units, src.values, src.dense_src, src.unique)

        # 2. Push (round 1), the header check
        parts = tr.push(buf, sizes, control=H)
        table, short = _header_table(parts, H, header.size)
        check_push(name, short)
        check_table(name, table, scheme_names, names_gatherer(tr))

        # 3. aggregate (pass 2)
        from_worker = table[:, COUNTS + me]                     # |I_i^me| for every worker i
        pull = None if malformed_push([p.size for p in parts], from_worker, H, isz, vsz) else \
            self._aggregate(parts, from_worker, H, idt, vdtype, D, M, n, me, prescale, scale, divisor)
        if pull is None:   # every rank then raises, from the tag (pull_formats)
            pull = np.array([_MALFORMED], np.int64).view(np.uint8)

        # 4. Pull (round 2): the aggregated values of every server land back to back
        bodies, tails = tr.pull_joined(pull, pull_body_nbytes(vsz))
        tags = [int(t[-8:].view(np.int64)[0]) if t.size >= 8 else _MALFORMED for t in tails]
        K, nbs = pull_formats(name, tags, [t.size for t in tails], M, n, isz, vsz)

        # 5. decode (pass 3: the values are already in place, scaled by their server)
        check_pull(name, tails, tags, K, nbs, M, n, idt)
        B = h0.domain_bits(M)
        all_units = np.empty(sum(K), np.int64)
        start = 0
        for s, (tail, t, k, nb) in enumerate(zip(tails, tags, K, nbs)):
            dst = all_units[start:start + k]
            if t & 1 == BITMAP:
                kernels.units_of_bitmap(tail[:nb].view(np.uint64), s, n, M, B, keys, dst)
            else:
                kernels.units_of_positions(tail[:k * isz].view(idt), s, n, M, B, keys, dst)
            start += k
        values = bodies.view(vdtype).reshape(all_units.size, D)
        if out is not None or not layout.sparse:
            target, units = out if out is not None else np.zeros((M, D), vdtype), None
            kernels.scatter(target, all_units, values)
        elif not ordered:
            target, units = values, all_units
        else:
            order = np.argsort(all_units)
            target, units = np.take(values, order, axis=0), all_units[order]
        info = dict(push_counts=table[:, COUNTS:COUNTS + n], pull_counts=np.array(K, np.int64),
                    union_size=int(all_units.size),
                    nnz=table[:, COL["nnz"]])
        return units, target, info

    @staticmethod
    def _aggregate(parts, from_worker, H, idt, vdtype, D, M, n, me, prescale, scale, divisor):
        """The Pull buffer of server me: [values summed in rank order at their slots, then
        scaled][pad to 8][hash bitmap or positions][int64 tag]; None when a received position
        lies outside I_me (a corrupt Push: the kernels would index with it)."""
        isz, vsz = idt.itemsize, D * vdtype.itemsize
        positions, values = [], []
        for b, k in zip(parts, from_worker):
            positions.append(b[H:H + k * isz].view(idt))
            v0 = H + pad8(k * isz)
            values.append(b[v0:v0 + k * vsz].view(vdtype).reshape(k, D))
        if not all(positions_in_range(j, h0.server_size(M, n, me)) for j in positions):
            return None
        nb_bitmap = bitmap_nbytes(M, n, me)
        if nb_bitmap > pad8(sum(j.size for j in positions) * isz):
            # Positions are fewer bytes than the bitmap even before duplicates merge: find the
            # union by sorting them, so memory follows nnz and not M / n.
            return _aggregate_sorted(positions, values, idt, vdtype, D, prescale, scale, divisor)
        words = np.zeros(nb_bitmap // 8, np.uint64)
        for j in positions:
            kernels.set_bits(words, j)
        prefix, K = kernels.word_prefix(words)                 # K = |I'_me|
        fmt = BITMAP if words.nbytes <= pad8(K * isz) else POSITIONS
        nb = words.nbytes if fmt == BITMAP else pad8(K * isz)
        pull, acc, index = _pull_buffer(K, nb, fmt, vdtype, D)
        if fmt == BITMAP:
            index.view(np.uint64)[:] = words
        else:
            tmp = np.empty(K, np.int64)
            kernels.bitmap_positions(words, tmp)
            index[:K * isz].view(idt)[:] = tmp
        for j, v in zip(positions, values):                    # rank order 0..n-1
            kernels.add_part(acc, words, prefix, j, v, prescale)
        kernels.scale_rows(acc, scale, divisor)
        return pull


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
            "(a peer running another protocol: does every rank hold the tensor on the same kind "
            "of device?)")


def malformed_push(part_sizes, from_worker, H, isz, vsz) -> bool:
    """Whether a received Push part is not the size its header announces for this server
    (then the server answers with the _MALFORMED tag, so that every rank raises)."""
    expected = push_layout(np.asarray(from_worker, np.int64), H, isz, vsz)[0]
    return any(int(s) != int(e) for s, e in zip(part_sizes, expected))


def pull_body_nbytes(vsz):
    """The body length of a Pull message from its tag 2 K + format: K rows of vsz bytes."""
    return lambda tag: (tag >> 1) * vsz if tag >= 0 else 0


def pull_formats(name, tags, tail_sizes, M, n, isz, vsz):
    """(K, index bytes) per server from the Pull tags, each checked against its message: an
    InvalidTensorError names the tensor when a server saw a malformed Push or a message is
    not the size its tag says."""
    if _MALFORMED in tags:
        bad = [s for s, t in enumerate(tags) if t == _MALFORMED]
        raise InvalidTensorError(
            f"zen_hvd: tensor {name!r}: servers {bad} received a Push message that does not match "
            "its header (its size, or positions outside the server's range: a peer sent a "
            "different tensor or a corrupt message)")
    K, nbs = [t >> 1 for t in tags], []
    for s, (t, k, size) in enumerate(zip(tags, K, tail_sizes)):
        nb = bitmap_nbytes(M, n, s) if t & 1 == BITMAP else pad8(k * isz)
        if size != nb + 8:
            raise InvalidTensorError(
                f"zen_hvd: tensor {name!r}: the Pull message of server {s} does not have the "
                f"size its tag says ({k} units: {pad8(k * vsz) + nb + 8} bytes)")
        nbs.append(nb)
    return K, nbs


def check_pull(name, tails, tags, K, nbs, M, n, idt) -> None:
    """Raises InvalidTensorError (on every rank: all receive the same Pull messages) unless
    every server's index part fits its tag: a bitmap with exactly K bits set and none past
    |I_s|, or K positions within I_s. Checked before the decoders write one unit per entry."""
    wrong = []
    for s, (tail, t, k, nb) in enumerate(zip(tails, tags, K, nbs)):
        bits = h0.server_size(M, n, s)
        ok = bitmap_holds(tail[:nb].view(np.uint64), k, bits) if t & 1 == BITMAP else \
            positions_in_range(tail[:k * idt.itemsize].view(idt), bits)
        if not ok:
            wrong.append(s)
    if wrong:
        raise InvalidTensorError(corrupt_pull(name, wrong))


def corrupt_pull(name, servers) -> str:
    return (f"zen_hvd: tensor {name!r}: the Pull message of servers {servers} holds units its tag "
            "does not count, or positions out of its server's range (a corrupt message)")


def bitmap_nbytes(M, n, s) -> int:
    """Bytes of server s's hash bitmap: one bit per unit of I_s, in whole uint64 words."""
    return (h0.server_size(M, n, s) + 63) // 64 * 8


def _pull_buffer(K, nb, fmt, vdtype, D):
    """A zeroed Pull buffer for K units: (buffer, its [K, D] values view, its index part)."""
    vb = K * D * vdtype.itemsize
    pull = np.zeros(pad8(vb) + nb + 8, np.uint8)
    pull[-8:].view(np.int64)[0] = 2 * K + fmt
    return pull, pull[:vb].view(vdtype).reshape(K, D), pull[pad8(vb):pad8(vb) + nb]


def _aggregate_sorted(positions, values, idt, vdtype, D, prescale, scale, divisor):
    """The Pull buffer in the positions format, the union found by a sort: O(nnz) memory."""
    union = sorted_unique(np.concatenate(positions)) if positions else np.zeros(0, np.int64)
    K, isz = union.size, idt.itemsize
    pull, acc, index = _pull_buffer(K, pad8(K * isz), POSITIONS, vdtype, D)
    index[:K * isz].view(idt)[:] = union
    kernels.sum_sorted(acc, union, positions, values, prescale, scale, divisor)
    return pull


def _header_table(parts, H, width):
    """Every rank's header, from the first H bytes of its Push part, and the ranks whose part
    is too short to hold one."""
    table = np.zeros((len(parts), width), np.int64)
    short = [r for r, p in enumerate(parts) if p.size < H]
    for r, p in enumerate(parts):
        if r not in short:
            table[r] = p[:H].view(np.int64)
    return table, short
