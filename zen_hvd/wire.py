"""Wire-format helpers shared by the schemes: how indices and values are laid out in the byte
buffers the transports move.

Every part of a buffer (an index block, a value block, a bitmap) starts at a multiple of 8
bytes, so that a part can be viewed in place as int32/int64/float64 values (torch refuses
misaligned views)."""
from __future__ import annotations

import numpy as np
import torch


def pad8(nbytes: int) -> int:
    """nbytes rounded up to a multiple of 8."""
    return (int(nbytes) + 7) & ~7


def index_dtype(bound: int) -> np.dtype:
    """Indices in [0, bound) travel as int32 when they fit, else int64."""
    return np.dtype(np.int32) if bound <= 2 ** 31 else np.dtype(np.int64)


def to_bytes(array) -> torch.Tensor:
    """A numpy array or torch tensor as uint8, zero-padded to a multiple of 8 bytes."""
    t = torch.from_numpy(np.ascontiguousarray(array).view(np.uint8)) if isinstance(array, np.ndarray) \
        else array.contiguous().view(-1).view(torch.uint8)
    pad = pad8(t.numel()) - t.numel()
    return torch.cat([t, torch.zeros(pad, dtype=torch.uint8)]) if pad else t
