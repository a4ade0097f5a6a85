"""Numba kernels of Zen's data path, each GPU kernel beside its CPU twin.

- murmur: MurmurHash3 x86_32, the second-level hashes h_1..h_k (Section 3.2).
- h0: the partition hash h0 as a keyed bijection pi of [0, M): p = pi(u) mod n,
  bit j of server p <-> u = pi^{-1}(j n + p) (Sections 3.2 and 3.3).
- hierarchical_hashing: Algorithm 1, grouping a worker's units by partition without loss.
"""
