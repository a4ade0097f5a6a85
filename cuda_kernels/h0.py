"""h0, the first-level (partition) hash of Algorithm 1, as a keyed bijection of [0, M).

Every worker must map a unit u to the same server (Problem 1, Section 3.1), and the hash
bitmap (Section 3.3) needs I_p = {u : h0(u) = p} and "bit j of server p" <-> unit. With a
keyed pseudo-random permutation pi of [0, M) both are arithmetic, with no O(M) table:

    partition  p = pi(u) mod n,      position inside I_p  j = pi(u) div n,
    |I_p| = ceil((M - p) / n),       bit j of server p  ->  u = pi^{-1}(j * n + p).

pi is a 4-round Feistel network on B = max(2, ceil(log2 M)) bits with murmur3_32 as round
function, restricted to [0, M) by cycle walking (y = F(u); while y >= M: y = F(y)); since
2^B < 2M the walk takes < 2 steps on average. Halves are at most 31 bits (M <= 2^62), so a
half always fits murmur's 32-bit key. Round r splits x into hi (a bits) and lo (b = B - a):
x' = (lo << a) | (hi ^ (murmur3_32(lo, key_r) mod 2^a)), which swaps the widths every round.
"""
import functools

import numba
import numpy as np
from numba import cuda

from .murmur import MASK32, murmur3_32, murmur3_32_cpu, murmur3_32_gpu

ROUNDS = 4  # even, so the half widths return to (B // 2, B - B // 2)
MAX_M = 1 << 62
_SECOND_LEVEL_TAG = 0x5A454E32  # separates h_1..h_k seeds from h0's round keys


def _seed32(seed):
    """Fold any integer seed into [0, 2^32)."""
    seed &= (1 << 64) - 1
    return murmur3_32(seed >> 32, seed & MASK32)


def derive_keys(seed):
    """The ROUNDS Feistel round keys of h0; must be the same on every worker."""
    s = _seed32(seed)
    return np.array([murmur3_32(r, s) for r in range(ROUNDS)], dtype=np.int64)


def second_level_seeds(seed, rank, k):
    """Seeds s_1..s_k of the second-level hashes h_1..h_k (may differ per worker, Sec. 3.2)."""
    return np.array(_second_level_seeds(int(seed), int(rank), int(k)), dtype=np.int64)


@functools.lru_cache(maxsize=1024)
def _second_level_seeds(seed, rank, k):
    """second_level_seeds as a tuple, computed once per (seed, rank, k): murmur in Python is a
    few microseconds a call, and every sync asks."""
    s = murmur3_32(rank & MASK32, murmur3_32(_SECOND_LEVEL_TAG, _seed32(seed)))
    return tuple(murmur3_32(t, s) for t in range(k))


def domain_bits(M):
    """B = max(2, ceil(log2 M)): pi runs on [0, 2^B) with 2^B < 2M."""
    if not 1 <= M <= MAX_M:
        raise ValueError(f"h0 needs 1 <= M <= 2^62 units, got M = {M}")
    return max(2, (M - 1).bit_length())


def server_size(M, n, p):
    """|I_p| = ceil((M - p) / n), the number of units of partition p (bits of its bitmap)."""
    return max(0, (M - p + n - 1) // n)


def _build(jit, murmur3_32):
    """pi and pi^{-1} of one unit, compiled with `jit` (numba.njit or cuda.jit(device=True))."""

    @jit
    def feistel(x, B, keys):
        a = B // 2
        for r in range(ROUNDS):
            b = B - a
            hi = x >> b
            lo = x & ((1 << b) - 1)
            x = (lo << a) | (hi ^ (murmur3_32(lo, keys[r]) & ((1 << a) - 1)))
            a = b
        return x

    @jit
    def feistel_inv(x, B, keys):
        for r in range(ROUNDS - 1, -1, -1):
            a = B // 2 if r % 2 == 0 else B - B // 2  # hi width of forward round r
            b = B - a
            lo = x >> a
            hi = (x & ((1 << a) - 1)) ^ (murmur3_32(lo, keys[r]) & ((1 << a) - 1))
            x = (hi << b) | lo
        return x

    @jit
    def permute_one(u, M, B, keys):
        y = feistel(u, B, keys)
        while y >= M:  # cycle walk: u's cycle returns into [0, M)
            y = feistel(y, B, keys)
        return y

    @jit
    def unpermute_one(y, M, B, keys):
        u = feistel_inv(y, B, keys)
        while u >= M:
            u = feistel_inv(u, B, keys)
        return u

    return permute_one, unpermute_one


_permute_one_cpu, _unpermute_one_cpu = _build(numba.njit(cache=True, nogil=True), murmur3_32_cpu)
permute_one_gpu, unpermute_one_gpu = _build(cuda.jit(device=True), murmur3_32_gpu)


# ---- CPU twins --------------------------------------------------------------------------

# Serial on purpose: each rank is one process, and several ranks usually share a machine's
# cores, so threads inside a rank would only oversubscribe them.
@numba.njit(cache=True, nogil=True)
def _permute_cpu(units, M, B, keys, inverse):
    out = np.empty_like(units)
    for i in range(units.size):
        if inverse:
            out[i] = _unpermute_one_cpu(units[i], M, B, keys)
        else:
            out[i] = _permute_one_cpu(units[i], M, B, keys)
    return out


def permute_cpu(units, M, keys):
    """pi(units) for int64 units in [0, M)."""
    return _permute_cpu(np.asarray(units, np.int64), M, domain_bits(M), keys, False)


def unpermute_cpu(y, M, keys):
    """pi^{-1}(y) for int64 y in [0, M)."""
    return _permute_cpu(np.asarray(y, np.int64), M, domain_bits(M), keys, True)


def partition_cpu(units, M, n, keys):
    """(part, pos) = (pi(u) mod n, pi(u) div n): server of each unit and its bit inside I_p."""
    y = permute_cpu(units, M, keys)
    return y % n, y // n


def units_of_cpu(p, pos, M, n, keys):
    """Units at bit positions `pos` of server p: pi^{-1}(pos * n + p) (Section 3.3 decode)."""
    return unpermute_cpu(np.asarray(pos, np.int64) * n + p, M, keys)


# ---- GPU ----------------------------------------------------------------------------------

@cuda.jit
def permute_kernel(units, M, B, keys, out):
    i = cuda.grid(1)
    if i < units.size:
        out[i] = permute_one_gpu(units[i], M, B, keys)


@cuda.jit
def unpermute_kernel(y, M, B, keys, out):
    i = cuda.grid(1)
    if i < y.size:
        out[i] = unpermute_one_gpu(y[i], M, B, keys)


THREADS = 256


def launch_1d(kernel, size, *args):
    """Launch `kernel` with one thread per element of a length-`size` range."""
    if size > 0:
        kernel[(size + THREADS - 1) // THREADS, THREADS](*args)


def _map_gpu(kernel, values, M, keys):
    on_host = isinstance(values, np.ndarray)
    d_values = cuda.to_device(np.ascontiguousarray(values, np.int64)) if on_host else values
    out = cuda.device_array(d_values.shape[0], np.int64)
    launch_1d(kernel, d_values.shape[0], d_values, M, domain_bits(M), cuda.to_device(keys), out)
    return out.copy_to_host() if on_host else out


def permute_gpu(units, M, keys):
    """pi(units) on the GPU; numpy in -> numpy out, device array in -> device array out."""
    return _map_gpu(permute_kernel, units, M, keys)


def unpermute_gpu(y, M, keys):
    """pi^{-1}(y) on the GPU; numpy in -> numpy out, device array in -> device array out."""
    return _map_gpu(unpermute_kernel, y, M, keys)
