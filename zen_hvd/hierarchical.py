"""Hierarchical centralization (docs/algorithm.md §2, equation (2)).

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

A stage is one point-to-point message each way (the receiver learns its size from the
message), and one pass over the values: the merge (cuda_kernels/merge.py) writes the union
straight from the received message into the next stage's set; the set is written once into
the next message.

Wire format of one set: [int64 tag = 4 K + format][index part, padded to 8][values, padded];
formats: positions (COO indices, int32 when M < 2^31), bitmap over [0, M) (uint64 words,
bit u of word u >> 6), dense (all M units' values, no index). Hierarchical centralization
sends whichever of positions and bitmap is smaller; SparCML (baselines.py) sends positions
until the merged set would exceed the dense size, then dense. float16 and bfloat16 values
travel and add as float32 (numba has no arithmetic for them), as in balanced parallelism.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .cuda_kernels import data_path, merge as kernels
from .header import InvalidTensorError
from .planned import Planned
from .units import nonzero_rows, widened
from .wire import BITMAP, DENSE, POSITIONS, bitmap_holds, bitmap_nbytes, index_dtype, pad8, positions_in_range


@dataclasses.dataclass
class Plan:
    """What every non-Balanced scheme needs from the local tensor (the header carries counts)."""

    counts: np.ndarray          # per-destination counts for the header (zeros if unused)
    units: np.ndarray           # unique ascending units
    values: torch.Tensor        # [K, D]
    num_units: int
    name: str = ""              # the tensor's name, for errors


@dataclasses.dataclass
class UnitSet:
    """An aggregated set: sparse (units ascending int64, values [K, D]) or dense (units None,
    values [M, D]); numpy arrays (torch tensors on the device path, device_hierarchy.py)."""

    units: np.ndarray | None
    values: np.ndarray

    @property
    def size(self) -> int:
        return self.values.shape[0] if self.units is None else len(self.units)


def merge(lower: UnitSet, higher: UnitSet, M: int) -> UnitSet:
    """lower + higher in one pass over the values (both partners call it alike)."""
    if lower.units is not None and higher.units is not None:
        return UnitSet(*kernels.merge_sorted(lower.units, lower.values, higher.units, higher.values))
    out = lower.values.copy() if lower.units is None else dense_of(lower, M)
    if higher.units is None:
        out += higher.values
    else:
        kernels.add_rows(out, higher.units, higher.values)
    return UnitSet(None, out)


def dense_of(s: UnitSet, M: int) -> np.ndarray:
    out = np.zeros((M, s.values.shape[1]), s.values.dtype)
    kernels.add_rows(out, s.units, s.values)
    return out


def nonzero_units(dense: torch.Tensor):
    """Units (rows) of a dense [M, D] sum that are not all zero (NaN counts as non-zero)."""
    units = nonzero_rows(dense)
    return units.numpy(), dense.index_select(0, units)


class RecursiveDoubling(Planned):
    """The hierarchy shared by hierarchical centralization and SparCML; `choose_format`
    decides how one set travels."""

    name = "hierarchical"

    def plan(self, units, values, layout, transport, seed) -> Plan:
        values = widened(values)
        return Plan(np.zeros(transport.size, np.int64), units, values, layout.num_units)

    def choose_format(self, s: UnitSet, M: int, isz: int, vsz: int) -> int:
        if s.units is None:
            return DENSE
        return BITMAP if bitmap_nbytes(M) < pad8(s.size * isz) else POSITIONS

    def form(self, s: UnitSet, M: int) -> UnitSet:
        """s as it travels: made dense when its format is dense."""
        idt = index_dtype(M)
        fmt = self.choose_format(s, M, idt.itemsize, s.values.shape[1] * s.values.dtype.itemsize)
        return UnitSet(None, dense_of(s, M)) if fmt == DENSE and s.units is not None else s

    # -- one set on the wire ------------------------------------------------------------
    def encode(self, s: UnitSet, M: int):
        """The message of one set, written once into one buffer, and the set as it was sent
        (made dense when the format is dense)."""
        idt = index_dtype(M)
        D, dtype = s.values.shape[1], s.values.dtype
        s = self.form(s, M)
        fmt = self.choose_format(s, M, idt.itemsize, D * dtype.itemsize)
        K, vbytes = s.size, s.size * D * dtype.itemsize
        nb = pad8(K * idt.itemsize) if fmt == POSITIONS else bitmap_nbytes(M) if fmt == BITMAP else 0
        buf = np.empty(8 + nb + pad8(vbytes), np.uint8)
        buf[:8].view(np.int64)[0] = 4 * K + fmt
        head = buf[8:8 + nb]
        if fmt == POSITIONS:
            head[K * idt.itemsize:] = 0
            head[:K * idt.itemsize].view(idt)[:] = s.units
        elif fmt == BITMAP:
            words = head.view(np.uint64)
            words[:] = 0
            data_path.set_bits(words, s.units)
        buf[8 + nb + vbytes:] = 0
        buf[8 + nb:8 + nb + vbytes].view(dtype).reshape(K, D)[:] = s.values
        return buf, s

    @staticmethod
    def decode(buf: np.ndarray, M: int, D: int, dtype, name: str) -> UnitSet:
        """A received message as a set; its values are a view of the message."""
        tag = int(buf[:8].view(np.int64)[0]) if buf.size >= 8 else -1
        K, fmt = tag >> 2, tag & 3
        idt, vsz = index_dtype(M), D * np.dtype(dtype).itemsize
        nb = pad8(K * idt.itemsize) if fmt == POSITIONS else bitmap_nbytes(M) if fmt == BITMAP else 0
        if tag < 0 or fmt > DENSE or K > M or (fmt == DENSE and K != M) \
                or buf.size != 8 + nb + pad8(K * vsz):
            raise InvalidTensorError(
                f"zen_hvd: tensor {name!r}: a hierarchy message of {buf.size} bytes does not match "
                f"its tag {tag} (a peer sent a different tensor or a corrupt message)")
        units = None
        index = buf[8:8 + nb]
        if fmt == POSITIONS and not positions_in_range(index[:K * idt.itemsize].view(idt), M, ascending=True) or \
                fmt == BITMAP and not bitmap_holds(index.view(np.uint64), K, M):
            raise InvalidTensorError(
                f"zen_hvd: tensor {name!r}: a hierarchy message holds units its tag does not count, "
                "or positions out of order or out of range (a corrupt message)")
        if fmt == POSITIONS:
            units = index[:K * idt.itemsize].view(idt).astype(np.int64)
        elif fmt == BITMAP:
            units = np.empty(K, np.int64)
            data_path.bitmap_positions(index.view(np.uint64), units)
        values = buf[8 + nb:8 + nb + K * vsz].view(dtype).reshape(K, D)
        return UnitSet(units, values)

    def exchange(self, s: UnitSet, peer, transport, M, name, *, send=True, recv=True):
        """Send s to peer (if send) and receive peer's set (if recv): one message each way.
        Returns (peer's set or None, s as sent). Both partners merge the two sets in the
        forms they travelled in (dense once the format turns dense): a dense sum drops units
        whose values cancel to zero, a sparse union keeps them, and every rank must agree."""
        payload, sent = self.encode(s, M) if send and peer is not None else (None, s)
        got = self.swap(transport, payload, peer, recv, s)
        try:
            other = self.decode(got, M, s.values.shape[1], s.values.dtype, name) if got is not None else None
        except InvalidTensorError as e:   # name the sender
            raise InvalidTensorError(f"{e} [the message of rank {peer}]") from None
        return other, sent

    # -- where the sets live: numpy on the host (device_hierarchy.py overrides these) ------
    @staticmethod
    def swap(transport, payload, peer, recv, s):
        return transport.swap(payload, peer, receive=recv)

    @staticmethod
    def start(plan) -> UnitSet:
        return UnitSet(plan.units, plan.values.numpy())

    @staticmethod
    def merge(lower: UnitSet, higher: UnitSet, M: int) -> UnitSet:
        return merge(lower, higher, M)

    @staticmethod
    def result(s: UnitSet, M: int):
        """(units, values) of the final set: a dense one's non-zero rows."""
        if s.units is None:
            return nonzero_units(torch.from_numpy(s.values))
        return s.units, torch.from_numpy(s.values)

    # -- the hierarchy ------------------------------------------------------------------
    def run(self, plan: Plan, table, transport):
        n, me, M, name = transport.size, transport.rank, plan.num_units, plan.name
        p = 1 << (n.bit_length() - 1)
        extra = n - p
        cur = self.start(plan)
        stage_sizes = [cur.size]  # |union| of this rank's group entering each stage
        ex = lambda peer, **kw: self.exchange(cur, peer, transport, M, name, **kw)  # noqa: E731
        # fold: ranks p..n-1 hand their set to rank - p
        if extra:
            if me >= p:
                ex(me - p, recv=False)
            elif me < extra:
                cur = self.merge(cur, ex(me + p, send=False)[0], M)
            else:
                ex(None)
            stage_sizes[0] = cur.size
        # recursive doubling among ranks 0..p-1
        step = 1
        while step < p:
            partner = me ^ step if me < p else None
            other, cur = ex(partner)
            if partner is not None:
                cur = self.merge(cur, other, M) if me < partner else self.merge(other, cur, M)
            stage_sizes.append(cur.size)
            step <<= 1
        # Every rank holds the result in the form it travels in, so that ranks p..n-1, which
        # receive it, end with the same units as ranks 0..p-1.
        cur = self.form(cur, M) if me < p else cur
        # unfold: the result goes back to ranks p..n-1
        if extra:
            if me < extra:
                ex(me + p, recv=False)
            elif me >= p:
                cur = ex(me - p, send=False)[0]
            else:
                ex(None)
        units, values = self.result(cur, M)
        info = dict(stage_sizes=np.array(stage_sizes if me < p else [], np.int64),
                    union_size=len(units))
        return units, values, info


class HierarchicalCentralization(RecursiveDoubling):
    """The second optimal design of docs/algorithm.md §2: each set travels as positions or as a bitmap over
    [0, M), whichever is smaller."""

    name = "hierarchical"
    code = 1
    device = True
    auto = True
    header_in_push = False
