"""One gradient through Zen: what zen_hvd.DistributedOptimizer and the DDP hook (ddp.py) both do.

    by rows   a parameter's gradient whose rows are mostly zero (an embedding's): torch sparse,
              or dense with the rows that hold a non-zero (or the rows an embedding looked up)
              sent as row units; a dense CPU gradient is synchronized in place;
    by DGC    a bucket of dense gradients, its top few percent with error feedback (dgc.py),
              sent as element units; the result is the bucket's flat dense gradient.
Every call is a collective: every rank calls it for the same gradient at the same point.
kw: sparse_allreduce's keywords (name, op, scheme, transport, process_set or process_group,
prescale_factor, postscale_factor, step).
"""
from __future__ import annotations

import torch

from .sync import allreduce_units, result
from .units import nonzero_rows


def row_sparse(grad, like: torch.Tensor, rows=None) -> torch.Tensor:
    """What a sync by rows sends for a parameter `like`: its sparse gradient as it is, an empty
    one for no gradient, or a dense gradient's rows `rows` (default: those holding a
    non-zero) as a coalesced row-sparse tensor."""
    if grad is None:
        return torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64, device=like.device),
                                       like.detach().new_zeros((0,) + tuple(like.shape[1:])),
                                       tuple(like.shape))
    if grad.is_sparse and grad.sparse_dim() == 1:
        return grad
    grad = grad.to_dense() if grad.is_sparse else grad
    rows = nonzero_rows(grad) if rows is None else rows
    return torch.sparse_coo_tensor(rows.reshape(1, -1), grad.index_select(0, rows), tuple(like.shape),
                                   is_coalesced=True, check_invariants=False)


def sync_rows(grad, like: torch.Tensor, rows=None, repeats: bool = True, **kw):
    """A parameter's gradient synchronized by rows. Returns (synchronized gradient, info): None
    when `grad` was a dense contiguous CPU gradient synchronized in place (the rows holding a
    non-zero travel; the result lands in it without another copy), else a sparse tensor whose
    rows are in the servers' order, marked uncoalesced as Horovod's sparse result is (an
    optimizer adds its rows all the same). repeats: the caller adds repeated rows (the result
    stays sparse), so the one-shot allgather may return every rank's rows unmerged."""
    if grad is not None and not grad.is_sparse and rows is None and grad.device.type == "cpu" \
            and grad.is_contiguous() and grad.dim() >= 1:
        _, _, _, info = allreduce_units(grad, unit="row", out=grad.view(grad.shape[0], -1), **kw)
        return None, info
    sent = row_sparse(grad, like, rows)
    layout, units, values, info = allreduce_units(sent, ordered=False, repeats=repeats, **kw)
    return result(sent, layout, units, values), info


def sync_dgc(bucket, flat: torch.Tensor, size: int, **kw):
    """A DGC bucket's gradient `flat` (its parameters' gradients back to back) compressed
    (dgc.Bucket.compress: accumulate, select the top few percent, clear what is sent) and
    synchronized by elements. Returns (the bucket's synchronized flat dense gradient, info)."""
    _, units, values, info = allreduce_units(bucket.compress(flat, size), **kw)
    return bucket.dense(units, values), info
