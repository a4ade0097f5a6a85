"""The header every rank sends before a sync: what it is about to synchronize.

A fixed row of int64s per rank: the tensor's name, shape, dtype, layout, unit size, op, seed
and scheme, whether an optimizer's gradient is new since its last step (and that optimizer's
step count, for the error), any local input error, and how many units it will push to each
server (the Push counts). It travels at the start of every part of the sync's first
point-to-point round (balanced parallelism's and one-shot's Push, or a Push of the header
alone for the other schemes), so every rank holds every rank's header after that round and
checks the same table: a mismatch or a bad input on any rank raises the same error on every
rank instead of a hang or a silently wrong sum.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from . import ops
from .units import BAD_LAYOUT, INDEX_OUT_OF_RANGE, OK, Layout

VERSION = 3
MAX_DIMS = 8
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
          torch.int64, torch.int16, torch.int8, torch.uint8)
FIELDS = ("version", "name", "ndim", *(f"dim{i}" for i in range(MAX_DIMS)), "dtype", "sparse",
          "sparse_dim", "unit_size", "op", "seed", "scheme", "fresh", "route", "error", "error_detail", "nnz", "step")
COL = {f: i for i, f in enumerate(FIELDS)}
COUNTS = len(FIELDS)  # the Push counts (one per server) follow the fixed fields
# "fresh": an optimizer's sync says 1 when a backward pass or zero_grad() reached the optimizer
# since its last step, 0 when its gradient is the one that step synchronized already (step()
# called again without either); a direct sync says DIRECT. Equal on every rank unless one rank
# runs an extra step, which pairs with the others' next step.
DIRECT = -1
# "route": 1 when this rank's messages of the tensor take a transport's device route with its
# own protocol (the torch transport's sized rounds, for a tensor on the GPU), else 0. Ranks that
# differ would wait for messages the others never send.


class TensorMismatchError(ValueError):
    """Ranks disagree about a tensor they synchronize together."""


class InvalidTensorError(ValueError):
    """A rank's tensor cannot be synchronized (for example an index out of range)."""


def name_code(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") >> 1


def make_header(name: str, layout: Layout, op: int, seed: int, scheme: int, *, counts,
                error: int = OK, error_detail: int = 0, nnz: int = 0, step=None,
                route: int = 0) -> np.ndarray:
    """One rank's header row. step: None for a direct sync, else an optimizer's
    (step count, whether its gradient is fresh). route: see "route" above."""
    if len(layout.shape) > MAX_DIMS:
        raise ValueError(f"tensor {name!r}: at most {MAX_DIMS} dimensions are supported")
    if layout.dtype not in DTYPES:
        raise TypeError(f"tensor {name!r}: dtype {layout.dtype} is not supported")
    row = np.zeros(COUNTS + len(counts), dtype=np.int64)
    dims = list(layout.shape) + [0] * (MAX_DIMS - len(layout.shape))
    values = dict(version=VERSION, name=name_code(name), ndim=len(layout.shape),
                  dtype=DTYPES.index(layout.dtype), sparse=int(layout.sparse),
                  sparse_dim=layout.sparse_dim, unit_size=layout.unit_size, op=int(op),
                  seed=seed, scheme=scheme, route=route, error=error, error_detail=error_detail, nnz=nnz,
                  fresh=DIRECT if step is None else int(bool(step[1])),
                  step=0 if step is None else step[0],
                  **{f"dim{i}": d for i, d in enumerate(dims)})
    for f, v in values.items():
        row[COL[f]] = v
    row[COUNTS:] = counts
    return row


def exchange(name: str, header: np.ndarray, tr, scheme_names) -> np.ndarray:
    """Round 1 without data: every rank's header, on every rank (a Push of the header alone),
    checked. The same round as balanced parallelism's Push, so ranks that disagree about the
    scheme still meet in it and raise the same error."""
    H = header.nbytes
    parts = tr.push(np.tile(header.view(np.uint8), tr.size), [H] * tr.size, control=H)
    if any(p.size != H for p in parts):
        sizes = [p.size for p in parts]
        table = np.stack([p[:H].view(np.int64) for p in parts if p.size >= H])
        check_table(name, table, scheme_names)   # raises if a balanced peer is the cause
        bad = [r for r, size in enumerate(sizes) if size != H]
        raise InvalidTensorError(
            f"zen_hvd: tensor {name!r}: ranks {bad} sent header messages of "
            f"{[sizes[r] for r in bad]} bytes, {H} expected (a corrupt message)")
    table = np.stack([p.view(np.int64) for p in parts])
    check_table(name, table, scheme_names, names_gatherer(tr))
    return table


def header_nbytes(n: int) -> int:
    """Bytes of a header row among n ranks (the fixed fields, then n Push counts)."""
    return 8 * (COUNTS + n)


def _dtype_name(code) -> str:
    return str(DTYPES[code]) if 0 <= code < len(DTYPES) else f"dtype code {code}"


def _shape(row) -> tuple:
    return tuple(int(d) for d in row[COL["dim0"]:COL["dim0"] + row[COL["ndim"]]])


def names_gatherer(tr):
    """Every rank's tensor name through `tr` (an allgather; for the name-mismatch error only)."""
    def gather(name):
        mine = torch.tensor(list(name.encode()), dtype=torch.uint8)
        recv, counts = tr.allgatherv(mine)
        raw = recv.numpy().tobytes()
        ends = np.cumsum(counts)
        return [raw[end - c:end].decode(errors="replace") for c, end in zip(counts, ends)]
    return gather


def check_table(name: str, table: np.ndarray, scheme_names=None, gather_names=None) -> None:
    """Raise the same error on every rank if the ranks' headers disagree or report bad input.
    gather_names(name) -> every rank's name: a collective, called only when names differ and
    the ranks agree on the scheme (so that all of them are on this same path), to name each
    rank's tensor in the error."""
    agreed = table[:, :COL["error"]]          # every field that must be equal on all ranks
    if (agreed == agreed[0]).all() and not table[:, COL["error"]].any():
        return                                # the common case: one comparison
    def differs(cols):
        return bool((table[:, cols] != table[0, cols]).any())

    def per_rank(describe):
        return ", ".join(f"rank {r}: {describe(row)}" for r, row in enumerate(table))

    where = f"zen_hvd: tensor {name!r}"
    if differs([COL["name"]]):
        if gather_names is not None and not differs([COL["version"], COL["scheme"]]):
            which = ", ".join(f"rank {r}: {other!r}" for r, other in enumerate(gather_names(name)))
        else:
            which = f"this rank's is {name!r}"
        raise TensorMismatchError(
            f"{where}: ranks are synchronizing different tensors at this call (names differ; "
            f"{which}). Call sparse_allreduce for the same tensors in the same "
            "order on every rank, or pass matching name= arguments.")
    if differs([COL["version"]]):
        raise TensorMismatchError(f"{where}: ranks run different zen_hvd versions")
    if differs([COL["fresh"]]):
        def sync_kind(row):
            fresh = row[COL["fresh"]]
            return ("a direct sparse_allreduce" if fresh == DIRECT else
                    f"optimizer step {row[COL['step']]} with "
                    + ("a new gradient" if fresh else "its last step's gradient again (no "
                       "backward pass or zero_grad() since)"))
        raise TensorMismatchError(
            f"{where}: ranks are out of step ({per_rank(sync_kind)}): a rank that calls "
            "optimizer.step() again without a backward pass would add its old gradient to "
            "the others' new ones. Call backward() and step() the same number of times on "
            "every rank.")
    shape_cols = [COL["ndim"]] + [COL[f"dim{i}"] for i in range(MAX_DIMS)]
    if differs(shape_cols):
        raise TensorMismatchError(f"{where}: shape differs across ranks ("
                                  + per_rank(lambda row: str(_shape(row)))
                                  + ")")
    if differs([COL["dtype"]]):
        raise TensorMismatchError(f"{where}: dtype differs across ranks ("
                                  + per_rank(lambda row: _dtype_name(row[COL["dtype"]])) + ")")
    if differs([COL["sparse"], COL["sparse_dim"], COL["unit_size"]]):
        raise TensorMismatchError(
            f"{where}: layout or unit size differs across ranks ("
            + per_rank(lambda row: f"{'sparse' if row[COL['sparse']] else 'dense'}, "
                                   f"sparse_dim {row[COL['sparse_dim']]}, unit size {row[COL['unit_size']]}")
            + ")")
    if differs([COL["op"]]):
        raise TensorMismatchError(f"{where}: reduction op differs across ranks ("
                                  + per_rank(lambda row: ops.name(row[COL["op"]])) + ")")
    if differs([COL["seed"]]):
        raise TensorMismatchError(
            f"{where}: the partition hash seed differs across ranks ("
            + per_rank(lambda row: hex(row[COL["seed"]])) + "); set ZEN_HVD_SEED to the same "
            "value on every rank or leave it unset so that rank 0's seed is broadcast")
    if differs([COL["scheme"]]):
        names = scheme_names or {}
        raise TensorMismatchError(f"{where}: scheme differs across ranks ("
                                  + per_rank(lambda row: names.get(row[COL["scheme"]], str(row[COL["scheme"]])))
                                  + ")")
    if differs([COL["route"]]):
        raise TensorMismatchError(
            f"{where}: ranks hold the tensor on different kinds of device ("
            + per_rank(lambda row: "GPU" if row[COL["route"]] else "host") + "), which the "
            "transport's device route cannot mix: every rank must hold the tensor on the same "
            "kind of device")
    for r, row in enumerate(table):
        if row[COL["error"]] == INDEX_OUT_OF_RANGE:
            raise InvalidTensorError(
                f"{where}: rank {r} has a sparse index out of range (index {row[COL['error_detail']]} "
                f"for shape {_shape(row)})")
        if row[COL["error"]] == BAD_LAYOUT:
            raise InvalidTensorError(f"{where}: rank {r} passed a tensor layout that cannot be synchronized")
