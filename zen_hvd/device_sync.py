"""Balanced parallelism on the device: balanced.py's protocol, every pass a CUDA kernel.

For a CUDA tensor the units, positions, values, bitmaps and the result stay torch CUDA
tensors; numba's kernels (cuda_kernels/data_path_gpu.py, hierarchical_hashing.py) read and
write them in place through __cuda_array_interface__. Only what the protocol needs crosses to
the host: the n Push counts, the n headers, |I'_p| of this server, the n Pull tags and each
decoded bitmap's popcount (the check that it matches its tag). The steps, as in balanced.py:

  1. partition  Algorithm 1 (group_by_partition_gpu), then pack_kernel writes each server's
                positions and values straight into its part of the Push buffer;
  2. Push       Transport.push_device: NCCL point to point on the torch transport; other
                transports stage the buffer through host memory (one copy each way);
  3. aggregate  set_bits_kernel (atomic or) builds the hash bitmap of I'_p, word_prefix_device
                its popcount prefix (over many blocks), add_part_kernel adds each worker's values in rank order
                0..n-1 at their slots (distinct positions within a part: no float atomics, the
                same sum on every run), scale_rows_kernel applies the postscale once;
                parts far sparser than the bitmap find the union by a device sort instead;
  4. Pull       Transport.pull_joined_device: the servers' values land back to back;
  5. decode     units_of_bitmap_kernel / units_of_positions_kernel (the inverse bijection),
                then scatter_kernel into a dense output, or one device sort for an ascending
                sparse result.
The same code runs on CPU tensors with NUMBA_ENABLE_CUDASIM=1 and ZEN_HVD_DATA_PATH=device:
the kernels then run in Numba's CUDA simulator on numpy views of the tensors, which is how the
CPU suite checks this path against the host path, bit for bit, in real multi-rank syncs.

The kernels run on the tensor's device, on the CUDA default stream (sync.py runs every device
scheme inside device_scope): a caller on another stream is ordered before the sync, and the
caller's stream after it, and the results are recorded on the caller's stream. Every position
received from a peer is range-checked on the device before a kernel indexes with it.

time_steps() times every step of the syncs run inside it (scripts/gpu_check.sh's table).
"""
from __future__ import annotations

import contextlib
import os

import numpy as np
import torch

from .balanced import (_MALFORMED, _header_table, bitmap_nbytes, check_push, corrupt_pull,
                       malformed_push, pull_body_nbytes, pull_formats, push_layout)
from .header import COL, COUNTS, InvalidTensorError, check_table, names_gatherer
from .units import INDEX_OUT_OF_RANGE, OK
from .wire import BITMAP, POSITIONS, index_dtype, pad8

_TORCH = {np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64}
_UNTIMED = contextlib.nullcontext()
_seconds = None   # {step: seconds} while time_steps() is active


@contextlib.contextmanager
def time_steps():
    """Yields {step: seconds}, summed over the syncs run inside the block; each step is timed
    between device synchronizations, which a sync otherwise never waits for."""
    global _seconds
    _seconds, outer = {}, _seconds
    try:
        yield _seconds
    finally:
        _seconds = outer


def step(name, device):
    """The context of one step of a sync: timed under time_steps(), else nothing."""
    return _UNTIMED if _seconds is None else _timed(name, device, _seconds)


@contextlib.contextmanager
def _timed(name, device, seconds):
    import time

    wait = torch.cuda.synchronize if device.type == "cuda" else (lambda d: None)
    wait(device)
    t0 = time.perf_counter()
    yield
    wait(device)
    seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0


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


def _kernels():
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
        _kernels()[1].launch_1d(kernel, threads, *(arr(a) if isinstance(a, torch.Tensor) else a
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


def source(tensor: torch.Tensor, layout):
    """(units, values, dense_src, error, detail) of a tensor on its device: unique int64 units
    and their values [nnz, D] (a sparse tensor, coalesced on the device if it is not), or the
    non-zero rows of a dense [M, D] table (dense_src, values the table itself)."""
    M, D = layout.num_units, layout.unit_size
    if not layout.sparse:
        flat = tensor.reshape(M, D)
        nz = (flat != 0).any(dim=1)
        return torch.nonzero(nz).reshape(-1), flat.contiguous(), True, OK, 0
    dims = layout.shape[:layout.sparse_dim]
    idx = tensor._indices()
    bad = ((idx < 0) | (idx >= torch.tensor(dims, device=idx.device).unsqueeze(1))).any(dim=0)
    if idx.numel() and bool(bad.any()):
        col = idx[:, int(torch.nonzero(bad)[0, 0])]
        detail = int(col[(col < 0) | (col >= torch.tensor(dims, device=col.device))][0])
        return None, None, False, INDEX_OUT_OF_RANGE, detail
    t = tensor if tensor.is_coalesced() else tensor.coalesce()   # sums duplicates
    idx = t._indices()
    units = torch.zeros(idx.shape[1], dtype=torch.int64, device=idx.device)
    for d, size in enumerate(dims):
        units = units * size + idx[d]
    return units, t._values().reshape(-1, D).contiguous(), False, OK, 0


def units_of(tensor: torch.Tensor, layout):
    """units.to_units on the tensor's device: (unique ascending int64 units, their [nnz, D]
    values, error, detail), the units and values tensors (None on an error)."""
    units, values, dense_src, error, detail = source(tensor, layout)
    if dense_src:
        values = values.index_select(0, units)
    return units, values, error, detail


def sync(name, tensor, layout, header, ctx, scheme_names, prescale, scale, divisor,
         out=None, ordered=True):
    """balanced.BalancedParallelism.sync on the device: returns (units or None, values, info)
    as torch tensors on the tensor's device (units None when the result is the dense [M, D]
    `out`, or a new dense table for a dense input)."""
    return _sync(name, tensor, layout, header, ctx, scheme_names, prescale, scale, divisor, out, ordered)


def _sync(name, tensor, layout, header, ctx, scheme_names, prescale, scale, divisor, out, ordered):
    gpu, h0, hh = _kernels()
    tr, keys, dev = ctx.transport, ctx.keys, tensor.device
    n, me, M, D = tr.size, tr.rank, layout.num_units, layout.unit_size
    idt = index_dtype(h0.server_size(M, n, 0))
    with step("units (non-zero rows, or coalesce)", dev):
        units, values, dense_src, error, detail = source(tensor, layout)
    vdtype = values.dtype if values is not None else tensor.dtype
    isz, vsz = idt.itemsize, D * vdtype.itemsize
    header[COL["error"]], header[COL["error_detail"]] = error, detail

    # 1. partition (Algorithm 1) and pack, straight into the Push buffer
    counts, nnz = np.zeros(n, np.int64), 0 if units is None else units.numel()
    if error == OK and nnz:
        with step("partition (Algorithm 1)", dev):
            order, d_counts, pos = hh.group_by_partition_gpu(arr(units), M, n, keys,
                                                             h0.second_level_seeds(ctx.seed, me, 3),
                                                             empty=empty_int64(dev))
            order, pos = tensor_of(order, dev), tensor_of(pos, dev)
            counts = tensor_of(d_counts, dev).cpu().numpy().astype(np.int64)   # n integers
    header[COL["nnz"]] = counts.sum()
    header[COUNTS:] = counts
    H = header.nbytes
    sizes, offs = push_layout(counts, H, isz, vsz)
    with step("pack", dev):
        buf = torch.zeros(int(sizes.sum()), dtype=torch.uint8, device=dev)
        head = torch.from_numpy(header.view(np.uint8)).to(dev)
        for off in offs:
            buf[off:off + H] = head
        if counts.sum():
            starts = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)).to(dev)
            idx_off = torch.from_numpy((offs + H) // isz).to(dev)
            val_off = torch.from_numpy((offs + H + ((counts * isz + 7) & ~7)) // vdtype.itemsize).to(dev)
            launch(gpu.pack_kernel, nnz * D, buf.view(_TORCH[idt]), buf.view(vdtype), idx_off, val_off,
                   order, starts, pos, units, values, dense_src)

    # 2. Push, the header check (n headers to the host)
    with step("Push", dev):
        parts = tr.push_device(buf, sizes, control=H)
    with step("header check", dev):
        heads = [np.asarray(h) for h in _to_host([p[:H] for p in parts])]
        table, short = _header_table(heads, H, header.size)
        check_push(name, short)
        check_table(name, table, scheme_names, names_gatherer(tr))

    # 3. aggregate
    from_worker = table[:, COUNTS + me]
    with step("aggregate (bitmap, prefix, rank-order sum, scale)", dev):
        pull = None if malformed_push([p.numel() for p in parts], from_worker, H, isz, vsz) else \
            _aggregate(parts, from_worker, H, idt, vdtype, D, M, n, me, prescale, scale, divisor)
        if pull is None:   # every rank then raises, from the tag (pull_formats)
            pull = torch.from_numpy(np.array([_MALFORMED], np.int64).view(np.uint8)).to(dev)

    # 4. Pull: every server's aggregated values back to back
    with step("Pull", dev):
        bodies, tails = tr.pull_joined_device(pull, pull_body_nbytes(vsz))
    tags = [int(t.view(np.int64)[0]) if t.size == 8 else _MALFORMED
            for t in _to_host([t[-8:] for t in tails])]
    K, nbs = pull_formats(name, tags, [t.numel() for t in tails], M, n, isz, vsz)

    # 5. decode through the inverse bijection, then scatter or sort. Each bitmap's popcount
    # is checked against its tag first: a corrupt one could write past its K units.
    with step("decode (inverse bijection)", dev):
        all_units = _decode(name, tails, tags, K, nbs, keys, M, n, isz, idt, dev)
    values = bodies.view(vdtype).view(len(all_units), D)
    with step("scatter or sort", dev):
        if out is not None or not layout.sparse:
            target = out if out is not None else torch.zeros((M, D), dtype=vdtype, device=dev)
            launch(gpu.scatter_kernel, all_units.numel() * D, target, all_units, values)
            units, values = None, target
        elif ordered:
            order = torch.argsort(all_units)
            units, values = all_units[order], values[order]
        else:
            units = all_units
    info = dict(push_counts=table[:, COUNTS:COUNTS + n], pull_counts=np.array(K, np.int64),
                union_size=int(sum(K)), nnz=table[:, COL["nnz"]])
    return units, values, info


def _decode(name, tails, tags, K, nbs, keys, M, n, isz, idt, dev):
    """Every server's units, in server order, from the Pull tails: the hash bitmap or the
    positions, through the inverse bijection. Checked first, on the device, with the few
    integers read in one copy: each bitmap's popcount against its tag (a corrupt one could
    write past its K units) and each position within its server's range."""
    gpu, h0, _ = _kernels()
    B, d_keys = h0.domain_bits(M), torch.from_numpy(np.asarray(keys, np.int64)).to(dev)
    bitmaps = {s: _word_prefix(tails[s][:nbs[s]].view(torch.int64))
               for s, t in enumerate(tags) if t & 1 == BITMAP}
    bad = torch.zeros(1, dtype=torch.int64, device=dev)
    for s, (tail, k) in enumerate(zip(tails, K)):
        if s not in bitmaps:
            launch(gpu.check_positions_kernel, k, tail[:k * isz].view(_TORCH[idt]), h0.server_size(M, n, s), bad)
    lasts = [tails[s][nbs[s] - 8:nbs[s]] for s in bitmaps]   # bits past |I_s| must be clear
    counts = _to_host([bad] + [total for _, total in bitmaps.values()] + lasts)
    found = {s: int(c.view(np.int64)[0]) for s, c in zip(bitmaps, counts[1:])}
    past = {s: int(w.view(np.uint64)[0]) >> (h0.server_size(M, n, s) % 64)
            for s, w in zip(bitmaps, counts[1 + len(bitmaps):]) if h0.server_size(M, n, s) % 64}
    if any(found[s] != K[s] for s in found) or any(past.values()) or int(counts[0].view(np.int64)[0]):
        wrong = [s for s in found if found[s] != K[s] or past.get(s)]
        raise InvalidTensorError(corrupt_pull(name, wrong or "of the positions format"))
    all_units = torch.empty(sum(K), dtype=torch.int64, device=dev)
    start = 0
    for s, (tail, k, nb) in enumerate(zip(tails, K, nbs)):
        dst = all_units[start:start + k]
        if s in bitmaps:
            launch(gpu.units_of_bitmap_kernel, nb // 8, arr(tail[:nb].view(torch.int64), np.uint64),
                   bitmaps[s][0], s, n, M, B, d_keys, dst)
        else:
            launch(gpu.units_of_positions_kernel, k, tail[:k * isz].view(_TORCH[idt]), s, n, M, B,
                   d_keys, dst)
        start += k
    return all_units


def _aggregate(parts, from_worker, H, idt, vdtype, D, M, n, me, prescale, scale, divisor):
    """balanced._aggregate on the device: the Pull buffer of server me, [values summed in rank
    order at their slots, then scaled][pad to 8][hash bitmap or positions][int64 tag]; None
    when a received position lies outside I_me (a corrupt Push)."""
    gpu, h0, _ = _kernels()
    isz, vsz, dev = idt.itemsize, D * vdtype.itemsize, parts[0].device
    positions, values = [], []
    for b, k in zip(parts, from_worker):
        positions.append(b[H:H + k * isz].view(_TORCH[idt]))
        v0 = H + pad8(k * isz)
        values.append(b[v0:v0 + k * vsz].view(vdtype).view(int(k), D))
    bad = torch.zeros(1, dtype=torch.int64, device=dev)   # positions outside I_me, from peers
    for j in positions:
        launch(gpu.check_positions_kernel, j.numel(), j, h0.server_size(M, n, me), bad)
    nb_bitmap = bitmap_nbytes(M, n, me)
    if nb_bitmap > pad8(sum(j.numel() for j in positions) * isz):
        # far sparser than the bitmap: the union by a device sort, memory following nnz
        if int(bad.cpu()[0]):
            return None
        union = torch.unique(torch.cat(positions).long())
        K = union.numel()
        pull, acc, index = _pull_buffer(K, pad8(K * isz), POSITIONS, vdtype, D, dev)
        index[:K * isz].view(_TORCH[idt]).copy_(union)
        for j, v in zip(positions, values):                  # rank order 0..n-1
            launch(gpu.add_slots_kernel, j.numel() * D, acc, torch.searchsorted(union, j.long()), v,
                   prescale)
    else:
        words = torch.zeros(nb_bitmap // 8, dtype=torch.int64, device=dev)
        for j in positions:
            launch(gpu.set_bits_kernel, j.numel(), arr(words, np.uint64), j)
        prefix, total = _word_prefix(words)
        K, wrong = (int(c.view(np.int64)[0]) for c in _to_host([total, bad]))   # |I'_me|
        if wrong:
            return None
        fmt = BITMAP if words.numel() * 8 <= pad8(K * isz) else POSITIONS
        pull, acc, index = _pull_buffer(K, words.numel() * 8 if fmt == BITMAP else pad8(K * isz),
                                        fmt, vdtype, D, dev)
        if fmt == BITMAP:
            index.view(torch.int64).copy_(words)
        else:
            ones = torch.empty(K, dtype=torch.int64, device=dev)
            launch(gpu.bitmap_positions_kernel, words.numel(), arr(words, np.uint64), prefix, ones)
            index[:K * isz].view(_TORCH[idt]).copy_(ones)
        for j, v in zip(positions, values):                  # rank order 0..n-1
            launch(gpu.add_part_kernel, j.numel() * D, acc, arr(words, np.uint64), prefix, j, v,
                   prescale)
    launch(gpu.scale_rows_kernel, acc.numel(), acc, scale, divisor)
    return pull


def _pull_buffer(K, nb, fmt, vdtype, D, dev):
    """A zeroed Pull buffer on the device: (buffer, its [K, D] values view, its index part)."""
    vb = K * D * vdtype.itemsize
    pull = torch.zeros(pad8(vb) + nb + 8, dtype=torch.uint8, device=dev)
    pull[-8:].view(torch.int64).fill_(2 * K + fmt)
    return pull, pull[:vb].view(vdtype).view(K, D), pull[pad8(vb):pad8(vb) + nb]


def _word_prefix(words):
    """(prefix, total) of a bitmap of int64 words on the device; total stays a 1-element
    device tensor until the caller needs it on the host."""
    gpu, h0, _ = _kernels()
    prefix = torch.empty(words.numel(), dtype=torch.int64, device=words.device)
    total = torch.zeros(1, dtype=torch.int64, device=words.device)
    if words.numel():
        gpu.word_prefix_device(arr(words, np.uint64), arr(prefix), arr(total))
    return prefix, total


def _to_host(small) -> list:
    """A list of small device tensors as numpy arrays, in one copy."""
    if not small:
        return []
    joined = torch.cat([t.reshape(-1).view(torch.uint8) for t in small]).cpu().numpy()
    return np.split(joined, np.cumsum([t.numel() * t.element_size() for t in small])[:-1])
