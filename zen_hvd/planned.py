"""The schemes that plan from the local tensor before any message: hierarchical
centralization, SparCML, dense AllReduce, the sparse parameter server and OmniReduce.

Their sync (the one call every scheme takes, sync(request, header, ctx, backend)):
  1. the tensor's unique ascending units and values (backend.units_of);
  2. plan: what the scheme sends (its Push counts, for the header);
  3. the header round: a Push of the header alone (header.exchange), so that every rank
     checks every rank's header before the scheme's own pattern starts;
  4. run: the scheme's pattern; the result sorted ascending when it is not;
  5. the request's factors (prescale, then scale or divisor) applied to the result in one pass.
A subclass provides plan(units, values, layout, transport, seed) and run(plan, table,
transport); its device twin (device_hierarchy.py) runs the same on device tensors.
"""
from __future__ import annotations

import torch

from .header import COL, COUNTS, exchange
from .units import OK, ascending_order, take_units


class Planned:
    header_in_push = False

    def sync(self, req, header, ctx, be):
        """(units, values, info) of the request (see the module doc): units ascending (int64
        numpy, or a device tensor), values [K, D] torch on the tensor's device."""
        tr, layout = ctx.transport, req.layout
        units, values, error, detail = be.units_of(req.tensor, layout)
        plan = self.plan(units, values, layout, tr, ctx.seed) if error == OK else None
        if plan is not None:
            plan.name = req.name
        header = header.copy()
        header[COL["error"]], header[COL["error_detail"]] = error, detail
        header[COL["nnz"]] = 0 if units is None else len(units)
        if plan is not None:
            header[COUNTS:] = plan.counts
        table = exchange(req.name, header, tr, req.scheme_names)
        units, values, info = self.run(plan, table, tr)
        info = dict(info, nnz=table[:, COL["nnz"]].copy())
        if len(units) > 1 and not bool((units[1:] > units[:-1]).all()):
            if isinstance(units, torch.Tensor):
                units, order = torch.sort(units)
                values = values[order]
            else:
                order = ascending_order(units)
                units, values = units[order], take_units(values, order)
        return units, _scaled(values, req), info


def _scaled(values, req):
    """The request's factors on a result: floats in one pass (prescale x scale, Average's 1/n
    folded in, as balanced parallelism's scale); integers as Horovod scales them: prescale,
    the truncating division by the divisor, then the postscale (req.scale)."""
    if values.dtype.is_floating_point:
        factor = req.prescale * req.scale
        return values * factor if factor != 1.0 else values
    values = values * req.prescale if req.prescale != 1.0 else values
    values = values.div(req.divisor, rounding_mode="trunc") if req.divisor else values
    return values * req.scale if req.scale != 1.0 else values

