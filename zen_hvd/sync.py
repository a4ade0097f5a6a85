"""sparse_allreduce: one tensor, summed (or averaged) over the ranks of a process set.

    round 1 -> a point-to-point Push in which every part starts with the sender's header
               (header.py): every rank receives every rank's header and checks that all agree.
               Balanced parallelism's Push carries its data in this round; the other schemes
               send the header alone and then run their own pattern;
    scheme  -> every scheme's sync(request, header, ctx, backend) (schemes.py): balanced:
               aggregate, Pull, decode (balanced.py); the others: plan and run (planned.py);
    layout  -> the result in the input's layout: sparse in, coalesced sparse out (or, with
               coalesced=False, the union in the servers' order); dense in, dense out;
               bitwise identical on every rank.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from . import auto, backend, device, ops, runtime, two_level as levels
from .device_hierarchy import SCHEMES as DEVICE_TWINS
from .header import COL, exchange, make_header
from .request import Request
from .schemes import NAMES, SCHEMES  # "auto" resolves to one of SCHEMES per call
from .units import layout_of, sparse_result, widened

last_sync: dict = {}  # what the most recent sync saw: counts, bytes, imbalance (stats.py)


def sparse_allreduce(tensor: torch.Tensor, name: str | None = None, op=None, *,
                     scheme: str = "auto", transport: str | None = None,
                     process_set=None, process_group=None, unit: str | None = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     coalesced: bool = True, two_level=None) -> torch.Tensor:
    """Sum or mean of `tensor` over all ranks, with Zen's scheme choice or the scheme named.

    tensor: torch sparse COO (element or hybrid row-sparse, coalesced or not) or dense.
    name: identifies the tensor across ranks (generated in call order if omitted).
    op: zen_hvd.Average (default, as in hvd.allreduce) or zen_hvd.Sum.
    scheme: "auto" (default: balanced parallelism or hierarchical centralization, chosen per
        tensor name from profiled density and densification, auto.py) or one of SCHEMES.
    transport: "mpi4py", "torch" or "horovod" (default: ZEN_HVD_TRANSPORT, else by launcher).
    process_set: a Horovod ProcessSet, or process_group: a torch.distributed group (default:
        every rank).
    unit: "row" or "element" for dense tensors (default: rows of a 2-D tensor, else elements).
    prescale_factor, postscale_factor: as in hvd.allreduce, every input is multiplied by the
        first before the sum and the result by the second (Average's 1/n on top).
    coalesced: a sparse result with ascending indices (default), or (False) each unit of the
        union once in the order the ranks sent it, marked uncoalesced, as Horovod's sparse
        allreduce returns its result (without its repeated rows): no sort and no gather.
    two_level: "auto", "on" or "off" (default: ZEN_HVD_TWO_LEVEL, else "auto"), where the ranks
        run on several hosts with several ranks each: aggregate inside each host first, the
        scheme across hosts on each share (two_level.py); auto chooses per tensor by the cost
        model. The same on every rank.
    """
    layout, units, values, info = allreduce_units(tensor, name, op, scheme=scheme, transport=transport,
                                                  process_set=process_set,
                                                  process_group=process_group, unit=unit,
                                                  prescale_factor=prescale_factor,
                                                  postscale_factor=postscale_factor,
                                                  ordered=coalesced, two_level=two_level)
    return result(tensor, layout, units, values)


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None = None, op=None, **kwargs):
    """hvd.sparse_allreduce_async's call on Zen's sync: returns a handle whose call returns
    the result, as Horovod's does. The sync runs before it returns (every rank issues its
    syncs in the same order, so none waits on a handle another rank calls later); keyword
    arguments are sparse_allreduce's, coalesced=False by default, as Horovod's result."""
    kwargs.setdefault("coalesced", False)
    out = sparse_allreduce(tensor, name, op, **kwargs)
    return lambda: out


def result(tensor, layout, units, values) -> torch.Tensor:
    """allreduce_units' output in the layout and on the device of its input `tensor`."""
    if layout.sparse:
        out = sparse_result(layout, units, values)
    elif units is None:
        out = values.reshape(layout.shape)
    else:
        out = torch.zeros((layout.num_units, layout.unit_size), dtype=values.dtype, device=values.device)
        if len(units):
            out[torch.as_tensor(units, device=values.device)] = values
        out = out.reshape(layout.shape)
    out = out.to(layout.dtype) if out.dtype != layout.dtype else out
    return out.to(tensor.device) if out.device != tensor.device else out


def allreduce_units(tensor, name=None, op=None, *, scheme="auto", transport=None, process_set=None,
                    process_group=None, unit=None, prescale_factor=1.0, postscale_factor=1.0, out=None, step=None,
                    ordered=True, repeats=False, two_level=None, ctx=None):
    """sparse_allreduce's core: returns (layout, units, values, info). units: the union's
    units (int64 numpy) with values [K, D] (torch), ascending unless not `ordered` (balanced
    parallelism then keeps the servers' order); or None when values is the dense [M, D]
    result. repeats (with not `ordered`): the caller adds rows of a repeated unit, as torch
    adds an uncoalesced gradient, so the one-shot allgather may return every rank's rows
    without merging them (Horovod's sparse allreduce result). out: a dense [M, D] CPU
    tensor, zero outside the union's rows, that receives the result in place (balanced
    parallelism; the other schemes copy into it). step: an optimizer's (step count, whether
    a backward pass preceded it), for the header. two_level: sparse_allreduce's. ctx: the
    runtime.Context to sync in (a level of two_level.py) instead of the group's."""
    average = ops.Average
    op = average if op is None else op
    if op not in (average, ops.Sum):
        raise ValueError(f"op must be zen_hvd.Average or zen_hvd.Sum, not {op!r}")
    if scheme != "auto" and scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}: choose 'auto' or one of {sorted(SCHEMES)}")
    ctx = ctx or runtime.context(transport, process_set, process_group)
    tr = ctx.transport
    name = name if name is not None else f"sparse_allreduce.noname.{next(ctx.state.unnamed)}"
    tr.activity = name
    tr.syncs += 1
    sent, received = tr.stats.bytes_sent, tr.stats.bytes_received
    chosen = auto.choose(ctx.state.profiles, name) if scheme == "auto" else scheme
    layout = layout_of(tensor, unit)
    cpu = tensor.detach()
    # Two levels where the ranks span several hosts of several ranks each, unless the tensor
    # is empty, turned off, or auto's profile prefers the flat sync; or unless the one-shot
    # allgather may return every rank's rows unmerged (repeats), as Horovod's result.
    mode = levels.mode(two_level)
    unmerged = repeats and not ordered and chosen == "agsparse"
    lv = levels.levels(tr) if mode != "off" and layout.num_units and not unmerged else None
    if lv is not None and not (mode == "on" or auto.two_level(ctx.state.profiles, name)):
        lv = None
    # Balanced parallelism (backend.Device) and hierarchical centralization
    # (device_hierarchy.py) keep a CUDA tensor on its device; the baselines, and the host
    # path (the two-level sync's too), work on a host copy.
    stays = layout.num_units > 0 and device.wanted(layout)
    on_device = stays and SCHEMES[chosen].device and lv is None
    cpu = cpu.cpu() if cpu.device.type != "cpu" and not on_device else cpu
    floating = layout.dtype.is_floating_point
    scale = float(postscale_factor) / (tr.size if op == average and floating else 1)
    divisor = tr.size if op == average and not floating else 0
    # A device scheme's kernels run on the tensor's device and stream (device.device_scope).
    scope = device.device_scope(cpu.device) if on_device else contextlib.nullcontext([])
    with scope as outputs:
        if layout.num_units == 0:   # an empty table: the header round alone (the ranks must agree)
            header = make_header(name, layout, op, ctx.seed, SCHEMES[chosen].code,
                                 counts=np.zeros(tr.size, np.int64), step=step)
            table = exchange(name, header, tr, NAMES)
            units, values = np.zeros(0, np.int64), torch.zeros((0, layout.unit_size), dtype=cpu.dtype)
            info = dict(nnz=table[:, COL["nnz"]].copy(), union_size=0)
            if out is not None:
                units, values = None, out
        else:
            impl = DEVICE_TWINS.get(chosen, SCHEMES[chosen]) if on_device else SCHEMES[chosen]
            if lv is not None:   # the scheme (or auto) runs across hosts
                impl = levels.TwoLevel(lv, scheme, scheme == "auto" and auto.next_is_check(ctx.state.profiles, name))
            # float16 and bfloat16 travel and add as float32 in the schemes with their own Push
            t = widened(cpu) if impl.header_in_push else cpu
            be = backend.Device(t.device) if on_device else backend.HOST
            header = make_header(name, layout, op, ctx.seed, impl.code, counts=np.zeros(tr.size, np.int64),
                                 step=step, route=tr.route(t.device) if on_device else 0)
            fits = impl.header_in_push and out is not None and out.dtype == t.dtype and out.device == t.device
            vdtype = backend.numpy_dtype(t.dtype) if impl.header_in_push else None   # numpy has no bfloat16
            req = Request(name, layout, vdtype, NAMES, float(prescale_factor), scale,
                          divisor, ordered, repeats, tensor=t,
                          out=(out if on_device else out.numpy()) if fits else None)
            units, values, info = impl.sync(req, header, ctx, be)
            values = torch.from_numpy(values) if isinstance(values, np.ndarray) else values
            if out is not None:   # the dense result into `out` (written there already if it fits)
                if units is None and not fits:
                    out.copy_(values)
                elif units is not None and len(units):
                    out[torch.as_tensor(units, device=out.device)] = values.to(device=out.device, dtype=out.dtype)
                units, values = None, out
        outputs += [units, values]
    if scheme == "auto" and layout.num_units:
        auto.observe(ctx.state.profiles, name, chosen, layout, info, tr, on_device=stays,
                     levels=levels.levels(tr) if mode == "auto" else None)
    # this sync's data bytes through its transport (headers and counts are control bytes)
    info = dict(info, bytes_sent=tr.stats.bytes_sent - sent, bytes_received=tr.stats.bytes_received - received)
    last_sync.clear()
    last_sync.update(info, name=name, scheme=chosen, n=tr.size, num_units=layout.num_units,
                     unit_size=layout.unit_size)
    return layout, units, values, info
