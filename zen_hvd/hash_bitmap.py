"""The hash bitmap (docs/algorithm.md §5).

Server p owns I_p = {u : h0(u) = p}. With h0 a keyed bijection pi of [0, M) and
p = pi(u) mod n, the unit u sits at bit j = pi(u) div n of server p's bitmap, so |I_p| =
ceil((M - p) / n) bits and bit j decodes to u = pi^-1(j n + p): no table of I_p is kept.
Every worker receives sum_p |I_p| / 8 = M / 8 bytes of bitmaps whatever n is.

Bitmaps are little-endian within a byte (bit j is byte j >> 3, bit j & 7) and padded to a
multiple of 8 bytes so that the values after them stay aligned in the Pull buffer.
"""
from __future__ import annotations

import numba
import numpy as np

_POPCOUNT = np.array([bin(b).count("1") for b in range(256)], dtype=np.int64)


def bitmap_nbytes(nbits: int) -> int:
    """Bytes of a bitmap of nbits bits, padded to 8 bytes."""
    return ((nbits + 63) // 64) * 8


@numba.njit(cache=True)
def encode(positions, nbits):
    """Bitmap with the given bit positions set (positions may repeat)."""
    bitmap = np.zeros(((nbits + 63) // 64) * 8, dtype=np.uint8)
    for j in positions:
        bitmap[j >> 3] |= np.uint8(1 << (j & 7))
    return bitmap


@numba.njit(cache=True)
def rank_in_bitmap(bitmap, positions):
    """For each position (a set bit), how many set bits precede it: its slot among the
    aggregated units, which are kept in bitmap order."""
    prefix = np.empty(bitmap.size, dtype=np.int64)
    total = 0
    for b in range(bitmap.size):
        prefix[b] = total
        total += _POPCOUNT[bitmap[b]]
    out = np.empty(positions.size, dtype=np.int64)
    for i in range(positions.size):
        j = positions[i]
        out[i] = prefix[j >> 3] + _POPCOUNT[bitmap[j >> 3] & ((1 << (j & 7)) - 1)]
    return out


@numba.njit(cache=True)
def decode(bitmap):
    """Ascending positions of the set bits."""
    count = 0
    for b in range(bitmap.size):
        count += _POPCOUNT[bitmap[b]]
    out = np.empty(count, dtype=np.int64)
    k = 0
    for b in range(bitmap.size):
        byte = bitmap[b]
        if byte:
            for bit in range(8):
                if byte & (1 << bit):
                    out[k] = b * 8 + bit
                    k += 1
    return out
