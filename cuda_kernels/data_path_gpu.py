"""The GPU twins of data_path.py: the three passes of a balanced-parallelism sync on the device.

Each kernel computes what its CPU twin (same name in data_path.py, njit) computes, on the same
buffer layout, so the device path and the host path produce the same bytes:

    1. pack           worker: hierarchical hashing's grouped order (hierarchical_hashing.py)
                      written straight into each server's part of the Push buffer;
    2. set_bits       server: the hash bitmap of I'_p from the received positions (atomic or);
       word_prefix    the popcount prefix of the bitmap's words (word_prefix_device: a scan
                      over as many blocks as the bitmap needs);
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
float32, agrees bit for bit). A product that feeds a sum goes through mul_rn and add_rn:
NVVM would otherwise fuse them into one fma, which rounds once where the CPU rounds twice.

Positions, slots and rows that come from a peer are range-checked where they index: a kernel
skips an index outside its array and counts it in `bad` (an optional 1-element int64 device
array; omit it rather than pass None, which a real launch cannot marshal), so a corrupt
message never writes out of bounds. check_positions_kernel counts them before any write.

Element kernels run one thread per (entry, column): thread t handles entry t // D, column
t % D. Arrays are numba device arrays or anything with __cuda_array_interface__ (torch CUDA
tensors through numba.cuda.as_cuda_array), so nothing is copied to the host.
"""
import numba
import numpy as np
from numba import cuda
from numba.cuda import libdevice

from .h0 import THREADS, launch_1d, unpermute_one_gpu

_ONE = numba.uint64(1)
WORDS_PER_THREAD = 8   # a prefix-scan block covers THREADS * WORDS_PER_THREAD words

if numba.config.ENABLE_CUDASIM:   # libdevice is stubs there; Python floats round every operation
    def mul_rn(a, b):
        return a * b

    def add_rn(a, b):
        return a + b
else:                             # float64 a * b and a + b, each rounded, never contracted
    mul_rn, add_rn = libdevice.dmul_rn, libdevice.dadd_rn


@cuda.jit(device=True)
def popcount(x):
    """Set bits of a uint64, as int64 (int64 + uint64 would be typed float64)."""
    return numba.int64(cuda.popc(x))


@cuda.jit(device=True)
def outside(j, bound, bad, count):
    """Whether j is outside [0, bound), for the caller to skip its write; if so and `count`,
    bad[0] += 1 (bad omitted or None: the skip alone)."""
    if 0 <= j < bound:
        return False
    if count and bad is not None:
        cuda.atomic.add(bad, 0, 1)
    return True


@cuda.jit
def check_positions_kernel(positions, bound, bad):
    """bad[0] += the number of positions outside [0, bound): a received part checked before
    any kernel uses it (the host reads bad[0] with the protocol's other integers)."""
    t = cuda.grid(1)
    if t < positions.size:
        outside(positions[t], bound, bad, True)


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
def set_bits_kernel(words, positions, bad=None):
    """Bitmap |= the given positions (which may repeat): one atomic or per position; one
    outside the bitmap is skipped and counted in bad."""
    t = cuda.grid(1)
    if t < positions.size:
        j = positions[t]
        if not outside(j, words.size << 6, bad, True):
            cuda.atomic.or_(words, j >> 6, _ONE << numba.uint64(j & 63))


@cuda.jit
def mark_bad_kernel(words, positions, bound, bad):
    """count_bad's first pass: bad[0] += the positions outside [0, bound) or whose bit
    another position of the part set first (the atomic or returns the old word); words zero
    on entry. clear_marks_kernel clears the marks."""
    t = cuda.grid(1)
    if t < positions.size:
        j = positions[t]
        if outside(j, bound, bad, True):
            return
        bit = _ONE << numba.uint64(j & 63)
        if cuda.atomic.or_(words, j >> 6, bit) & bit:
            cuda.atomic.add(bad, 0, 1)


@cuda.jit
def clear_marks_kernel(words, positions, bound):
    """count_bad's second pass: the marks of mark_bad_kernel cleared, words zero again."""
    t = cuda.grid(1)
    if t < positions.size:
        j = positions[t]
        if 0 <= j < bound:
            cuda.atomic.and_(words, j >> 6, ~(_ONE << numba.uint64(j & 63)))


@cuda.jit(device=True)
def block_scan(x):
    """(exclusive prefix of x over the block's threads, the block's total): a Hillis-Steele
    scan in shared memory, log2(blockDim) steps. Every thread of the block must call it."""
    s = cuda.shared.array(THREADS, numba.int64)
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    s[tid] = x
    cuda.syncthreads()
    step = 1
    while step < nt:
        v = s[tid - step] if tid >= step else 0
        cuda.syncthreads()
        s[tid] += v
        cuda.syncthreads()
        step *= 2
    incl, total = s[tid], s[nt - 1]
    cuda.syncthreads()   # s is reused by the next call
    return incl - x, total


@cuda.jit
def word_block_sums_kernel(words, per_thread, prefix):
    """Block b's popcount sum of its words [b c, (b + 1) c), c = per_thread * blockDim, into
    prefix[b c], the first entry block b later writes (so the scan needs no scratch array)."""
    nt = cuda.blockDim.x
    base = cuda.blockIdx.x * per_thread * nt
    s = 0
    for k in range(per_thread):   # tile k: words base + k nt + tid, coalesced
        w = base + k * nt + cuda.threadIdx.x
        if w < words.size:
            s += popcount(words[w])
    _, total = block_scan(s)
    if cuda.threadIdx.x == 0:
        prefix[base] = total


@cuda.jit
def block_offsets_kernel(prefix, stride, blocks, total):
    """Exclusive scan, in place, of the block sums prefix[0], prefix[stride], ... (`blocks` of
    them; one block, blockDim sums a round), and the total of all into total[0]."""
    run = 0
    for base in range(0, blocks, cuda.blockDim.x):
        b = base + cuda.threadIdx.x
        x = prefix[b * stride] if b < blocks else 0
        excl, s = block_scan(x)
        if b < blocks:
            prefix[b * stride] = run + excl
        run += s
    if cuda.threadIdx.x == 0:
        total[0] = run


@cuda.jit
def word_prefix_blocks_kernel(words, per_thread, prefix):
    """prefix[w] = the set bits in words[:w], for block b's words, from its offset prefix[b c]
    (block_offsets_kernel)."""
    nt = cuda.blockDim.x
    base = cuda.blockIdx.x * per_thread * nt
    run = prefix[base]   # read by all before thread 0 overwrites it: block_scan syncs first
    for k in range(per_thread):
        w = base + k * nt + cuda.threadIdx.x
        x = popcount(words[w]) if w < words.size else 0
        excl, s = block_scan(x)
        if w < words.size:
            prefix[w] = run + excl
        run += s


@cuda.jit(device=True)
def slot_of(words, prefix, j):
    """A set bit's slot: prefix[j >> 6] + the set bits below it in its word."""
    w = j >> 6
    below = words[w] & ((_ONE << numba.uint64(j & 63)) - _ONE)
    return prefix[w] + popcount(below)


@cuda.jit(device=True)
def add_scaled(acc, slot, d, values, i, prescale):
    """acc[slot, d] += prescale * values[i, d] (data_path._add_row): product and sum each
    rounded in float64, then once to acc's dtype."""
    if prescale == 1.0:
        acc[slot, d] += values[i, d]
    else:
        acc[slot, d] = add_rn(numba.float64(acc[slot, d]), mul_rn(prescale, numba.float64(values[i, d])))


@cuda.jit
def add_part_kernel(acc, words, prefix, positions, values, prescale, bad=None):
    """acc[slot(j)] += prescale * values[i] for the i-th received position j of one worker; a
    position outside the bitmap, or whose slot is outside acc, is skipped and counted in bad."""
    t = cuda.grid(1)
    D = acc.shape[1]
    if t < positions.size * D:
        i, d = t // D, t % D
        j = positions[i]
        if outside(j, words.size << 6, bad, d == 0):
            return
        slot = slot_of(words, prefix, j)
        if not outside(slot, acc.shape[0], bad, d == 0):
            add_scaled(acc, slot, d, values, i, prescale)


@cuda.jit
def add_slots_kernel(acc, slots, values, prescale, bad=None):
    """acc[slots[i]] += prescale * values[i] (the slots known from a sort of the positions); a
    slot outside acc is skipped and counted in bad."""
    t = cuda.grid(1)
    D = acc.shape[1]
    if t < slots.size * D:
        i, d = t // D, t % D
        if not outside(slots[i], acc.shape[0], bad, d == 0):
            add_scaled(acc, slots[i], d, values, i, prescale)


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

@cuda.jit(device=True)
def server_bits(M, n, p):
    """|I_p| = ceil((M - p) / n), the positions of server p (h0.server_size): beyond it the
    inverse bijection's cycle walk need not end."""
    return (M - p + n - 1) // n


@cuda.jit
def units_of_bitmap_kernel(words, prefix, p, n, M, B, keys, out, bad=None):
    """Bit j of server p is unit pi^-1(j n + p), at out[slot(j)]: one thread per word. A bit
    past |I_p| or a slot past out is skipped and counted in bad."""
    w = cuda.grid(1)
    if w >= words.size:
        return
    x, k, b = words[w], prefix[w], 0
    while x:
        if x & _ONE:
            j = (w << 6) + b
            if not (outside(k, out.size, bad, True) or outside(j, server_bits(M, n, p), bad, True)):
                out[k] = unpermute_one_gpu(j * n + p, M, B, keys)
            k += 1
        x >>= _ONE
        b += 1


@cuda.jit
def units_of_positions_kernel(positions, p, n, M, B, keys, out, bad=None):
    """Position j of server p (the Pull's positions format) is unit pi^-1(j n + p); a position
    outside [0, |I_p|) is skipped and counted in bad."""
    i = cuda.grid(1)
    if i < positions.size and not outside(positions[i], server_bits(M, n, p), bad, True):
        out[i] = unpermute_one_gpu(numba.int64(positions[i]) * n + p, M, B, keys)


@cuda.jit
def bitmap_positions_kernel(words, prefix, out, bad=None):
    """The set bits' positions, ascending, into out: one thread per word. A slot past out is
    skipped and counted in bad."""
    w = cuda.grid(1)
    if w >= words.size:
        return
    x, k, b = words[w], prefix[w], 0
    while x:
        if x & _ONE:
            if not outside(k, out.size, bad, True):
                out[k] = (w << 6) + b
            k += 1
        x >>= _ONE
        b += 1


@cuda.jit
def scatter_kernel(out, rows, values, bad=None):
    """out[rows[i]] = values[i] (the server has scaled them: scale_rows_kernel); a row outside
    out is skipped and counted in bad."""
    t = cuda.grid(1)
    D = values.shape[1]
    if t < rows.size * D:
        i, d = t // D, t % D
        if not outside(rows[i], out.shape[0], bad, d == 0):
            out[rows[i], d] = values[i, d]


# ---- launches ------------------------------------------------------------------------------

def word_prefix_device(words, prefix, total, threads=THREADS, per_thread=WORDS_PER_THREAD):
    """prefix[w] = the set bits in words[:w] and total[0] = all of them (data_path.word_prefix),
    all on the device (total a 1-element int64 array, for the caller to read when it needs
    it): blocks of `threads` (<= THREADS) threads, each block per_thread * threads words."""
    if not 0 < threads <= THREADS:   # block_scan's shared array holds THREADS sums
        raise ValueError(f"word_prefix_device: 1 to {THREADS} threads a block, not {threads}")
    # A small bitmap needs fewer threads than a block holds (whole warps of them).
    threads = min(threads, max(32, (words.shape[0] + 32 * per_thread - 1) // (32 * per_thread) * 32))
    chunk = threads * per_thread
    blocks = (words.shape[0] + chunk - 1) // chunk
    if blocks:
        word_block_sums_kernel[blocks, threads](words, per_thread, prefix)
    block_offsets_kernel[1, threads](prefix, chunk, blocks, total)
    if blocks:
        word_prefix_blocks_kernel[blocks, threads](words, per_thread, prefix)


class _WordPrefixLaunch:
    """The old single-block kernel's name: word_prefix_kernel[grid, block](words, prefix,
    total) runs word_prefix_device, whatever the launch configuration."""

    def __getitem__(self, config):
        return word_prefix_device


word_prefix_kernel = _WordPrefixLaunch()


def word_prefix(words):
    """(prefix, total) of a device bitmap: prefix stays on the device; total is the one
    integer the protocol needs on the host (the size of the Pull buffer)."""
    prefix = cuda.device_array(words.shape[0], np.int64)
    total = cuda.device_array(1, np.int64)
    word_prefix_device(words, prefix, total)
    return prefix, int(total.copy_to_host()[0])


def launch_rows(kernel, rows, D, *args):
    """`kernel` with one thread per (row, column) of a rows x D block."""
    launch_1d(kernel, rows * D, *args)
