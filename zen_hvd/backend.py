"""Where a sync's buffers live and which kernels run on them: the host (numpy arrays and the
njit kernels of cuda_kernels/data_path.py) or the device (torch tensors on the tensor's device
and the CUDA kernels of cuda_kernels/data_path_gpu.py, device.py's glue).

A protocol (balanced.py) is written once against this small interface:
  allocation  zeros(nbytes), zeros_words(n), zeros_rows(k, D, dtype), empty_units(k),
              constant(host array): a buffer on the backend;
  views       view(buf, numpy dtype): a byte buffer reinterpreted (slices and reshape are the
              same on numpy and torch); copy(dst, src);
  integers    ints(xs): python ints from scalars the backend produced (on the device, one
              copy to the host for all of them); host(bufs): small buffers as numpy;
  inputs      source(tensor, layout): a units.Source; units_of(tensor, layout): unique
              ascending units and their values;
  kernels     partition, pack, count_bad, set_bits, word_prefix, bitmap_positions, add_part, union,
              add_slots, scale_rows, outside, units_of_bitmap, units_of_positions, scatter,
              sort_rows: the same names and arguments on both, each the njit kernel or the
              CUDA kernel of that name.
Transports take either kind of buffer (Transport.push, pull_joined, swap).
"""
from __future__ import annotations

import os

import numpy as np
import torch

from . import device
from .cuda_kernels import data_path as cpu_kernels
from .cuda_kernels import h0, hierarchical_hashing
from .units import ascending_order, sorted_unique, source as host_source, to_units
from .wire import positions_in_range


def partitioner() -> str:
    """How the host path partitions: "cpu" (fused h0 + counting placement, the default) or
    "gpu" (Algorithm 1, the hierarchical hashing kernel, which the device path always uses):
    ZEN_HVD_PARTITIONER. Both give the same units per server."""
    choice = os.environ.get("ZEN_HVD_PARTITIONER") or "cpu"
    if choice not in ("gpu", "cpu"):
        raise ValueError(f"ZEN_HVD_PARTITIONER must be 'gpu' or 'cpu', not {choice!r}")
    return choice


class Host:
    """numpy buffers, the njit kernels."""

    name = "host"

    def step(self, name):
        return device.step(name, None)

    # -- allocation, views, integers ---------------------------------------------------
    def zeros(self, nbytes):
        return np.zeros(int(nbytes), np.uint8)

    def zeros_words(self, n):
        return np.zeros(int(n), np.uint64)

    def zeros_rows(self, k, D, dtype):
        return np.zeros((int(k), D), dtype)

    def empty_units(self, k):
        return np.empty(int(k), np.int64)

    def constant(self, a):
        return a

    @staticmethod
    def view(buf, dtype):
        return buf.view(dtype)

    @staticmethod
    def copy(dst, src):
        dst[...] = src

    @staticmethod
    def nbytes(buf) -> int:
        return buf.size

    @staticmethod
    def ints(xs) -> list:
        return [int(np.asarray(x).reshape(-1)[0]) if np.ndim(x) else int(x) for x in xs]

    @staticmethod
    def host(bufs) -> list:
        return list(bufs)

    @staticmethod
    def source(tensor, layout):
        return host_source(tensor, layout)

    @staticmethod
    def units_of(tensor, layout):
        return to_units(tensor, layout)

    # -- kernels ------------------------------------------------------------------------
    def partition(self, src, servers, seeds):
        """(placement, counts, bad): where each entry of src goes (for pack), the number of
        units per server, and the first entry whose unit is out of range (or -1). seeds:
        Algorithm 1's second-level seeds."""
        M, n, keys = servers.M, servers.n, servers.keys
        if partitioner() == "cpu":
            part, local, pos, counts, bad = cpu_kernels.partition(
                src.units, M, h0.domain_bits(M), n, keys, src.unique)
            return (part, local, pos), counts, bad
        # Algorithm 1 (ZEN_HVD_PARTITIONER=gpu) on host arrays: it takes unique units in range.
        units = src.units
        if units.size and (units.min() < 0 or units.max() >= M):
            return None, np.zeros(n, np.int64), int(np.flatnonzero((units < 0) | (units >= M))[0])
        uniq, inverse = (units, None) if src.unique else np.unique(units, return_inverse=True)
        order, counts, pos = hierarchical_hashing.group_by_partition_gpu(uniq, M, n, keys, seeds)
        starts = np.cumsum(counts) - counts
        server = np.repeat(np.arange(n), counts)
        part, local, upos = (np.empty(uniq.size, np.int64) for _ in range(3))
        part[order], local[order], upos[order] = server, np.arange(order.size) - starts[server], pos
        if inverse is not None:
            part, local, upos = part[inverse], local[inverse], upos[inverse]
        return (part, local, upos), np.asarray(counts, np.int64), -1

    @staticmethod
    def pack(buf, idt, vdtype, offsets, placement, src):
        idx_off, val_off = offsets
        cpu_kernels.pack(buf.view(idt), buf.view(vdtype), idx_off, val_off, *placement,
                         src.units, src.values, src.dense_src, src.unique)

    @staticmethod
    def outside(positions, bound, ascending=False):
        """How many of the arrays hold a position outside [0, bound) (or, ascending, are not
        strictly ascending)."""
        return sum(not positions_in_range(j, bound, ascending) for j in positions)

    @staticmethod
    def count_bad(words, positions, bound):
        """A received part's positions outside [0, bound) or repeated (words: a zero bitmap of
        at least bound bits, zero again after), or with words None its sorted copy's."""
        if words is None:
            return int(not positions_in_range(positions, bound)) or positions.size - sorted_unique(positions).size
        return cpu_kernels.count_bad(words, positions, bound)

    @staticmethod
    def set_bits(words, positions):
        cpu_kernels.set_bits(words, positions)

    @staticmethod
    def word_prefix(words):
        return cpu_kernels.word_prefix(words)

    @staticmethod
    def bitmap_positions(words, prefix, out):
        cpu_kernels.bitmap_positions(words, out)

    @staticmethod
    def add_part(acc, words, prefix, positions, values, prescale):
        cpu_kernels.add_part(acc, words, prefix, positions, values, prescale)

    @staticmethod
    def union(positions):
        return sorted_unique(np.concatenate(positions)) if positions else np.zeros(0, np.int64)

    @staticmethod
    def add_slots(acc, union, positions, values, prescale):
        """add_part with the slots found in `union`, the sorted union of the positions."""
        cpu_kernels.add_slots(acc, np.searchsorted(union, positions), values, prescale)

    @staticmethod
    def scale_rows(acc, scale, divisor):
        cpu_kernels.scale_rows(acc, scale, divisor)

    @staticmethod
    def units_of_bitmap(words, prefix, s, servers, out):
        M = servers.M
        cpu_kernels.units_of_bitmap(words, s, servers.n, M, h0.domain_bits(M), servers.keys, out)

    @staticmethod
    def units_of_positions(positions, s, servers, out):
        M = servers.M
        cpu_kernels.units_of_positions(positions, s, servers.n, M, h0.domain_bits(M), servers.keys, out)

    @staticmethod
    def scatter(out, units, values):
        cpu_kernels.scatter(out, units, values)

    @staticmethod
    def sort_rows(units, values):
        order = ascending_order(units)
        return units[order], np.take(values, order, axis=0)


HOST = Host()


class Device:
    """torch tensors on `dev` (a GPU, or the CPU with the kernels in Numba's CUDA simulator),
    the CUDA kernels. Integers the protocol needs stay 1-element tensors until ints()."""

    name = "device"

    def __init__(self, dev):
        self.dev = dev
        self.gpu = device.kernels()[0]
        self._dkeys = None

    def step(self, name):
        return device.step(name, self.dev)

    # -- allocation, views, integers ---------------------------------------------------
    def zeros(self, nbytes):
        return torch.zeros(int(nbytes), dtype=torch.uint8, device=self.dev)

    def zeros_words(self, n):
        return torch.zeros(int(n), dtype=torch.int64, device=self.dev)   # uint64 to the kernels

    def zeros_rows(self, k, D, dtype):
        return torch.zeros((int(k), D), dtype=_torch_dtype(dtype), device=self.dev)

    def empty_units(self, k):
        return torch.empty(int(k), dtype=torch.int64, device=self.dev)

    def constant(self, a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.dev)

    @staticmethod
    def view(buf, dtype):
        dtype = np.dtype(dtype)
        return buf.view(torch.int64 if dtype == np.uint64 else _torch_dtype(dtype))

    @staticmethod
    def copy(dst, src):
        dst.copy_(src)

    @staticmethod
    def nbytes(buf) -> int:
        return buf.numel()

    @staticmethod
    def ints(xs) -> list:
        """Python ints of device scalars (1-element tensors) and host ints, in one copy."""
        small = [x for x in xs if isinstance(x, torch.Tensor)]
        got = iter(device.to_host(small))
        return [int(next(got).view(np.int64)[0]) if isinstance(x, torch.Tensor) else int(x) for x in xs]

    @staticmethod
    def host(bufs) -> list:
        return [np.asarray(b) for b in device.to_host(list(bufs))]

    @staticmethod
    def source(tensor, layout):
        return device.source(tensor, layout)

    @staticmethod
    def units_of(tensor, layout):
        return device.units_of(tensor, layout)

    # -- kernels ------------------------------------------------------------------------
    def partition(self, src, servers, seeds):
        hh = device.kernels()[2]
        order, counts, pos = hh.group_by_partition_gpu(device.arr(src.units), servers.M, servers.n,
                                                       servers.keys, seeds, empty=device.empty_int64(self.dev))
        order, pos = device.tensor_of(order, self.dev), device.tensor_of(pos, self.dev)
        counts = device.tensor_of(counts, self.dev).cpu().numpy().astype(np.int64)   # n integers
        starts = self.constant(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        return (order, starts, pos), counts, -1

    def pack(self, buf, idt, vdtype, offsets, placement, src):
        idx_off, val_off = (self.constant(o) for o in offsets)
        device.launch(self.gpu.pack_kernel, src.units.numel() * src.values.shape[1],
                      self.view(buf, idt), self.view(buf, vdtype), idx_off, val_off, *placement,
                      src.units, src.values, src.dense_src)

    def outside(self, positions, bound, ascending=False):
        bad = torch.zeros(1, dtype=torch.int64, device=self.dev)
        for j in positions:
            device.launch(self.gpu.check_positions_kernel, j.numel(), j, bound, bad)
            if ascending and j.numel() > 1:
                bad += (j[1:] <= j[:-1]).sum()
        return bad

    def count_bad(self, words, positions, bound):
        if words is None:
            bad = self.outside([positions], bound)
            return bad + (positions.numel() - torch.unique(positions).numel())
        bad = torch.zeros(1, dtype=torch.int64, device=self.dev)
        device.launch(self.gpu.mark_bad_kernel, positions.numel(), device.arr(words, np.uint64), positions,
                      bound, bad)
        device.launch(self.gpu.clear_marks_kernel, positions.numel(), device.arr(words, np.uint64),
                      positions, bound)
        return bad

    def set_bits(self, words, positions):
        device.launch(self.gpu.set_bits_kernel, positions.numel(), device.arr(words, np.uint64), positions)

    @staticmethod
    def word_prefix(words):
        return device.word_prefix(words)

    def bitmap_positions(self, words, prefix, out):
        device.launch(self.gpu.bitmap_positions_kernel, words.numel(), device.arr(words, np.uint64),
                      prefix, out)

    def add_part(self, acc, words, prefix, positions, values, prescale):
        device.launch(self.gpu.add_part_kernel, positions.numel() * acc.shape[1], acc,
                      device.arr(words, np.uint64), prefix, positions, values, prescale)

    @staticmethod
    def union(positions):
        if not positions:
            return torch.zeros(0, dtype=torch.int64)
        return torch.unique(torch.cat(positions).long())

    def add_slots(self, acc, union, positions, values, prescale):
        device.launch(self.gpu.add_slots_kernel, positions.numel() * acc.shape[1], acc,
                      torch.searchsorted(union, positions.long()), values, prescale)

    def scale_rows(self, acc, scale, divisor):
        device.launch(self.gpu.scale_rows_kernel, acc.numel(), acc, scale, divisor)

    def units_of_bitmap(self, words, prefix, s, servers, out):
        M = servers.M
        device.launch(self.gpu.units_of_bitmap_kernel, words.numel(), device.arr(words, np.uint64),
                      prefix, s, servers.n, M, h0.domain_bits(M), self._keys(servers.keys), out)

    def units_of_positions(self, positions, s, servers, out):
        M = servers.M
        device.launch(self.gpu.units_of_positions_kernel, positions.numel(), positions, s, servers.n,
                      M, h0.domain_bits(M), self._keys(servers.keys), out)

    def scatter(self, out, units, values):
        device.launch(self.gpu.scatter_kernel, units.numel() * out.shape[1], out, units, values)

    @staticmethod
    def sort_rows(units, values):
        order = torch.argsort(units)
        return units[order], values[order]

    def _keys(self, keys):
        """h0's round keys on the device, copied there once per backend."""
        if self._dkeys is None:
            self._dkeys = self.constant(np.asarray(keys, np.int64))
        return self._dkeys


def _torch_dtype(dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype (or a torch dtype, returned as it is)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    return torch.from_numpy(np.zeros(0, np.dtype(dtype))).dtype


def numpy_dtype(dtype) -> np.dtype:
    """The numpy dtype of a torch dtype (or a numpy dtype, returned as it is)."""
    if isinstance(dtype, torch.dtype):
        return torch.zeros(0, dtype=dtype).numpy().dtype
    return np.dtype(dtype)
