"""The GPU twins of data_path.py: the three passes of a balanced-parallelism sync on the device.

Each kernel computes what its CPU twin (same name in data_path.py, njit) computes, on the same
buffer layout, so the device path and the host path produce the same bytes:

    1. pack           worker: hierarchical hashing's grouped order (hierarchical_hashing.py)
                      written straight into each server's part of the Push buffer;
    2. set_bits       server: the hash bitmap of I'_p from the received positions (atomic or);
       word_prefix    the popcount prefix of the bitmap's words (one block);
       add_part       every worker's values added, one launch per worker in rank order 0..n-1,
       add_slots      straight into the Pull buffer at the unit's slot. Within one worker's part
                      the positions are distinct, so no two threads add to one element and the
                      sum's order is the rank order on every run (no float atomics);
       scale_rows     the postscale and Average's 1/n, once, on the server's 1/n of the union;
    3. units_of_bitmap, units_of_positions, bitmap_positions
                      worker: decode the bitmap (or the positions) through the inverse
                      bijection (Section 3.3);
       scatter        each server's values into the output rows.

Scaling is computed in float64 and rounded once to the values' dtype, as the njit twins
compute it (stated explicitly, so that the simulator, whose numpy scalars would stay in
float32, agrees bit for bit). Element kernels run one thread per (entry, column): thread t handles entry t // D, column
t % D. Arrays are numba device arrays or anything with __cuda_array_interface__ (torch CUDA
tensors through numba.cuda.as_cuda_array), so nothing is copied to the host.
"""
import numba
import numpy as np
from numba import cuda

from .h0 import THREADS, launch_1d, unpermute_one_gpu

_ONE = numba.uint64(1)


@cuda.jit(device=True)
def popcount(x):
    """Set bits of a uint64, as int64 (int64 + uint64 would be typed float64)."""
    return numba.int64(cuda.popc(x))


# ---- 1. pack (worker) ----------------------------------------------------------------------

@cuda.jit
def pack_kernel(idx_view, val_view, idx_off, val_off, order, starts, pos, units, values, dense_src):
    """Grouped entry j (server p, where starts[p] <= j < starts[p + 1]) goes to row
    j - starts[p] of server p's part: its position pos[j] to idx_view, the values of entry
    order[j] (row units[order[j]] of a dense table when dense_src) to val_view. Unique units."""
    t = cuda.grid(1)
    D = values.shape[1]
    if t >= order.size * D:
        return
    j, d = t // D, t % D
    lo, hi = 0, starts.size - 1          # the server: last p with starts[p] <= j
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if starts[mid] <= j:
            lo = mid
        else:
            hi = mid
    p, row, i = lo, j - starts[lo], order[j]
    if d == 0:
        idx_view[idx_off[p] + row] = pos[j]
    src = units[i] if dense_src else i
    val_view[val_off[p] + row * D + d] = values[src, d]


# ---- 2. aggregate (server) -----------------------------------------------------------------

@cuda.jit
def set_bits_kernel(words, positions):
    """Bitmap |= the given positions (which may repeat): one atomic or per position."""
    t = cuda.grid(1)
    if t < positions.size:
        j = positions[t]
        cuda.atomic.or_(words, j >> 6, _ONE << numba.uint64(j & 63))


@cuda.jit
def word_prefix_kernel(words, prefix, total):
    """Exclusive prefix of the words' popcounts, and their total in total[0]. One block of
    THREADS threads: each counts a contiguous chunk, thread 0 scans the chunk sums, each then
    writes its chunk's prefixes."""
    tid = cuda.threadIdx.x
    W = words.size
    chunk = (W + THREADS - 1) // THREADS
    lo = min(tid * chunk, W)
    hi = min(lo + chunk, W)
    s = 0
    for w in range(lo, hi):
        s += popcount(words[w])
    sums = cuda.shared.array(THREADS, numba.int64)
    sums[tid] = s
    cuda.syncthreads()
    if tid == 0:
        run = 0
        for k in range(THREADS):
            v = sums[k]
            sums[k] = run
            run += v
        total[0] = run
    cuda.syncthreads()
    run = sums[tid]
    for w in range(lo, hi):
        prefix[w] = run
        run += popcount(words[w])


@cuda.jit(device=True)
def slot_of(words, prefix, j):
    """A set bit's slot: prefix[j >> 6] + the set bits below it in its word."""
    w = j >> 6
    below = words[w] & ((_ONE << numba.uint64(j & 63)) - _ONE)
    return prefix[w] + popcount(below)


@cuda.jit
def add_part_kernel(acc, words, prefix, positions, values, prescale):
    """acc[slot(j)] += prescale * values[i] for the i-th received position j of one worker."""
    t = cuda.grid(1)
    D = acc.shape[1]
    if t < positions.size * D:
        i, d = t // D, t % D
        slot = slot_of(words, prefix, positions[i])
        if prescale == 1.0:
            acc[slot, d] += values[i, d]
        else:
            acc[slot, d] = numba.float64(acc[slot, d]) + prescale * numba.float64(values[i, d])


@cuda.jit
def add_slots_kernel(acc, slots, values, prescale):
    """acc[slots[i]] += prescale * values[i] (the slots known from a sort of the positions)."""
    t = cuda.grid(1)
    D = acc.shape[1]
    if t < slots.size * D:
        i, d = t // D, t % D
        if prescale == 1.0:
            acc[slots[i], d] += values[i, d]
        else:
            acc[slots[i], d] = numba.float64(acc[slots[i], d]) + prescale * numba.float64(values[i, d])


@cuda.jit
def scale_rows_kernel(acc, scale, divisor):
    """acc * scale in place (floats), or acc / divisor truncated toward zero (integers
    averaged: divisor > 0): the aggregate's last step, once per server."""
    t = cuda.grid(1)
    K, D = acc.shape
    if t < K * D:
        i, d = t // D, t % D
        v = acc[i, d]
        if divisor > 0:
            q = abs(v) // divisor
            acc[i, d] = q if v >= 0 else -q
        elif scale != 1.0:
            acc[i, d] = numba.float64(v) * scale


# ---- 3. decode and scatter (worker) --------------------------------------------------------

@cuda.jit
def units_of_bitmap_kernel(words, prefix, p, n, M, B, keys, out):
    """Bit j of server p is unit pi^-1(j n + p), at out[slot(j)]: one thread per word."""
    w = cuda.grid(1)
    if w >= words.size:
        return
    x, k, b = words[w], prefix[w], 0
    while x:
        if x & _ONE:
            out[k] = unpermute_one_gpu(((w << 6) + b) * n + p, M, B, keys)
            k += 1
        x >>= _ONE
        b += 1


@cuda.jit
def units_of_positions_kernel(positions, p, n, M, B, keys, out):
    """Position j of server p (the Pull's positions format) is unit pi^-1(j n + p)."""
    i = cuda.grid(1)
    if i < positions.size:
        out[i] = unpermute_one_gpu(numba.int64(positions[i]) * n + p, M, B, keys)


@cuda.jit
def bitmap_positions_kernel(words, prefix, out):
    """The set bits' positions, ascending, into out: one thread per word."""
    w = cuda.grid(1)
    if w >= words.size:
        return
    x, k, b = words[w], prefix[w], 0
    while x:
        if x & _ONE:
            out[k] = (w << 6) + b
            k += 1
        x >>= _ONE
        b += 1


@cuda.jit
def scatter_kernel(out, rows, values):
    """out[rows[i]] = values[i] (the server has scaled them: scale_rows_kernel)."""
    t = cuda.grid(1)
    D = values.shape[1]
    if t < rows.size * D:
        i, d = t // D, t % D
        out[rows[i], d] = values[i, d]


# ---- launches ------------------------------------------------------------------------------

def word_prefix(words):
    """(prefix, total) of a device bitmap: prefix stays on the device; total is the one
    integer the protocol needs on the host (the size of the Pull buffer)."""
    prefix = cuda.device_array(words.shape[0], np.int64)
    total = cuda.device_array(1, np.int64)
    word_prefix_kernel[1, THREADS](words, prefix, total)
    return prefix, int(total.copy_to_host()[0])


def launch_rows(kernel, rows, D, *args):
    """`kernel` with one thread per (row, column) of a rows x D block."""
    launch_1d(kernel, rows * D, *args)
