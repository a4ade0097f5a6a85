"""The three passes over the values of one balanced-parallelism sync (CPU kernels, njit).

    1. pack       worker: partition by h0 and write (position, values) straight into the Push
                  buffer's part for each server; duplicates of an uncoalesced input summed here;
    2. aggregate  server: the hash bitmap of I'_p from the received positions, then every part's
                  values added, in rank order 0..n-1, straight into the Pull buffer at the unit's
                  rank in the bitmap (its slot); or, for parts far sparser than the bitmap,
                  the slots from a sort of the positions (add_slots);
    3. scatter    worker: each server's aggregated values, times the postscale factor, straight
                  into the output rows.
Everything else touches indices only. Values are addressed through flat typed views of the
byte buffers (element offsets), so the kernels serve every dtype numba computes with.

Bitmaps are uint64 words: bit j is word j >> 6, bit j & 63 (on a little-endian machine, bit
j & 7 of byte j >> 3).
"""
import numba
import numpy as np

from .h0 import _permute_one_cpu, _unpermute_one_cpu

_M1, _M2, _M4 = np.uint64(0x5555555555555555), np.uint64(0x3333333333333333), np.uint64(0x0F0F0F0F0F0F0F0F)
_H01, _ONE = np.uint64(0x0101010101010101), np.uint64(1)


@numba.njit(cache=True, nogil=True)
def popcount64(x):
    """Set bits of a uint64 (SWAR)."""
    x = x - ((x >> _ONE) & _M1)
    x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
    x = (x + (x >> np.uint64(4))) & _M4
    return np.int64((x * _H01) >> np.uint64(56))


# ---- 1. pack (worker) ----------------------------------------------------------------------

@numba.njit(cache=True, nogil=True)
def partition(units, M, B, n, keys, unique):
    """Per input entry i: server part[i] = pi(u) mod n, bit pos[i] = pi(u) div n, and its row
    local[i] in that server's part; counts[p] = distinct units for server p. Entries with the
    same unit (unique=False) share a row, so pack sums them. Returns (part, local, pos, counts,
    bad): bad is the first entry whose unit is outside [0, M), or -1."""
    nnz = units.size
    part = np.empty(nnz, np.int64)
    local = np.empty(nnz, np.int64)
    pos = np.empty(nnz, np.int64)
    counts = np.zeros(n, np.int64)
    cap = 1
    if not unique:
        while cap < 2 * nnz:
            cap <<= 1
    table = np.full(cap if not unique else 1, -1, np.int64)  # open addressing: unit -> entry
    for i in range(nnz):
        u = units[i]
        if u < 0 or u >= M:
            return part, local, pos, counts, i
        if not unique:
            h = (u * 0x5851F42D4C957F2D) & (cap - 1)
            while table[h] >= 0 and units[table[h]] != u:
                h = (h + 1) & (cap - 1)
            first = table[h]
            if first >= 0:
                part[i], local[i], pos[i] = part[first], local[first], pos[first]
                continue
            table[h] = i
        y = _permute_one_cpu(u, M, B, keys)
        p = y % n
        part[i], pos[i], local[i] = p, y // n, counts[p]
        counts[p] += 1
    return part, local, pos, counts, -1


@numba.njit(cache=True, nogil=True)
def pack(idx_view, val_view, idx_off, val_off, part, local, pos, units, values, dense_src, unique):
    """Push buffer: server p's positions at idx_view[idx_off[p] + row], its values at
    val_view[val_off[p] + row * D]. Entry i's values are values[units[i]] (a dense table,
    dense_src) or values[i]. The buffer starts zeroed; duplicates are added in input order."""
    D = values.shape[1]
    for i in range(part.size):
        p, row = part[i], local[i]
        idx_view[idx_off[p] + row] = pos[i]
        src = units[i] if dense_src else i
        base = val_off[p] + row * D
        if unique:
            for d in range(D):
                val_view[base + d] = values[src, d]
        else:
            for d in range(D):
                val_view[base + d] += values[src, d]


# ---- 2. aggregate (server) -----------------------------------------------------------------

@numba.njit(cache=True, nogil=True)
def set_bits(words, positions):
    """Bitmap |= the given positions (which may repeat)."""
    for j in positions:
        words[j >> 6] |= _ONE << np.uint64(j & 63)


@numba.njit(cache=True, nogil=True)
def count_bad(words, positions, bound):
    """How many of a received part's positions lie outside [0, bound) or repeat an earlier one
    (a sender writes each unit once): each marks its bit in `words`, zero on entry and cleared
    again before returning."""
    bad = 0
    for j in positions:
        if j < 0 or j >= bound:
            bad += 1
            continue
        bit = _ONE << np.uint64(j & 63)
        if words[j >> 6] & bit:
            bad += 1
        words[j >> 6] |= bit
    for j in positions:
        if 0 <= j < bound:
            words[j >> 6] &= ~(_ONE << np.uint64(j & 63))
    return bad


@numba.njit(cache=True, nogil=True)
def word_prefix(words):
    """Exclusive prefix sum of the words' popcounts, and the total: a set bit's slot is
    prefix[j >> 6] + popcount of the bits below it in its word."""
    prefix = np.empty(words.size, np.int64)
    total = 0
    for w in range(words.size):
        prefix[w] = total
        total += popcount64(words[w])
    return prefix, total


@numba.njit(cache=True, nogil=True)
def bitmap_positions(words, out):
    """The set bits' positions, ascending, into out (as many as are set)."""
    k = 0
    for w in range(words.size):
        x = words[w]
        b = 0
        while x:
            if x & _ONE:
                out[k] = (w << 6) + b
                k += 1
            x >>= _ONE
            b += 1


@numba.njit(cache=True, nogil=True)
def add_part(acc, words, prefix, positions, values, prescale):
    """acc[slot(j)] += prescale * values[i] for the i-th received position j (one worker's
    part; called for the workers in rank order, so every run adds in the same order)."""
    for i in range(positions.size):
        j = positions[i]
        w = j >> 6
        below = words[w] & ((_ONE << np.uint64(j & 63)) - _ONE)
        _add_row(acc, prefix[w] + popcount64(below), values, i, prescale)


@numba.njit(cache=True, nogil=True, inline="always")
def _add_row(acc, slot, values, i, prescale):
    """acc[slot] += prescale * values[i], the product in float64 rounded once to acc's dtype
    (integers too: an int64 row cannot take a float64 row in place)."""
    if prescale == 1.0:
        acc[slot] += values[i]
    else:
        for d in range(acc.shape[1]):
            acc[slot, d] = np.float64(acc[slot, d]) + prescale * np.float64(values[i, d])


@numba.njit(cache=True, nogil=True)
def add_slots(acc, slots, values, prescale):
    """acc[slots[i]] += prescale * values[i]: add_part when the slots are known (the union of
    positions found by a sort, for parts far sparser than the bitmap)."""
    for i in range(slots.size):
        _add_row(acc, slots[i], values, i, prescale)


@numba.njit(cache=True, nogil=True)
def scale_rows(acc, scale, divisor):
    """The aggregate's last step, in place: acc * scale (floats; nothing when 1) or acc / divisor
    truncated toward zero (integers averaged: divisor > 0). Done once by the server, on 1/n
    of the union, so that the workers receive the result itself."""
    K, D = acc.shape
    if divisor > 0:
        for i in range(K):
            for d in range(D):
                v = acc[i, d]
                q = abs(v) // divisor
                acc[i, d] = q if v >= 0 else -q
    elif scale != 1.0:
        for i in range(K):
            for d in range(D):
                acc[i, d] = acc[i, d] * scale


# ---- 3. decode and scatter (worker) --------------------------------------------------------

@numba.njit(cache=True, nogil=True)
def units_of_bitmap(words, p, n, M, B, keys, out):
    """Bit j of server p is unit pi^-1(j n + p) (Section 3.3), ascending j, into out."""
    k = 0
    for w in range(words.size):
        x = words[w]
        b = 0
        while x:
            if x & _ONE:
                out[k] = _unpermute_one_cpu(((w << 6) + b) * n + p, M, B, keys)
                k += 1
            x >>= _ONE
            b += 1


@numba.njit(cache=True, nogil=True)
def units_of_positions(positions, p, n, M, B, keys, out):
    for i in range(positions.size):
        out[i] = _unpermute_one_cpu(np.int64(positions[i]) * n + p, M, B, keys)


@numba.njit(cache=True, nogil=True)
def scatter(out, rows, values):
    """out[rows[i]] = values[i]: the received rows into a dense output (already scaled by
    their server, scale_rows)."""
    D = values.shape[1]
    for i in range(rows.size):
        r = rows[i]
        for d in range(D):
            out[r, d] = values[i, d]
