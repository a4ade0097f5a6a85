"""Hierarchical centralization on the device: hierarchical.py's recursive doubling, every set a
torch tensor on the tensor's device.

The stages, the fold for n not a power of two and the wire format of a set are hierarchical.py's
(RecursiveDoubling.run and its format choice); only where a set lives changes:

  encode  [int64 tag = 4 K + format][positions, or the bitmap over [0, M) by set_bits_kernel
          (atomic or)][values], written once into one device buffer;
  swap    Transport.swap on device tensors: NCCL point to point on the torch transport (the size first),
          CUDA-aware MPI on mpi4py, Horovod's GPU alltoall; else staged through host memory;
  decode  positions widened to int64, or the bitmap's set bits in order (word_prefix_device,
          bitmap_positions_kernel), its popcount checked against the tag first;
  merge   the union of two ascending sets by one stable sort: where a unit is in both, the
          lower-rank group's value comes first and the two are added in that order, as
          merge_sorted adds them on the host: the same bits, no atomics.
Only integers cross to the host: each message's tag, and each bitmap's popcount. The same code
runs on CPU tensors with the kernels in Numba's CUDA simulator (ZEN_HVD_DATA_PATH=device),
which is how the CPU suite checks it against the host path bit for bit.
"""
from __future__ import annotations

import numpy as np
import torch

from .device import TORCH, arr, kernels, launch, to_host, word_prefix
from .header import InvalidTensorError
from .hierarchical import HierarchicalCentralization, UnitSet
from .wire import BITMAP, POSITIONS, bitmap_nbytes, index_dtype, pad8


class DeviceHierarchy(HierarchicalCentralization):
    """HierarchicalCentralization whose sets are device tensors (see the module doc)."""

    def encode(self, s: UnitSet, M: int):
        idt = index_dtype(M)
        K, D, dtype, dev = len(s.units), s.values.shape[1], s.values.dtype, s.values.device
        fmt = self.choose_format(s, M, idt.itemsize, D * dtype.itemsize)
        nb = pad8(K * idt.itemsize) if fmt == POSITIONS else bitmap_nbytes(M)
        vbytes = K * D * dtype.itemsize
        buf = torch.zeros(8 + nb + pad8(vbytes), dtype=torch.uint8, device=dev)
        buf[:8].view(torch.int64).fill_(4 * K + fmt)
        if fmt == POSITIONS:
            buf[8:8 + K * idt.itemsize].view(TORCH[idt]).copy_(s.units)
        else:
            launch(kernels()[0].set_bits_kernel, K, arr(buf[8:8 + nb].view(torch.int64), np.uint64),
                   s.units)
        buf[8 + nb:8 + nb + vbytes].view(dtype).view(K, D).copy_(s.values)
        return buf, s

    @staticmethod
    def decode(buf, M: int, D: int, dtype, name: str) -> UnitSet:
        tag = int(buf[:8].cpu().numpy().view(np.int64)[0]) if buf.numel() >= 8 else -1
        K, fmt = tag >> 2, tag & 3
        idt, vsz = index_dtype(M), D * dtype.itemsize
        nb = pad8(K * idt.itemsize) if fmt == POSITIONS else bitmap_nbytes(M)
        error = (f"a hierarchy message of {buf.numel()} bytes does not match its tag {tag} (a peer "
                 "sent a different tensor or a corrupt message)")
        if tag < 0 or fmt not in (POSITIONS, BITMAP) or K > M or buf.numel() != 8 + nb + pad8(K * vsz):
            raise InvalidTensorError(f"zen_hvd: tensor {name!r}: {error}")
        if fmt == POSITIONS:
            units = buf[8:8 + K * idt.itemsize].view(TORCH[idt]).long()
            bad = torch.zeros(1, dtype=torch.int64, device=buf.device)
            launch(kernels()[0].check_positions_kernel, K, units, M, bad)
            if K > 1:                        # a set's positions rise strictly, as merge needs
                bad += (units[1:] <= units[:-1]).sum()
            if int(bad.cpu()[0]):            # a kernel would index with them
                raise InvalidTensorError(f"zen_hvd: tensor {name!r}: {error}")
        else:
            words = buf[8:8 + nb].view(torch.int64)
            prefix, total = word_prefix(words)
            total, last = (int(c.view(np.int64)[0]) for c in to_host([total, words[-1:]]))
            # a corrupt bitmap could write past K units, or name units past M
            if total != K or M % 64 and (last & ((1 << 64) - 1)) >> (M % 64):
                raise InvalidTensorError(f"zen_hvd: tensor {name!r}: {error}")
            units = torch.empty(K, dtype=torch.int64, device=buf.device)
            launch(kernels()[0].bitmap_positions_kernel, words.numel(), arr(words, np.uint64), prefix,
                   units)
        return UnitSet(units, buf[8 + nb:8 + nb + K * vsz].view(dtype).view(K, D))

    @staticmethod
    def swap(transport, payload, peer, recv, s):
        return transport.swap(payload, peer, recv, device=s.values.device)

    @staticmethod
    def start(plan) -> UnitSet:
        return UnitSet(plan.units, plan.values)

    @staticmethod
    def merge(lower: UnitSet, higher: UnitSet, M: int) -> UnitSet:
        units = torch.cat([lower.units, higher.units])
        values = torch.cat([lower.values, higher.values])
        units, order = torch.sort(units, stable=True)    # a unit in both: lower's first
        values = values[order]
        both = units[1:] == units[:-1]                    # position i: lower's, i + 1: higher's
        first = torch.ones(units.numel(), dtype=torch.bool, device=units.device)
        first[1:] = ~both
        pairs = torch.nonzero(both).reshape(-1)
        values[pairs] = values[pairs] + values[pairs + 1]
        return UnitSet(units[first], values[first])

    @staticmethod
    def result(s: UnitSet, M: int):
        return s.units, s.values


SCHEMES = {"hierarchical": DeviceHierarchy()}
