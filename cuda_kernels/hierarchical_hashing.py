"""Hierarchical hashing (Section 3.2, Algorithm 1): group one worker's units by partition.

Input: unique int64 unit indices in [0, M). Output, for both the GPU kernel and its CPU twin:

    order   int64[nnz]  positions into `units`, grouped by partition 0..n-1
    counts  int64[n]    partition p's block is order[start_p : start_p + counts[p]]
    pos     int64[nnz]  pos[i] = pi(units[order[i]]) div n, the unit's bit inside I_p (h0.py)

GPU memory x has shape n x (r1 + r2), flattened, EMPTY = -1: per partition r1 slots for
parallel writes and r2 slots of serial memory. Slots hold input positions i, not units.
Nothing is dropped: if serial memory overflows, r2 grows and the kernel reruns.
"""
import math

import numba
import numpy as np
from numba import cuda

from .h0 import _permute_one_cpu, domain_bits, launch_1d, permute_one_gpu
from .murmur import hash64_gpu

EMPTY = -1


# ---- CPU twin: stable counting sort by partition ------------------------------------------

@numba.njit(cache=True)
def _group_cpu(units, M, B, n, keys):
    """One pass computes y = pi(u) (server y mod n, bit y div n); a stable counting sort by
    server follows."""
    y = np.empty_like(units)
    counts = np.zeros(n, np.int64)
    for i in range(units.size):
        y[i] = _permute_one_cpu(units[i], M, B, keys)
        counts[y[i] % n] += 1
    cursor = np.cumsum(counts) - counts  # exclusive prefix sum = start of each block
    order = np.empty(units.size, np.int64)
    pos = np.empty(units.size, np.int64)
    for i in range(units.size):
        p = y[i] % n
        order[cursor[p]] = i
        pos[cursor[p]] = y[i] // n
        cursor[p] += 1
    return order, counts, pos


def group_by_partition_cpu(units, M, n, keys):
    """(order, counts, pos); within a partition, order is ascending input position."""
    units = np.ascontiguousarray(units, np.int64)
    return _group_cpu(units, M, domain_bits(M), n, np.ascontiguousarray(keys, np.int64))


# ---- GPU: Algorithm 1 ---------------------------------------------------------------------

@cuda.jit
def hash_kernel(units, M, B, n, keys, second_seeds, k, r1, r2, x, c, counts, pos_in):
    """One thread per input position i (Algorithm 1, lines 'for each idx in I, in parallel')."""
    i = cuda.grid(1)
    if i >= units.size:
        return
    u = units[i]
    y = permute_one_gpu(u, M, B, keys)
    p = y % n  # first level: p = h0(idx), the same on every worker
    pos_in[i] = y // n
    cuda.atomic.add(counts, p, 1)
    row = p * (r1 + r2)
    for t in range(k):  # second level: q = h_t(idx) into the parallel region
        slot = row + hash64_gpu(u, second_seeds[t]) % r1
        # "if x[p][q] is empty: x[p][q] = idx" as one compare-and-swap. Its returned old value
        # is the read-after-write check (technique 4) done atomically at the same instant:
        # EMPTY means slot now holds i; anything else is another index, so rehash. (A separate
        # plain load could hit a stale, non-coherent L1 line and duplicate i.)
        if cuda.atomic.cas(x, slot, EMPTY, i) == EMPTY:
            return
    q = cuda.atomic.add(c, p, 1)  # i == k+1: serial memory x[p][r1 + q]
    if q < r2:
        x[row + r1 + q] = i
    # else: overflow; c[p] keeps counting, so the host learns how much serial memory p needs


@cuda.jit
def fill_kernel(a, value):
    """a[:] = value on the device (no host buffer of a's size is copied over)."""
    i = cuda.grid(1)
    if i < a.size:
        a[i] = value


def _filled(size, value, empty):
    a = empty(size)
    launch_1d(fill_kernel, size, a, value)
    return a


def _numba_empty(size):
    return cuda.device_array(size, np.int64)


@cuda.jit
def compact_kernel(x, r1, r2, pos_in, cursor, order, pos):
    """Extraction: nonzero(x[p]) per partition, one thread per slot, into p's block of order."""
    s = cuda.grid(1)
    if s >= x.size or x[s] == EMPTY:
        return
    i = x[s]
    dst = cuda.atomic.add(cursor, s // (r1 + r2), 1)
    order[dst] = i
    pos[dst] = pos_in[i]


def group_by_partition_gpu(units, M, n, keys, second_seeds, r1=None, r2=None, k=3, stats=None,
                           empty=_numba_empty):
    """(order, counts, pos) as in group_by_partition_cpu; order within a partition arbitrary.

    Defaults: r1 = 2 * ceil(nnz / n) slots per partition (twice the expected units, Section
    3.2's r1 ~ 2 |G| d_G), k = 3 hashes, r2 = r1 // 8 + 32 serial slots. numpy in -> numpy
    out, device array in -> device arrays out. If `stats` is a dict it receives r1, r2 (final),
    retries and serial (serial-memory slots used, summed over partitions). empty(size): a new
    int64 device array (default numba's; zen_hvd's device path passes torch's caching
    allocator, so a sync allocates no memory of its own).
    """
    on_host = isinstance(units, np.ndarray)
    d_units = cuda.to_device(np.ascontiguousarray(units, np.int64)) if on_host else units
    nnz = d_units.shape[0]
    if len(second_seeds) < k:
        raise ValueError(f"k = {k} second-level hashes need k seeds, got {len(second_seeds)}")
    r1 = max(1, 2 * math.ceil(nnz / n)) if r1 is None else r1
    r2 = r1 // 8 + 32 if r2 is None else r2
    d_keys, d_seeds = cuda.to_device(keys), cuda.to_device(np.asarray(second_seeds, np.int64))
    pos_in = empty(nnz)
    retries = 0
    while True:
        x, c, counts = _filled(n * (r1 + r2), EMPTY, empty), _filled(n, 0, empty), _filled(n, 0, empty)
        launch_1d(hash_kernel, nnz, d_units, M, domain_bits(M), n, d_keys, d_seeds, k, r1, r2,
                  x, c, counts, pos_in)
        h_c, h_counts = c.copy_to_host(), counts.copy_to_host()
        if nnz == 0 or h_c.max() <= r2:
            break
        # Serial memory overflowed: grow r2 at least 2x (or to the largest partition, which
        # cannot overflow), so the retries terminate.
        r2 = int(min(2 * h_c.max(), h_counts.max()))
        retries += 1
    cursor = cuda.to_device(np.cumsum(h_counts) - h_counts)
    order, pos = empty(nnz), empty(nnz)
    launch_1d(compact_kernel, x.shape[0], x, r1, r2, pos_in, cursor, order, pos)
    if stats is not None:
        stats.update(r1=r1, r2=r2, retries=retries, serial=int(h_c.sum()))
    if on_host:
        return order.copy_to_host(), h_counts, pos.copy_to_host()
    return order, counts, pos
