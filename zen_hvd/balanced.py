"""Balanced parallelism (PAPER.md section 3): hash-partitioned Push, aggregation, Pull.

Every rank is a worker and a server. With h0 (first-level hash, a keyed bijection pi of the M
units, the same on every rank) unit u belongs to server p = pi(u) mod n at bit j = pi(u) div n.
  1. partition: group the worker's units by server (hierarchical hashing on the GPU, a
     counting sort on the CPU: cuda_kernels.hierarchical_hashing);
  2. Push (COO): worker i sends server p the bit positions j and the values of its units in
     I_p: one alltoallv;
  3. aggregate: server p sums what it received in rank order 0..n-1 (so every run computes the
     same bits) into its aggregated set I'_p, kept in bitmap order;
  4. Pull (hash bitmap, Algorithm 2): server p sends every worker the bitmap of I'_p over I_p
     and the aggregated values in bitmap order: one allgatherv (a server whose aggregated set
     is sparser than 1 in 8 x index bytes sends its positions instead: whichever is smaller);
  5. decode: bit j of server p is unit pi^-1(j n + p).
Bytes received per worker (exact, besides <= 7 bytes of alignment padding per part):
  Push: sum over other workers i of |I_i^p| (index bytes + D value bytes);
  Pull: sum over other servers s of 8 + min(bitmap_nbytes(|I_s|), |I'_s| index bytes)
        + |I'_s| D value bytes,
which is the paper's 2 (n-1)/n (gamma_n + 1) d_G M traffic with the Pull indices replaced by
at most M (n-1) / (8 n) bitmap bytes.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import torch

from .cuda_kernels import h0, hierarchical_hashing
from .hash_bitmap import bitmap_nbytes, decode, encode, rank_in_bitmap
from .header import COUNTS
from .units import add_rows, take_units
from .wire import index_dtype, pack, pad8, part_nbytes, to_bytes, unpack


def partitioner(layout) -> str:
    """"gpu" (hierarchical hashing kernel) or "cpu" (counting sort): ZEN_HVD_PARTITIONER if
    set, else where the tensor lives. Both give the same units per server."""
    choice = os.environ.get("ZEN_HVD_PARTITIONER") or ("gpu" if layout.device_type == "cuda" else "cpu")
    if choice not in ("gpu", "cpu"):
        raise ValueError(f"ZEN_HVD_PARTITIONER must be 'gpu' or 'cpu', not {choice!r}")
    return choice


@dataclasses.dataclass
class Plan:
    counts: np.ndarray          # units this worker pushes to each server
    positions: np.ndarray       # bit positions j, grouped by server
    values: torch.Tensor        # values in the same order
    num_units: int
    keys: np.ndarray


class BalancedParallelism:
    name = "balanced"

    def plan(self, units, values, layout, transport, seed) -> Plan:
        n, M = transport.size, layout.num_units
        keys = h0.derive_keys(seed)
        if partitioner(layout) == "gpu":  # Algorithm 1 on the GPU (or the CUDA simulator)
            seeds = h0.second_level_seeds(seed, transport.rank, 3)
            order, counts, pos = hierarchical_hashing.group_by_partition_gpu(units, M, n, keys, seeds)
        else:                             # its CPU twin: a stable counting sort
            order, counts, pos = hierarchical_hashing.group_by_partition_cpu(units, M, n, keys)
        grouped = take_units(values, order)
        return Plan(counts.astype(np.int64), pos.astype(index_dtype(-(-M // n))), grouped, M, keys)

    def run(self, plan: Plan, table: np.ndarray, transport):
        n, me = transport.size, transport.rank
        recv, from_worker = self.push(plan, table, transport)
        bitmap, aggregated = self.aggregate(plan, recv, from_worker, me, n)
        units, values = self.pull(plan, bitmap, aggregated, transport)
        info = dict(push_counts=table[:, COUNTS:COUNTS + n].copy(),
                    pull_counts=np.array([v.shape[0] for v in values], dtype=np.int64))
        units = np.concatenate(units) if units else np.zeros(0, np.int64)
        values = torch.cat(values) if values else plan.values[:0]
        return units, values, info

    # -- step 2: Push -------------------------------------------------------------------
    def push(self, plan, table, transport):
        me = transport.rank
        isz, vsz = plan.positions.itemsize, plan.values.shape[1] * plan.values.element_size()
        starts = np.concatenate([[0], np.cumsum(plan.counts)])
        send, send_counts = pack([(plan.positions[a:b], plan.values[a:b])     # server order
                                  for a, b in zip(starts[:-1], starts[1:])], plan.positions.dtype)
        from_worker = table[:, COUNTS + me]                    # |I_i^me| for every worker i
        recv_counts = [part_nbytes(c, isz, vsz) for c in from_worker]
        return transport.alltoallv(send, send_counts, recv_counts), from_worker

    # -- step 3: aggregate in rank order ------------------------------------------------
    def aggregate(self, plan, recv, from_worker, me, n):
        dtype, D = plan.values.dtype, plan.values.shape[1]
        nbits = h0.server_size(plan.num_units, n, me)           # |I_me|
        parts = unpack(recv, from_worker, plan.positions.dtype, D, dtype)
        values = [v for _, v in parts]
        all_pos = np.concatenate([j for j, _ in parts])
        bitmap = encode(all_pos, nbits)                          # I'_me as a hash bitmap
        slots = rank_in_bitmap(bitmap, all_pos)
        K = int(slots.max()) + 1 if slots.size else 0
        aggregated = torch.zeros((K, D), dtype=dtype)
        start = 0
        for v in values:                                          # rank order 0..n-1
            add_rows(aggregated, slots[start:start + v.shape[0]], v)
            start += v.shape[0]
        return bitmap, aggregated

    # -- steps 4 and 5: Pull with the hash bitmap, decode -------------------------------
    def pull(self, plan, bitmap, aggregated, transport):
        """Server part: [int64 tag = 2 K + format][index part][values, padded]. The index part
        is the hash bitmap, or, when the aggregated set is so sparse that K positions take
        fewer bytes than |I_p| bits (gamma d_G < 1/(8 index bytes)), the positions in bitmap order."""
        n, idx_dtype = transport.size, plan.positions.dtype
        dtype, D = aggregated.dtype, aggregated.shape[1]
        vsz = D * aggregated.element_size()
        K = aggregated.shape[0]
        if bitmap.nbytes <= pad8(K * idx_dtype.itemsize):
            fmt, index = _BITMAP, bitmap
        else:
            fmt, index = _POSITIONS, decode(bitmap).astype(idx_dtype)
        payload = torch.cat([to_bytes(np.array([2 * K + fmt], np.int64)), to_bytes(index),
                             to_bytes(aggregated)])
        recv, _ = transport.allgatherv(payload)
        units, values, off = [], [], 0
        for s in range(n):
            tag = int(recv[off:off + 8].numpy().view(np.int64)[0])
            K_s, off = tag >> 1, off + 8
            if tag & 1 == _BITMAP:
                nb = bitmap_nbytes(h0.server_size(plan.num_units, n, s))
                j = decode(recv[off:off + nb].numpy())
            else:
                nb = pad8(K_s * idx_dtype.itemsize)
                j = recv[off:off + K_s * idx_dtype.itemsize].numpy().view(idx_dtype).astype(np.int64)
            off += nb
            values.append(recv[off:off + K_s * vsz].view(dtype).reshape(K_s, D))
            off += pad8(K_s * vsz)
            units.append(h0.units_of_cpu(s, j, plan.num_units, n, plan.keys))
        return units, values


_BITMAP, _POSITIONS = 0, 1

