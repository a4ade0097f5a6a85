"""The data path's kernels (cuda_kernels/data_path.py) against independent numpy references."""
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zen_hvd.cuda_kernels import data_path as k
from zen_hvd.cuda_kernels import h0


@settings(max_examples=40, deadline=None)
@given(M=st.integers(1, 5000), n=st.integers(1, 9), nnz=st.integers(0, 300), seed=st.integers(0, 2 ** 31))
def test_partition_and_pack_sum_duplicates_into_each_servers_part(M, n, nnz, seed):
    rng = np.random.default_rng(seed)
    units = rng.integers(0, M, nnz)
    values = rng.standard_normal((nnz, 3))
    keys = h0.derive_keys(seed)
    part, local, pos, counts, bad = k.partition(units, M, h0.domain_bits(M), n, keys, False)
    assert bad == -1
    ref_part, ref_pos = h0.partition_cpu(units, M, n, keys)
    np.testing.assert_array_equal(part, ref_part)
    np.testing.assert_array_equal(pos, ref_pos)
    uniq = np.unique(units)
    np.testing.assert_array_equal(counts, np.bincount(h0.partition_cpu(uniq, M, n, keys)[0], minlength=n))
    # pack into one flat buffer, parts back to back (offsets in elements)
    off = np.cumsum(counts) - counts
    idx = np.zeros(max(1, counts.sum()), np.int64)
    val = np.zeros(max(1, counts.sum()) * 3)
    k.pack(idx, val, off, off * 3, part, local, pos, units, values, False, False)
    got = {}
    for p in range(n):
        for r in range(counts[p]):
            got[(p, idx[off[p] + r])] = val[(off[p] + r) * 3:(off[p] + r + 1) * 3]
    for u in uniq:
        y = h0.permute_cpu(np.array([u]), M, keys)[0]
        np.testing.assert_allclose(got[(y % n, y // n)], values[units == u].sum(axis=0), rtol=1e-12)
    assert len(got) == uniq.size


def test_partition_reports_the_first_index_out_of_range():
    units = np.array([3, 7, 12, -1])
    *_, bad = k.partition(units, 10, h0.domain_bits(10), 2, h0.derive_keys(1), True)
    assert bad == 2


@settings(max_examples=40, deadline=None)
@given(nbits=st.integers(1, 3000), seed=st.integers(0, 2 ** 31))
def test_bitmap_slots_are_ranks_among_set_bits(nbits, seed):
    rng = np.random.default_rng(seed)
    parts = [rng.integers(0, nbits, rng.integers(0, 200)) for _ in range(3)]
    words = np.zeros((nbits + 63) // 64, np.uint64)
    for j in parts:
        k.set_bits(words, j)
    allpos = np.unique(np.concatenate(parts))
    # byte layout: bit j is bit j & 7 of byte j >> 3 (numpy's little bit order)
    bits = np.zeros(words.size * 64, np.uint8)
    bits[allpos] = 1
    assert words.view(np.uint8).tobytes() == np.packbits(bits, bitorder="little").tobytes()
    prefix, K = k.word_prefix(words)
    assert K == allpos.size
    out = np.empty(K, np.int64)
    k.bitmap_positions(words, out)
    np.testing.assert_array_equal(out, allpos)
    acc = np.zeros((K, 2))
    vals = [rng.standard_normal((j.size, 2)) for j in parts]
    for j, v in zip(parts, vals):
        k.add_part(acc, words, prefix, j, v, 0.5)
    ref = np.zeros((K, 2))
    for j, v in zip(parts, vals):
        np.add.at(ref, np.searchsorted(allpos, j), 0.5 * v)
    np.testing.assert_allclose(acc, ref, rtol=1e-12)


@settings(max_examples=30, deadline=None)
@given(M=st.integers(1, 4000), n=st.integers(1, 8), seed=st.integers(0, 2 ** 31))
def test_units_of_bitmap_and_positions_invert_h0(M, n, seed):
    keys = h0.derive_keys(seed)
    p = seed % n
    nbits = h0.server_size(M, n, p)
    j = np.unique(np.random.default_rng(seed).integers(0, max(1, nbits), 50)) if nbits else np.zeros(0, np.int64)
    words = np.zeros((nbits + 63) // 64, np.uint64)
    k.set_bits(words, j)
    a, b = np.empty(j.size, np.int64), np.empty(j.size, np.int64)
    k.units_of_bitmap(words, p, n, M, h0.domain_bits(M), keys, a)
    k.units_of_positions(j.astype(np.int32), p, n, M, h0.domain_bits(M), keys, b)
    ref = h0.units_of_cpu(p, j, M, n, keys)
    np.testing.assert_array_equal(a, ref)
    np.testing.assert_array_equal(b, ref)


def test_scale_rows_scales_floats_and_truncates_integer_averages_then_scatter_places_them():
    vals = np.array([[7, -7], [5, -1]], np.int64)
    acc = vals.copy()
    k.scale_rows(acc, 1.0, 3)
    out = np.zeros((4, 2), np.int64)
    k.scatter(out, np.array([3, 0]), acc)
    ref = torch.from_numpy(vals).div(3, rounding_mode="trunc").numpy()
    np.testing.assert_array_equal(out[[3, 0]], ref)
    np.testing.assert_array_equal(out[[1, 2]], 0)
    acc = vals.astype(np.float32)
    k.scale_rows(acc, 0.25, 0)
    f = np.zeros((2, 2), np.float32)
    k.scatter(f, np.array([1, 0]), acc)
    np.testing.assert_array_equal(f, np.array([[1.25, -0.25], [1.75, -1.75]], np.float32))
    same = vals.astype(np.float64)
    k.scale_rows(same, 1.0, 0)
    np.testing.assert_array_equal(same, vals)
