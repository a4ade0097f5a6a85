"""MurmurHash3 x86_32 of one 4-byte key: the second-level hashes h_1..h_k of Algorithm 1.

The paper (Section 3.2) uses MurmurHash with a different seed per hash function. One source
serves three targets, built by `_build(jit)`:

- `murmur3_32`, `hash64`: plain Python (reference, and what the CUDA simulator runs);
- `murmur3_32_cpu`, `hash64_cpu`: numba.njit;
- `murmur3_32_gpu`, `hash64_gpu`: numba.cuda device functions.

All arithmetic is int64 with explicit 32-bit masks; `mul32` splits one factor into 16-bit
halves so no intermediate reaches 2^49 (no int64 overflow, no uint64/int64 mixing, which
numba would promote to float64).
"""
import numba
from numba import cuda

MASK32 = 0xFFFFFFFF


def _build(jit):
    """Compile the hash family with `jit` (identity, numba.njit or cuda.jit(device=True))."""

    @jit
    def mul32(a, b):
        # (a * b) mod 2^32 for a, b in [0, 2^32), via b = b_hi * 2^16 + b_lo.
        return (a * (b & 0xFFFF) + (((a * (b >> 16)) & 0xFFFF) << 16)) & MASK32

    @jit
    def rotl32(x, r):
        return ((x << r) | (x >> (32 - r))) & MASK32

    @jit
    def murmur3_32(key, seed):
        """MurmurHash3_x86_32 of the little-endian 4-byte `key`; key, seed, result in [0, 2^32)."""
        k = mul32(rotl32(mul32(key, 0xCC9E2D51), 15), 0x1B873593)
        h = rotl32(seed ^ k, 13)
        h = ((h * 5 + 0xE6546B64) & MASK32) ^ 4  # body step, then length = 4 bytes
        h ^= h >> 16  # fmix32
        h = mul32(h, 0x85EBCA6B)
        h ^= h >> 13
        h = mul32(h, 0xC2B2AE35)
        return h ^ (h >> 16)

    @jit
    def hash64(u, seed):
        """Hash of a unit index u in [0, 2^62): murmur of the low word seeded by the high word's."""
        return murmur3_32(u & MASK32, murmur3_32(u >> 32, seed))

    return murmur3_32, hash64


murmur3_32, hash64 = _build(lambda f: f)
murmur3_32_cpu, hash64_cpu = _build(numba.njit(cache=True))
murmur3_32_gpu, hash64_gpu = _build(cuda.jit(device=True))
