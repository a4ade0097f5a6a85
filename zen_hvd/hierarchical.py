"""Hierarchical centralization (PAPER.md section 2.3, Theorem 1 and equation (2)).

Hierarchy + incremental aggregation + centralized partition: recursive doubling. At stage i
(i = 1..log2 n) rank r exchanges its whole aggregated set with partner r XOR 2^(i-1) and both
merge the two; after the last stage every rank holds the aggregate of all n ranks. The set a
rank sends at stage i is the union of 2^(i-1) workers' sets, so one worker receives

    T_HC = sum_{i=1..log2 n} gamma_{2^(i-1)} d_G M  units                          (2)

(times the unit's bytes; the paper writes 2 x this for COO index + value). Any n: with
p = 2^floor(log2 n), ranks p..n-1 first fold their set into rank r - p, sit out the stages, and
get the result back at the end (two extra steps of at most |I| units).

Deterministic: both partners call merge(lower-rank group's set, higher-rank group's set), so
they compute the same bits, and by induction every rank ends with bitwise the same tensor.

Wire format of one set: [int64 tag = 4 K + format][index part, padded to 8][values, padded];
formats: positions (COO indices, int32 when M < 2^31), bitmap over [0, M) (M/8 bytes), dense
(all M units' values, no index). Hierarchical centralization sends whichever of positions and
bitmap is smaller; SparCML (baselines.py) sends positions until the merged set would exceed
the dense size, then dense.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .hash_bitmap import bitmap_nbytes, decode, encode
from .units import add_rows, sorted_unique
from .wire import BITMAP, DENSE, POSITIONS, index_dtype, pad8, to_bytes


@dataclasses.dataclass
class Plan:
    """What every non-Balanced scheme needs from the local tensor (the header carries counts)."""

    counts: np.ndarray          # per-destination counts for the header (zeros if unused)
    units: np.ndarray           # unique ascending units
    values: torch.Tensor        # [K, D]
    num_units: int


@dataclasses.dataclass
class UnitSet:
    """An aggregated set: sparse (units ascending, values [K, D]) or dense (values [M, D])."""

    units: np.ndarray | None
    values: torch.Tensor

    @property
    def size(self) -> int:
        return self.values.shape[0] if self.units is None else self.units.size


def merge(lower: UnitSet, higher: UnitSet, M: int) -> UnitSet:
    """lower + higher, lower-rank group's values added first (same bits on both partners)."""
    if lower.units is None or higher.units is None:
        out = lower.values.clone() if lower.units is None else _scatter(lower, M)
        if higher.units is None:
            out += higher.values
        else:
            add_rows(out, higher.units, higher.values)
        return UnitSet(None, out)
    units = sorted_unique(np.concatenate([lower.units, higher.units]))
    out = torch.zeros((units.size, lower.values.shape[1]), dtype=lower.values.dtype)
    add_rows(out, np.searchsorted(units, lower.units), lower.values)
    add_rows(out, np.searchsorted(units, higher.units), higher.values)
    return UnitSet(units, out)


def _scatter(s: UnitSet, M: int) -> torch.Tensor:
    out = torch.zeros((M, s.values.shape[1]), dtype=s.values.dtype)
    if s.units.size:
        out[torch.from_numpy(s.units)] = s.values
    return out


def nonzero_units(dense: torch.Tensor):
    """Units (rows) of a dense [M, D] sum that are not all zero (NaN counts as non-zero)."""
    nz = (dense != 0).any(dim=1)
    units = torch.nonzero(nz).reshape(-1)
    return units.numpy().astype(np.int64), dense.index_select(0, units)


class RecursiveDoubling:
    """The hierarchy shared by hierarchical centralization and SparCML; `choose_format`
    decides how one set travels."""

    name = "hierarchical"

    def plan(self, units, values, layout, transport, seed) -> Plan:
        return Plan(np.zeros(transport.size, np.int64), units, values, layout.num_units)

    def choose_format(self, s: UnitSet, M: int, isz: int, vsz: int) -> int:
        if s.units is None:
            return DENSE
        return BITMAP if bitmap_nbytes(M) < pad8(s.size * isz) else POSITIONS

    # -- one set on the wire ------------------------------------------------------------
    def encode(self, s: UnitSet, M: int) -> torch.Tensor:
        isz = index_dtype(M).itemsize
        vsz = s.values.shape[1] * s.values.element_size()
        fmt = self.choose_format(s, M, isz, vsz)
        if fmt == DENSE and s.units is not None:
            s = UnitSet(None, _scatter(s, M))
        tag = torch.from_numpy(np.array([4 * s.size + fmt], np.int64).view(np.uint8))
        parts = [tag]
        if fmt == POSITIONS:
            parts.append(to_bytes(s.units.astype(index_dtype(M))))
        elif fmt == BITMAP:
            parts.append(to_bytes(encode(s.units, M)))
        parts.append(to_bytes(s.values))
        return torch.cat(parts)

    @staticmethod
    def decode(buf: torch.Tensor, M: int, D: int, dtype) -> UnitSet:
        tag = int(buf[:8].numpy().view(np.int64)[0])
        K, fmt, off = tag >> 2, tag & 3, 8
        units = None
        if fmt == POSITIONS:
            idt = index_dtype(M)
            units = buf[off:off + K * idt.itemsize].numpy().view(idt).astype(np.int64)
            off += pad8(K * idt.itemsize)
        elif fmt == BITMAP:
            nb = bitmap_nbytes(M)
            units = decode(buf[off:off + nb].numpy()).astype(np.int64)
            off += nb
        vsz = D * torch.empty(0, dtype=dtype).element_size()
        values = buf[off:off + K * vsz].view(dtype).reshape(K, D)
        return UnitSet(units, values)

    def exchange(self, s: UnitSet, peer, transport, M, D, dtype, send: bool = True, recv: bool = True):
        """Send s to peer (if send) and receive peer's set (if recv); None if nothing came."""
        payload = self.encode(s, M) if send and peer is not None else torch.zeros(0, dtype=torch.uint8)
        size = torch.from_numpy(np.array([payload.numel()], np.int64).view(np.uint8))
        got = transport.sendrecv(size, peer, 8, control=True)
        n_in = int(got.numpy().view(np.int64)[0]) if recv and peer is not None else 0
        data = transport.sendrecv(payload, peer, n_in)
        return self.decode(data, M, D, dtype) if n_in else None

    # -- the hierarchy ------------------------------------------------------------------
    def run(self, plan: Plan, table, transport):
        n, me, M = transport.size, transport.rank, plan.num_units
        D, dtype = plan.values.shape[1], plan.values.dtype
        p = 1 << (n.bit_length() - 1)
        extra = n - p
        cur = UnitSet(plan.units, plan.values)
        stage_sizes = [cur.size]  # |union| of this rank's group entering each stage
        ex = lambda peer, **kw: self.exchange(cur, peer, transport, M, D, dtype, **kw)  # noqa: E731
        # fold: ranks p..n-1 hand their set to rank - p
        if extra:
            if me >= p:
                ex(me - p, recv=False)
            elif me < extra:
                cur = merge(cur, ex(me + p, send=False), M)
            else:
                ex(None)
            stage_sizes[0] = cur.size
        # recursive doubling among ranks 0..p-1
        step = 1
        while step < p:
            partner = me ^ step if me < p else None
            other = ex(partner)
            if partner is not None:
                cur = merge(cur, other, M) if me < partner else merge(other, cur, M)
            stage_sizes.append(cur.size)
            step <<= 1
        # unfold: the result goes back to ranks p..n-1
        if extra:
            if me < extra:
                ex(me + p, recv=False)
            elif me >= p:
                cur = ex(me - p, send=False)
            else:
                ex(None)
        if cur.units is None:
            units, values = nonzero_units(cur.values)
        else:
            units, values = cur.units, cur.values
        info = dict(stage_sizes=np.array(stage_sizes if me < p else [], np.int64),
                    union_size=int(units.size))
        return units, values, info


class HierarchicalCentralization(RecursiveDoubling):
    """PAPER.md Theorem 1's second optimum: each set travels as positions or as a bitmap over
    [0, M), whichever is smaller."""

    name = "hierarchical"
