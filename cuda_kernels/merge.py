"""Kernels of the centralized schemes (hierarchical centralization, SparCML): the merge of two
aggregated sets, one pass each (CPU, njit).

A sparse set is (units ascending and unique, int64 [K]; values [K, D]); a dense set is the
[M, D] table. Both partners of a hierarchy stage merge the same two sets with the same kernel
(the lower-rank group's set first), so they compute the same bits.
"""
import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def merge_sorted(ua, va, ub, vb):
    """The union of two ascending sets and their values, va[i] + vb[j] where the units meet
    (one pass over the indices to size the output, one over the values to fill it)."""
    na, nb, D = ua.size, ub.size, va.shape[1]
    i = j = K = 0
    while i < na and j < nb:
        if ua[i] <= ub[j]:
            j += ua[i] == ub[j]
            i += 1
        else:
            j += 1
        K += 1
    K += (na - i) + (nb - j)
    units = np.empty(K, np.int64)
    values = np.empty((K, D), va.dtype)
    i = j = 0
    for k in range(K):
        if j >= nb or (i < na and ua[i] < ub[j]):
            units[k] = ua[i]
            values[k] = va[i]
            i += 1
        elif i >= na or ub[j] < ua[i]:
            units[k] = ub[j]
            values[k] = vb[j]
            j += 1
        else:
            units[k] = ua[i]
            for d in range(D):
                values[k, d] = va[i, d] + vb[j, d]
            i += 1
            j += 1
    return units, values


@numba.njit(cache=True, nogil=True)
def add_rows(out, units, values):
    """out[units[i]] += values[i]: a sparse set added into a dense table (into a zeroed one,
    the set made dense)."""
    D = values.shape[1]
    for i in range(units.size):
        u = units[i]
        for d in range(D):
            out[u, d] += values[i, d]
