"""sparse_allreduce: one tensor, summed (or averaged) over the ranks of a process set.

    header  -> one small allgather: every rank checks that all agree (header.py)
    scheme  -> plan (local), then run (Push / aggregate / Pull for balanced parallelism)
    layout  -> the result in the input's layout: sparse in, coalesced sparse out; dense in,
               dense out; bitwise identical on every rank.
"""
from __future__ import annotations

import itertools

import numpy as np
import torch

from . import auto, runtime
from .balanced import BalancedParallelism
from .baselines import SCHEMES as BASELINES
from .hierarchical import HierarchicalCentralization
from .header import COL, check_table, make_header
from .units import OK, from_units, layout_of, to_units

# Concrete schemes (their order is the header code); "auto" resolves to one of them per call.
SCHEMES = {"balanced": BalancedParallelism(), "hierarchical": HierarchicalCentralization(), **BASELINES}
_noname = itertools.count()
last_sync: dict = {}  # what the most recent sync saw: counts, bytes, imbalance (stats.py)


def _op_codes():
    import horovod.torch as hvd

    return hvd.Average, hvd.Sum


def sparse_allreduce(tensor: torch.Tensor, name: str | None = None, op=None, *,
                     scheme: str = "auto", transport: str | None = None,
                     process_set=None, unit: str | None = None) -> torch.Tensor:
    """Sum or mean of `tensor` over all ranks, with Zen's scheme choice or the scheme named.

    tensor: torch sparse COO (element or hybrid row-sparse) or dense.
    name: identifies the tensor across ranks (generated in call order if omitted).
    op: zen_hvd.Average (default, as in hvd.allreduce) or zen_hvd.Sum.
    scheme: "auto" (default: balanced parallelism or hierarchical centralization, chosen per
        tensor name from profiled density and densification, auto.py) or one of SCHEMES.
    transport: "mpi4py" or "horovod" (default: ZEN_HVD_TRANSPORT, else by launcher).
    process_set: a Horovod ProcessSet (default: all ranks).
    unit: "row" or "element" for dense tensors (default: rows of a 2-D tensor, else elements).
    """
    average, total = _op_codes()
    op = average if op is None else op
    if op not in (average, total):
        raise ValueError(f"op must be zen_hvd.Average or zen_hvd.Sum, not {op!r}")
    if scheme != "auto" and scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}: choose 'auto' or one of {sorted(SCHEMES)}")
    tr = runtime.get_transport(transport, process_set)
    seed = runtime.get_seed(tr, process_set)
    name = name if name is not None else f"sparse_allreduce.noname.{next(_noname)}"
    chosen = auto.choose(name) if scheme == "auto" else scheme
    device = tensor.device
    layout = layout_of(tensor, unit)
    units, values, error, detail = to_units(tensor.detach().cpu(), layout)
    impl = SCHEMES[chosen]
    plan = impl.plan(units, values, layout, tr, seed) if error == OK else None
    counts = plan.counts if plan is not None else np.zeros(tr.size, np.int64)
    header = make_header(name, layout, op, seed, list(SCHEMES).index(chosen), error, detail,
                         0 if units is None else units.size, counts)
    table = tr.allgather_int64(header)
    check_table(name, table, dict(enumerate(SCHEMES)))
    out_units, out_values, info = impl.run(plan, table, tr)
    if scheme == "auto":
        auto.observe(name, chosen, layout, table, info, tr)
    if op == average:
        out_values = (out_values.div(tr.size) if out_values.is_floating_point()
                      else out_values.div(tr.size, rounding_mode="trunc"))
    last_sync.clear()
    last_sync.update(info, name=name, scheme=chosen, n=tr.size, num_units=layout.num_units,
                     unit_size=layout.unit_size, nnz=table[:, COL["nnz"]].copy())
    return from_units(layout, out_units, out_values).to(device)
