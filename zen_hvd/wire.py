"""Wire-format helpers shared by the schemes: how indices and values are laid out in the byte
buffers the transports move.

A COO part is [k indices, padded][k x W values, padded]; a buffer is parts back to back
(one per destination rank for an alltoallv).

Every part of a buffer (an index block, a value block, a bitmap) starts at a multiple of 8
bytes, so that a part can be viewed in place as int32/int64/float64 values (torch refuses
misaligned views)."""
from __future__ import annotations

import numpy as np
import torch

from .mpi.transport import pad8  # noqa: F401  (nbytes rounded up to a multiple of 8)


# How a set of units travels: its positions (COO indices), a bitmap, or dense (all units'
# values, no index). One numbering for every scheme's tag.
POSITIONS, BITMAP, DENSE = 0, 1, 2


def index_dtype(bound: int) -> np.dtype:
    """Indices in [0, bound) travel as int32 when they fit, else int64."""
    return np.dtype(np.int32) if bound <= 2 ** 31 else np.dtype(np.int64)


def bitmap_nbytes(nbits: int) -> int:
    """Bytes of a bitmap of nbits bits, in whole uint64 words (bit j is word j >> 6, bit
    j & 63: little-endian bytes, bit j & 7 of byte j >> 3), so that what follows it in a
    message stays aligned."""
    return ((nbits + 63) // 64) * 8


def part_nbytes(k: int, isz: int, vsz: int) -> int:
    """Bytes of one COO part: k indices of isz bytes and k rows of vsz bytes, each padded."""
    return pad8(int(k) * isz) + pad8(int(k) * vsz)


def pack(parts, idx_dtype) -> tuple:
    """parts: [(indices numpy [k], values torch [k, W])] -> (one uint8 buffer, bytes per part).
    One allocation; each index and value block is copied once."""
    idx_dtype = np.dtype(idx_dtype)
    counts = [part_nbytes(i.size, idx_dtype.itemsize, v.shape[1] * v.element_size())
              for i, v in parts]
    buf = torch.zeros(sum(counts), dtype=torch.uint8)
    off = 0
    for (idx, vals), c in zip(parts, counts):
        ib = torch.from_numpy(np.ascontiguousarray(idx, dtype=idx_dtype).view(np.uint8))
        vb = vals.contiguous().view(-1).view(torch.uint8)
        buf[off:off + ib.numel()] = ib
        buf[off + pad8(ib.numel()):off + pad8(ib.numel()) + vb.numel()] = vb
        off += c
    return buf, counts


def unpack(buf, ks, idx_dtype, W, dtype) -> list:
    """Inverse of pack, given the number of indices per part and W values per index:
    [(int64 indices, values viewed in place [k, W])]."""
    idx_dtype = np.dtype(idx_dtype)
    out, off = [], 0
    isz, vsz = idx_dtype.itemsize, W * torch.empty(0, dtype=dtype).element_size()
    for k in ks:
        k = int(k)
        idx = buf[off:off + k * isz].numpy().view(idx_dtype).astype(np.int64)
        off += pad8(k * isz)
        out.append((idx, buf[off:off + k * vsz].view(dtype).reshape(k, W)))
        off += pad8(k * vsz)
    return out


def positions_in_range(positions, bound: int, ascending: bool = False) -> bool:
    """Whether received positions (a peer's) all lie in [0, bound), and (ascending) rise
    strictly, as a sender writes a set's positions: checked before a kernel indexes with them
    (numpy; the device path checks on the device, check_positions_kernel)."""
    if positions.size == 0:
        return True
    if ascending and positions.size > 1 and not bool((positions[1:] > positions[:-1]).all()):
        return False
    return int(positions.min()) >= 0 and int(positions.max()) < bound


def bitmap_holds(words: np.ndarray, count: int, nbits: int) -> bool:
    """Whether a received bitmap (uint64 words over nbits bits) has exactly `count` bits set
    and none at or past nbits: a decoder writes one unit per set bit into `count` slots."""
    if int(np.bitwise_count(words).sum()) != count:
        return False
    tail = nbits % 64
    return not (tail and words.size and int(words[-1]) >> tail)
