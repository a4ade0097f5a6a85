"""One-shot centralization (docs/algorithm.md §2): every worker's set goes to every worker.

The allgather of COO sets that Horovod's and DDP's sparse paths use ("agsparse"), built the way
balanced parallelism is: one point-to-point round and at most two passes over the values.
  1. pack (pass 1): the worker writes one message [header][its k positions, index_dtype(M),
     padded to 8][its k x D values, padded to 8] and sends that same message to every peer
     (Transport.push_all, in the Push round: every rank receives every rank's header, so a
     mismatch raises the same error on every rank, as in balanced parallelism's Push);
  2. sum (pass 2), two forms of the result:
     - with repeats (the optimizer's sparse gradient, floating dtypes): every worker's entries
       back to back in rank order, duplicates kept and each row scaled once (prescale x
       postscale x Average's 1/n) as it is copied out of its message. A torch optimizer adds the duplicates as it adds
       Horovod's allgathered gradient: this is Horovod's sparse_allreduce result;
     - otherwise: the union of the positions by a sort and every part added into it in rank
       order 0..n-1 (data_path.add_slots, as balanced parallelism's sparse aggregate), then
       scaled: a coalesced result, bitwise the same on every rank.
Bytes received per worker: sum over the other workers i of |I_i| (i + v) = (n-1) k (i + v).
When the workers' sets barely overlap (gamma_n near n) no scheme receives fewer: equation (2)
of hierarchical centralization with gamma_m = m gives the same bytes in log2 n rounds, this in
one. That is when scheme="auto" picks it (auto.py).
"""
from __future__ import annotations

import numpy as np

from .cuda_kernels import data_path as kernels
from .header import COL, InvalidTensorError, check_table, names_gatherer
from .units import INDEX_OUT_OF_RANGE, OK, sorted_unique
from .wire import index_dtype, pad8, positions_in_range


class OneShotCentralization:
    name = "agsparse"
    code = 3
    device = False
    auto = True
    header_in_push = True

    def sync(self, req, header, ctx, be):
        """One sync of req.tensor on the host (be: backend.HOST); the arguments and the result
        are balanced parallelism's (BalancedParallelism.sync); with req.repeats (and not
        req.ordered) the result keeps every rank's rows, repeated units included (see the
        module doc)."""
        tr, name, layout = ctx.transport, req.name, req.layout
        n, M, D = tr.size, layout.num_units, layout.unit_size
        vdtype, prescale, scale, divisor = req.vdtype, req.prescale, req.scale, req.divisor
        idt = index_dtype(M)
        isz, vsz = idt.itemsize, D * vdtype.itemsize
        src = be.source(req.tensor, layout)
        units, header = src.units, header.copy()
        header[COL["error"]], header[COL["error_detail"]] = src.error, src.detail
        if header[COL["error"]] == OK and units.size and (units.min() < 0 or units.max() >= M):
            bad = units[(units < 0) | (units >= M)][0]
            header[COL["error"]], header[COL["error_detail"]] = INDEX_OUT_OF_RANGE, bad
        k = units.size if header[COL["error"]] == OK else 0
        header[COL["nnz"]] = k

        # 1. pack (pass 1): one message, the same for every peer
        H = header.nbytes
        msg = np.zeros(H + pad8(k * isz) + pad8(k * vsz), np.uint8)
        msg[:H].view(np.int64)[:] = header
        msg[H:H + k * isz].view(idt)[:] = units[:k]
        mine = msg[H + pad8(k * isz):H + pad8(k * isz) + k * vsz].view(vdtype).reshape(k, D)
        if src.dense_src:
            np.take(src.values, units[:k], axis=0, out=mine)
        else:
            mine[:] = src.values[:k]

        # the one round, and the header check
        parts = tr.push_all(msg, control=H)
        short = [r for r, p in enumerate(parts) if p.size < H]
        table = np.stack([p[:H].view(np.int64) if p.size >= H else np.zeros(header.size, np.int64)
                          for p in parts])
        if not short:
            check_table(name, table, req.scheme_names, names_gatherer(tr))
        nnz = table[:, COL["nnz"]]
        wrong = short or [r for r, p in enumerate(parts)
                          if p.size != H + pad8(nnz[r] * isz) + pad8(nnz[r] * vsz)]
        if wrong:
            raise InvalidTensorError(
                f"zen_hvd: tensor {name!r}: the messages of ranks {wrong} do not have the size "
                "their header says (a peer sent a different tensor or a corrupt message)")
        positions = [p[H:H + c * isz].view(idt) for p, c in zip(parts, nnz)]
        outside = [r for r, j in enumerate(positions) if not positions_in_range(j, M)]
        if outside:   # every rank received the same messages, so every rank raises
            raise InvalidTensorError(
                f"zen_hvd: tensor {name!r}: the messages of ranks {outside} hold positions out of "
                f"range for {M} units (a corrupt message)")
        values = [p[H + pad8(c * isz):H + pad8(c * isz) + c * vsz].view(vdtype).reshape(c, D)
                  for p, c in zip(parts, nnz)]

        # 2. sum (pass 2)
        all_units = np.concatenate(positions, dtype=np.int64)
        if req.repeats and not req.ordered and req.out is None and layout.sparse and divisor == 0:
            result = np.empty((all_units.size, D), vdtype)
            factor = prescale * scale
            start = 0
            for v in values:                                    # rank order 0..n-1
                rows = result[start:start + v.shape[0]]
                if factor != 1.0:
                    np.multiply(v, factor, out=rows)
                else:
                    rows[:] = v
                start += v.shape[0]
            info = dict(nnz=nnz.copy(), union_size=int(sorted_unique(all_units).size))
            return all_units, result, info
        union = sorted_unique(all_units)
        acc = np.zeros((union.size, D), vdtype)
        for j, v in zip(positions, values):                      # rank order 0..n-1
            kernels.add_slots(acc, np.searchsorted(union, j), v, prescale)
        kernels.scale_rows(acc, scale, divisor)
        info = dict(nnz=nnz.copy(), union_size=int(union.size))
        if req.out is not None or not layout.sparse:
            target = req.out if req.out is not None else np.zeros((M, D), vdtype)
            kernels.scatter(target, union, acc)
            return None, target, info
        return union, acc, info
