"""The device data path's glue: numba's CUDA kernels on torch tensors, where they run, and
what a device sync reads from its tensor.

For a CUDA tensor the units, positions, values, bitmaps and the result of a sync stay torch
CUDA tensors; the kernels (cuda_kernels/data_path_gpu.py, hierarchical_hashing.py) read and
write them in place through __cuda_array_interface__ (arr, launch). The same code runs on CPU
tensors with NUMBA_ENABLE_CUDASIM=1 and ZEN_HVD_DATA_PATH=device: the kernels then run in
Numba's CUDA simulator on numpy views of the tensors, which is how the CPU suite checks the
device path against the host path, bit for bit, in real multi-rank syncs.

The kernels run on the tensor's device, on the CUDA default stream (sync.py runs every device
scheme inside device_scope): a caller on another stream is ordered before the sync, and the
caller's stream after it, and the results are recorded on the caller's stream.

time_steps() times every step of the syncs run inside it (scripts/gpu_check.sh's table).
The protocols themselves are written once, over backend.py's Host and Device backends.
"""
from __future__ import annotations

import contextlib
import os

import numpy as np
import torch

from .units import INDEX_OUT_OF_RANGE, Source, nonzero_rows

TORCH = {np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64}
_UNTIMED = contextlib.nullcontext()
_record = None   # (seconds, events) while time_steps() is active


@contextlib.contextmanager
def time_steps():
    """Yields (seconds, events): {step: seconds} summed over the syncs run inside the block,
    and every step run as (step, start, end) in time.perf_counter() seconds (a timeline of the
    sync, comparable across the ranks of one machine). Each step of a device sync is timed
    between device synchronizations, which a sync otherwise never waits for."""
    global _record
    _record, outer = ({}, []), _record
    try:
        yield _record
    finally:
        _record = outer


def step(name, device):
    """The context of one step of a sync: timed under time_steps(), else nothing. device: the
    tensor's device, or None on the host path."""
    return _UNTIMED if _record is None else _timed(name, device, _record)


@contextlib.contextmanager
def _timed(name, device, record):
    import time

    cuda = device is not None and device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    yield
    if cuda:
        torch.cuda.synchronize(device)
    t1 = time.perf_counter()
    seconds, events = record
    seconds[name] = seconds.get(name, 0.0) + t1 - t0
    events.append((name, t0, t1))


def wanted(layout) -> bool:
    """Whether a balanced sync of this tensor runs on the device: ZEN_HVD_DATA_PATH ("device"
    or "host") if set, else where the tensor lives."""
    choice = os.environ.get("ZEN_HVD_DATA_PATH") or ("device" if layout.device_type == "cuda" else "host")
    if choice not in ("device", "host"):
        raise ValueError(f"ZEN_HVD_DATA_PATH must be 'device' or 'host', not {choice!r}")
    if choice == "device" and layout.device_type != "cuda" and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        raise ValueError("ZEN_HVD_DATA_PATH=device on a CPU tensor runs the device kernels in "
                         "Numba's CUDA simulator: set NUMBA_ENABLE_CUDASIM=1 before importing zen_hvd")
    return choice == "device"


def kernels():
    """The device kernels, imported on first use (numba.cuda is only needed on this path)."""
    from .cuda_kernels import data_path_gpu, h0, hierarchical_hashing

    return data_path_gpu, h0, hierarchical_hashing


def arr(t: torch.Tensor, dtype=None):
    """A kernel's view of tensor t, no copy, reinterpreted as numpy `dtype` if given: numba's
    device array of a CUDA tensor; the simulator's device array around a numpy view of a CPU
    tensor (a plain numpy argument would be copied in and out per launch, and two views of
    one buffer would then overwrite each other's writes)."""
    if t.is_cuda:
        from numba import cuda

        a = cuda.as_cuda_array(t.detach())
        return a.view(dtype) if dtype is not None else a
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    a = t.detach().numpy()
    return FakeCUDAArray(a.view(dtype) if dtype is not None else a)


def tensor_of(a, device) -> torch.Tensor:
    """A kernel's output array as a torch tensor on `device` (no copy on a GPU)."""
    if device.type == "cuda":
        return torch.as_tensor(a, device=device)
    return torch.from_numpy(a if isinstance(a, np.ndarray) else a.copy_to_host())


def launch(kernel, threads, *args):
    """`kernel` with one thread per element of a length-`threads` range, tensors as views."""
    if threads > 0:
        kernels()[1].launch_1d(kernel, threads, *(arr(a) if isinstance(a, torch.Tensor) else a
                                                   for a in args))


@contextlib.contextmanager
def device_scope(device):
    """Where a device sync's kernels run: on `device` itself (torch's and numba's current device
    both set to it: one GPU per rank), and on the CUDA default stream, after the work queued on
    the caller's current stream and before what the caller queues next. Yields a list: the
    tensors the block hands back to the caller, which are then marked as used on the caller's
    stream (record_stream), so the caching allocator does not reuse their memory while the
    caller's stream may still read them. Nothing to do off the GPU."""
    outputs = []
    if device.type != "cuda":
        yield outputs
        return
    from numba import cuda

    with torch.cuda.device(device), cuda.gpus[device.index if device.index is not None else
                                              torch.cuda.current_device()]:
        caller, default = torch.cuda.current_stream(device), torch.cuda.default_stream(device)
        if caller == default:
            yield outputs
            return
        default.wait_stream(caller)
        with torch.cuda.stream(default):
            yield outputs
        caller.wait_stream(default)
        for t in outputs:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                t.record_stream(caller)


def empty_int64(device):
    """empty(size): a new int64 device array from torch's caching allocator (a kernel's view of
    a tensor on `device`), for the kernels' own scratch arrays."""
    return lambda size: arr(torch.empty(int(size), dtype=torch.int64, device=device))


def source(tensor: torch.Tensor, layout) -> Source:
    """The Source of a tensor on its device (units.source's twin, fields as torch tensors):
    unique int64 units and their values [nnz, D] (a sparse tensor, coalesced on the device if
    it is not), or the non-zero rows of a dense [M, D] table (dense_src, values the table
    itself); an index out of range sets error and detail."""
    M, D = layout.num_units, layout.unit_size
    if not layout.sparse:
        flat = tensor.reshape(M, D)
        return Source(nonzero_rows(flat), flat.contiguous(), True, True)
    dims = layout.shape[:layout.sparse_dim]
    idx = tensor._indices()
    bad = ((idx < 0) | (idx >= torch.tensor(dims, device=idx.device).unsqueeze(1))).any(dim=0)
    if idx.numel() and bool(bad.any()):
        col = idx[:, int(torch.nonzero(bad)[0, 0])]
        detail = int(col[(col < 0) | (col >= torch.tensor(dims, device=col.device))][0])
        return Source(None, None, False, True, INDEX_OUT_OF_RANGE, detail)
    t = tensor if tensor.is_coalesced() else tensor.coalesce()   # sums duplicates
    idx = t._indices()
    units = torch.zeros(idx.shape[1], dtype=torch.int64, device=idx.device)
    for d, size in enumerate(dims):
        units = units * size + idx[d]
    return Source(units, t._values().reshape(-1, D).contiguous(), False, True)


def units_of(tensor: torch.Tensor, layout):
    """units.to_units on the tensor's device: (unique ascending int64 units, their [nnz, D]
    values, error, detail), the units and values tensors (None on an error)."""
    src = source(tensor, layout)
    values = src.values.index_select(0, src.units) if src.dense_src else src.values
    return src.units, values, src.error, src.detail


def word_prefix(words):
    """(prefix, total) of a bitmap of int64 words on the device; total stays a 1-element
    device tensor until the caller needs it on the host."""
    gpu, h0, _ = kernels()
    prefix = torch.empty(words.numel(), dtype=torch.int64, device=words.device)
    total = torch.zeros(1, dtype=torch.int64, device=words.device)
    if words.numel():
        gpu.word_prefix_device(arr(words, np.uint64), arr(prefix), arr(total))
    return prefix, total


def to_host(small) -> list:
    """A list of small device tensors as numpy arrays, in one copy."""
    if not small:
        return []
    joined = torch.cat([t.reshape(-1).view(torch.uint8) for t in small]).cpu().numpy()
    return np.split(joined, np.cumsum([t.numel() * t.element_size() for t in small])[:-1])
