"""Units: what one index addresses (DESIGN.md data path, step 1).

A gradient becomes a set of (unit index, unit values):
- a sparse COO tensor: unit = its (linearized) sparse index, D = product of its dense dims, so
  an embedding gradient with sparse_dim=1 travels by rows (one index per row of D values) and an
  element-sparse tensor by elements;
- a dense 2-D tensor (an embedding table): unit = row, D = columns; the units sent are the rows
  holding any non-zero (NaN and Inf count as non-zero, so they propagate like a dense sum);
- any other dense tensor: unit = element of the flattened tensor.
`unit="row"` or `unit="element"` overrides the dense rule.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

# Dtypes numba does not compute with: they travel and add as float32, cast back at the end.
WIDENED = (torch.float16, torch.bfloat16)

# Local input problems, sent in the header so that every rank raises the same error.
OK, INDEX_OUT_OF_RANGE, BAD_LAYOUT = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a tensor maps to units; must agree on every rank."""

    shape: tuple
    dtype: torch.dtype
    sparse: bool          # sparse COO in, sparse COO out
    sparse_dim: int       # dims folded into the unit index
    num_units: int        # M
    unit_size: int        # D: values per unit
    device_type: str = "cpu"  # where the input lives ("cuda": partition with the GPU kernel)


def layout_of(tensor: torch.Tensor, unit: str | None = None) -> Layout:
    shape = tuple(tensor.shape)
    if tensor.layout == torch.sparse_coo:
        sparse_dim = tensor.sparse_dim()
    elif tensor.layout != torch.strided:
        raise TypeError(f"unsupported tensor layout {tensor.layout}: use a dense or sparse COO tensor")
    elif unit == "row" or (unit is None and tensor.dim() == 2):
        sparse_dim = min(1, tensor.dim())
    elif unit in (None, "element"):
        sparse_dim = tensor.dim()
    else:
        raise ValueError(f"unit must be 'row', 'element' or None, not {unit!r}")
    return Layout(shape, tensor.dtype, tensor.layout == torch.sparse_coo, sparse_dim,
                  math.prod(shape[:sparse_dim]), math.prod(shape[sparse_dim:]), tensor.device.type)


@dataclasses.dataclass
class Source:
    """A rank's gradient as the data path reads it, without copying values: entry i is unit
    units[i] with values values[units[i]] (a dense [M, D] table: dense_src) or values[i]
    (a sparse tensor's values). Units may repeat unless `unique` (an uncoalesced tensor)."""

    units: np.ndarray           # int64 [nnz]
    values: np.ndarray          # [nnz or M, D]
    dense_src: bool
    unique: bool
    error: int = OK
    detail: int = 0


def source(tensor: torch.Tensor, layout: Layout) -> Source:
    """The Source of a CPU tensor in `layout` (dtype one numpy computes with). Out-of-range
    indices of a one-dimensional sparse index are left for the partition kernel to find."""
    M, D = layout.num_units, layout.unit_size
    if layout.sparse:
        idx, values = tensor._indices(), tensor._values().reshape(-1, D)
        if layout.sparse_dim == 1:
            units = idx[0].numpy()
        elif idx.numel() and (bool((idx < 0).any()) or bool(
                (idx >= torch.tensor(layout.shape[:layout.sparse_dim]).unsqueeze(1)).any())):
            bad = _first_out_of_range(idx, layout.shape[:layout.sparse_dim])
            return Source(np.zeros(0, np.int64), values.numpy(), False, True, INDEX_OUT_OF_RANGE, bad)
        else:
            units = _linearize(idx, layout.shape[:layout.sparse_dim])
        return Source(units, values.contiguous().numpy(), False, tensor.is_coalesced())
    flat = tensor.reshape(M, D)
    return Source(nonzero_rows(flat).numpy(), flat.contiguous().numpy(), True, True)


def nonzero_rows(t: torch.Tensor) -> torch.Tensor:
    """The rows of t (dim 0; the rest of each row flattened) that hold a non-zero (NaN
    counts), as an ascending int64 tensor on t's device: a dense table's units."""
    row = math.prod(t.shape[1:])
    if t.shape[0] == 0 or row == 0:
        return torch.zeros(0, dtype=torch.int64, device=t.device)
    nz = t.reshape(t.shape[0], row).ne(0)
    return torch.nonzero(nz.any(dim=1) if row != 1 else nz[:, 0]).reshape(-1)


def widened(tensor: torch.Tensor) -> torch.Tensor:
    """tensor as float32 when its dtype is one of WIDENED, else tensor itself."""
    return tensor.float() if tensor.dtype in WIDENED else tensor


def sparse_result(layout: Layout, units: np.ndarray, values: torch.Tensor) -> torch.Tensor:
    """A sparse tensor of unique units and their [K, D] values: coalesced when the units are
    ascending, else marked uncoalesced (as Horovod's sparse allreduce returns its result)."""
    indices = _delinearize(units, layout.shape[:layout.sparse_dim])
    values = values.reshape((len(units),) + tuple(layout.shape[layout.sparse_dim:]))
    ascending = len(units) < 2 or bool((units[1:] > units[:-1]).all())
    return torch.sparse_coo_tensor(indices, values, layout.shape, is_coalesced=ascending,
                                   check_invariants=False)


def to_units(tensor: torch.Tensor, layout: Layout):
    """Returns (units int64 numpy [nnz], values torch [nnz, D], error code, error detail).

    Units are unique (duplicates of an uncoalesced sparse tensor are summed) and ascending."""
    M, D = layout.num_units, layout.unit_size
    if layout.sparse:
        idx = tensor._indices()
        if idx.numel() and (bool((idx < 0).any()) or bool(
                (idx >= torch.tensor(layout.shape[:layout.sparse_dim]).unsqueeze(1)).any())):
            bad = _first_out_of_range(idx, layout.shape[:layout.sparse_dim])
            return None, None, INDEX_OUT_OF_RANGE, bad
        t = tensor if tensor.is_coalesced() else tensor.coalesce()  # sums duplicates
        units = _linearize(t.indices(), layout.shape[:layout.sparse_dim])
        values = t.values().reshape(-1, D)
    else:
        flat = tensor.detach().reshape(M, D)
        units_t = nonzero_rows(flat)
        units = units_t.cpu().numpy()
        values = flat.index_select(0, units_t)
    return np.ascontiguousarray(units, dtype=np.int64), values.contiguous(), OK, 0


def sorted_unique(a: np.ndarray, return_inverse: bool = False):
    """np.unique for int64 arrays via sort and a mask: numpy 2.x's hash-based np.unique takes
    hundreds of milliseconds on a few hundred thousand integers, a sort takes a few."""
    a = np.asarray(a, dtype=np.int64).reshape(-1)
    already = a.size < 2 or bool((a[1:] >= a[:-1]).all())
    order = None if already or not return_inverse else np.argsort(a, kind="stable")
    s = a if already else (a[order] if order is not None else np.sort(a))
    first = np.empty(s.size, dtype=bool)
    first[:1] = True
    np.not_equal(s[1:], s[:-1], out=first[1:])
    if not return_inverse:
        return s[first]
    inverse_sorted = np.cumsum(first) - 1
    inverse = inverse_sorted if order is None else np.empty_like(inverse_sorted)
    if order is not None:
        inverse[order] = inverse_sorted
    return s[first], inverse


def take_units(values: torch.Tensor, order: np.ndarray) -> torch.Tensor:
    """values[order] for [nnz, D] values (a 1-D gather when D == 1: several times faster)."""
    if order.size == 0:
        return values[:0]
    idx = torch.from_numpy(order)
    if values.shape[1] == 1:
        return values.reshape(-1).index_select(0, idx).reshape(-1, 1)
    return values.index_select(0, idx)


def add_rows(out: torch.Tensor, rows: np.ndarray, values: torch.Tensor) -> None:
    """out[rows] += values for unique rows of [K, D] tensors (a 1-D index_add when D == 1,
    several times faster)."""
    idx = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
    if out.shape[1] == 1:
        out.view(-1).index_add_(0, idx, values.reshape(-1))
    else:
        out.index_add_(0, idx, values)


def ascending_order(units: np.ndarray) -> np.ndarray:
    """argsort of unique units. When unit and position fit together in 63 bits, sorting the
    packed keys (unit << b | position) is several times faster than an argsort."""
    b = max(1, int(units.size - 1).bit_length())
    if units.size == 0 or int(units.max()) >= 1 << (63 - b):
        return np.argsort(units)
    packed = np.sort((units << b) | np.arange(units.size, dtype=np.int64))
    return packed & ((1 << b) - 1)


def _linearize(indices: torch.Tensor, dims) -> np.ndarray:
    idx = indices.numpy().astype(np.int64, copy=False)
    units = np.zeros(idx.shape[1], dtype=np.int64)
    for d, size in enumerate(dims):
        units = units * size + idx[d]
    return units


def _delinearize(units, dims) -> torch.Tensor:
    """[len(dims), K] indices of K linear units (numpy, or a torch tensor on any device)."""
    units = torch.from_numpy(units) if isinstance(units, np.ndarray) else units
    if len(dims) == 1:
        return units.reshape(1, -1)
    rows, rest = [], units
    for size in reversed(dims):
        rows.append(rest % size)
        rest = rest // size
    rows.reverse()
    return torch.stack(rows) if rows else torch.zeros((0, units.numel()), dtype=torch.int64,
                                                      device=units.device)


def _first_out_of_range(idx: torch.Tensor, dims) -> int:
    bound = torch.tensor(dims).unsqueeze(1)
    bad = ((idx < 0) | (idx >= bound)).any(dim=0)
    col = int(torch.nonzero(bad)[0, 0])
    return int(idx[:, col][((idx[:, col] < 0) | (idx[:, col] >= bound[:, 0]))][0])
