"""The existing schemes Zen is compared with (docs/algorithm.md §2), on zen_hvd's transports.

All are lossless, take the same units as balanced parallelism (rows of D values or elements),
aggregate in rank order (so every rank computes the same bits), and count their bytes through
the transport. Per worker, bytes received (k = nnz per worker, |I_m| = union of m workers,
i = index bytes, v = D value bytes, a block = B = ceil(256 / D) units):

  allreduce   dense ring AllReduce:          2 (n-1)/n M v
  agsparse    allgather of COO (Horovod, DDP): (n-1) k (i + v)          one-shot, centralized
              (oneshot.py: one point-to-point round, the header in it)
  sparcml     recursive doubling of COO sets, dense once a merged set's COO exceeds M v:
              sum_i min(|I_{2^(i-1)}| (i + v), M v)                     incremental, centralized
  omnireduce  uniform contiguous partitions of blocks; only non-zero blocks are pushed (block
              id + B v) and pulled; one-shot aggregation on the owner   parallelized, imbalanced
  sparse_ps   uniform contiguous partitions of units; COO Push and COO Pull (C3 skew makes the
              first partitions' owners the bottleneck)                  parallelized, imbalanced

Schemes that move dense values (allreduce, sparcml once dense, omnireduce's blocks) return the
units whose summed values are non-zero; the others return exactly the union of the input units.
"""
from __future__ import annotations

import numpy as np
import torch

from .header import COUNTS
from .units import sorted_unique
from .hierarchical import DENSE, POSITIONS, Plan, RecursiveDoubling, nonzero_units
from .planned import Planned
from .units import add_rows, widened
from .wire import index_dtype, pack, part_nbytes, unpack


def _local(units, values, layout, transport) -> Plan:
    return Plan(np.zeros(transport.size, np.int64), units, values, layout.num_units)


def sum_in_rank_order(parts, W, dtype):
    """Union of the parts' (ascending-unique-per-part) indices and their sums, rank 0 first."""
    idx = sorted_unique(np.concatenate([p[0] for p in parts])) if parts else np.zeros(0, np.int64)
    out = torch.zeros((idx.size, W), dtype=dtype)
    for i, v in parts:
        if i.size:
            add_rows(out, np.searchsorted(idx, i), v)
    return idx, out


def pull_allgather(idx, vals, transport, idx_dtype, W, dtype):
    """Every server's aggregated COO part to every worker: [int64 k][indices][values]."""
    head = torch.from_numpy(np.array([idx.size], np.int64).view(np.uint8))
    payload = torch.cat([head, pack([(idx, vals)], idx_dtype)[0]])
    recv, counts = transport.allgatherv(payload)
    parts, off = [], 0
    for c in counts:
        k = int(recv[off:off + 8].numpy().view(np.int64)[0])
        parts.append(unpack(recv[off + 8:off + c], [k], idx_dtype, W, dtype)[0])
        off += c
    return parts


class DenseAllReduce(Planned):
    """Dense AllReduce of the whole tensor (the baseline every figure normalizes to)."""

    name = "allreduce"
    code = 2
    device = False
    auto = True
    header_in_push = False

    def plan(self, units, values, layout, transport, seed):
        values = widened(values)   # as in the other schemes (MPI has no half sum)
        return _local(units, values, layout, transport)

    def run(self, plan, table, transport):
        dense = torch.zeros((plan.num_units, plan.values.shape[1]), dtype=plan.values.dtype)
        if plan.units.size:
            dense[torch.from_numpy(plan.units)] = plan.values
        units, values = nonzero_units(transport.allreduce_sum(dense))
        return units, values, dict(union_size=int(units.size))


class SparCML(RecursiveDoubling):
    """SparCML's recursive doubling: COO sets, dense as soon as the COO would be larger."""

    name = "sparcml"
    code = 4
    device = False
    auto = False
    header_in_push = False

    def choose_format(self, s, M, isz, vsz):
        if s.units is None or part_nbytes(s.size, isz, vsz) > M * vsz:
            return DENSE
        return POSITIONS


class _Partitioned(Planned):
    """Uniform contiguous partitions: server p owns keys [bounds[p], bounds[p+1]); Push is an
    alltoallv of (key, W values) per key, Pull an allgatherv of the aggregated partitions."""

    def keys(self, plan_units, values, layout):
        """(ascending keys, values [k, W], number of keys K, W)."""
        raise NotImplementedError

    def plan(self, units, values, layout, transport, seed):
        keys, kvals, K, W = self.keys(units, values, layout)
        bounds = np.arange(transport.size + 1, dtype=np.int64) * K // transport.size
        counts = np.diff(np.searchsorted(keys, bounds)).astype(np.int64)
        plan = Plan(counts, keys, kvals, layout.num_units)
        plan.W, plan.D, plan.K = W, values.shape[1], K
        return plan

    def run(self, plan, table, transport):
        n, me, dtype = transport.size, transport.rank, plan.values.dtype
        idt, W = index_dtype(plan.K), plan.W
        vsz = W * plan.values.element_size()
        starts = np.concatenate([[0], np.cumsum(plan.counts)])
        parts = [(plan.units[starts[p]:starts[p + 1]], plan.values[starts[p]:starts[p + 1]]) for p in range(n)]
        send, send_counts = pack(parts, idt)
        from_worker = table[:, COUNTS + me]
        recv = transport.alltoallv(send, send_counts, [part_nbytes(k, idt.itemsize, vsz) for k in from_worker])
        keys, agg = sum_in_rank_order(unpack(recv, from_worker, idt, W, dtype), W, dtype)
        pulled = pull_allgather(keys, agg, transport, idt, W, dtype)
        keys = np.concatenate([k for k, _ in pulled])
        vals = torch.cat([v for _, v in pulled])
        units, values = self.units_of(keys, vals, plan)
        info = dict(push_counts=table[:, COUNTS:COUNTS + n].copy(),
                    pull_counts=np.array([k.size for k, _ in pulled], np.int64),
                    union_size=int(units.size))
        return units, values, info

    def units_of(self, keys, vals, plan):
        return keys, vals


class SparsePS(_Partitioned):
    """Sparse parameter server: partitions of units, COO both ways."""

    name = "sparse_ps"
    code = 6
    device = False
    auto = False
    header_in_push = False

    def keys(self, units, values, layout):
        return units, values, layout.num_units, values.shape[1]


def block_units(D: int) -> int:
    """Units per OmniReduce block: 256 elements' worth (ceil(256 / D) rows, at least 1)."""
    return max(1, -(-256 // D))


class OmniReduce(_Partitioned):
    """OmniReduce: partitions of 256-element blocks; only non-zero blocks travel."""

    name = "omnireduce"
    code = 5
    device = False
    auto = False
    header_in_push = False

    def keys(self, units, values, layout):
        B, D = block_units(values.shape[1]), values.shape[1]
        nblocks = -(-layout.num_units // B)
        blocks, inverse = sorted_unique(units // B, return_inverse=True)
        dense = torch.zeros((blocks.size, B, D), dtype=values.dtype)
        if units.size:
            dense[torch.from_numpy(inverse.reshape(-1)), torch.from_numpy(units % B)] = values
        return blocks, dense.reshape(blocks.size, B * D), nblocks, B * D

    def units_of(self, blocks, vals, plan):
        B = plan.W // plan.D
        rows = vals.reshape(-1, plan.D)
        units, values = nonzero_units(rows)
        units = blocks[units // B] * B + units % B
        keep = units < plan.num_units
        return units[keep], values[torch.from_numpy(keep)]


