"""Helpers shared by the multi-rank case scripts (run from this folder, so importable as
`common`)."""
import hashlib

import numpy as np
import torch


def digest(t: torch.Tensor) -> int:
    """A 56-bit hash of a tensor's bytes (indices and values for a sparse tensor, in their
    stored order: an uncoalesced result must be the same on every rank too)."""
    h = hashlib.blake2b(digest_size=7)
    if t.is_sparse:
        h.update(t._indices().numpy().tobytes())
        t = t._values()
    h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return int.from_bytes(h.digest(), "little")


def same_on_all_ranks(transport, *values) -> bool:
    table = transport.allgather_int64(list(values))
    return bool((table == table[0]).all())


def make_sparse(units, values, shape):
    """Row-sparse hybrid tensor (2-D shape, D values per unit) or element-sparse tensor."""
    if len(shape) == 2 and values.shape[1] == shape[1]:
        return torch.sparse_coo_tensor(torch.from_numpy(units).reshape(1, -1), torch.from_numpy(values), shape,
                                       check_invariants=True)
    idx = torch.from_numpy(np.stack(np.unravel_index(units, shape)) if units.size
                           else np.zeros((len(shape), 0), np.int64))
    return torch.sparse_coo_tensor(idx, torch.from_numpy(values[:, 0]), shape, check_invariants=True)
