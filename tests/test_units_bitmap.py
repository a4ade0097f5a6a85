"""Single-process tests of the pieces under the sync: units, header checks."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zen_hvd import header, stats, units


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2 ** 40), unique=True, max_size=500))
def testascending_order_is_argsort(values):
    u = np.array(values, dtype=np.int64)
    np.testing.assert_array_equal(units.ascending_order(u), np.argsort(u, kind="stable"))


def test_large_units_fall_back_to_argsort():
    u = np.array([2 ** 62 - 1, 5, 2 ** 61], dtype=np.int64)
    np.testing.assert_array_equal(units.ascending_order(u), [1, 2, 0])


@pytest.mark.parametrize("make, sparse_dim, M, D", [
    (lambda: torch.zeros(10, 4), 1, 10, 4),                                  # dense 2-D: rows
    (lambda: torch.zeros(10), 1, 10, 1),                                     # dense 1-D: elements
    (lambda: torch.zeros(2, 3, 4), 3, 24, 1),                                # dense 3-D: elements
    (lambda: torch.zeros(10, 4).to_sparse(1), 1, 10, 4),                     # hybrid row-sparse
    (lambda: torch.zeros(10, 4).to_sparse(), 2, 40, 1),                      # element-sparse
    (lambda: torch.zeros(5, 6, 7).to_sparse(2), 2, 30, 7),                   # hybrid 3-D
])
def test_layout_rules(make, sparse_dim, M, D):
    lay = units.layout_of(make())
    assert (lay.sparse_dim, lay.num_units, lay.unit_size) == (sparse_dim, M, D)


def test_units_round_trip_sums_duplicates_and_keeps_nan():
    t = torch.sparse_coo_tensor(torch.tensor([[4, 1, 4]]), torch.tensor([[1.0, 2], [3, 4], [5, float("nan")]]), (6, 2),
                                check_invariants=True)
    lay = units.layout_of(t)
    u, v, err, _ = units.to_units(t, lay)
    assert err == units.OK and u.tolist() == [1, 4]
    assert torch.equal(v[0], torch.tensor([3.0, 4])) and v[1, 0] == 6 and torch.isnan(v[1, 1])
    back = units.sparse_result(lay, u, v)
    assert back.is_coalesced() and torch.allclose(back.to_dense(), t.to_dense(), equal_nan=True)
    assert not units.sparse_result(lay, u[::-1].copy(), v.flip(0)).is_coalesced()
    dense = torch.zeros(5, 3)
    dense[2, 1] = float("inf")
    u, v, _, _ = units.to_units(dense, units.layout_of(dense))
    assert u.tolist() == [2] and torch.isinf(v[0, 1])


def test_out_of_range_index_is_reported():
    t = torch.sparse_coo_tensor(torch.tensor([[1, 7]]), torch.ones(2), (5,), check_invariants=False)
    _, _, err, detail = units.to_units(t, units.layout_of(t))
    assert err == units.INDEX_OUT_OF_RANGE and detail == 7


def _table(rows):
    return np.stack(rows)


def test_header_mismatch_messages_name_tensor_and_ranks():
    a = units.layout_of(torch.zeros(10, 4))
    b = units.layout_of(torch.zeros(10, 5))
    ok = header.make_header("emb", a, 1, 42, 0, counts=[1, 2], error=units.OK, error_detail=0, nnz=3)
    header.check_table("emb", _table([ok, ok]))
    with pytest.raises(header.TensorMismatchError, match=r"'emb'.*shape differs.*rank 0: \(10, 4\), rank 1: \(10, 5\)"):
        header.check_table("emb", _table([ok, header.make_header("emb", b, 1, 42, 0, counts=[1, 2], error=units.OK, error_detail=0, nnz=3)]))
    with pytest.raises(header.TensorMismatchError, match="seed differs"):
        header.check_table("emb", _table([ok, header.make_header("emb", a, 1, 43, 0, counts=[1, 2], error=units.OK, error_detail=0, nnz=3)]))
    with pytest.raises(header.TensorMismatchError, match="different tensors"):
        header.check_table("emb", _table([ok, header.make_header("other", a, 1, 42, 0, counts=[1, 2], error=units.OK, error_detail=0, nnz=3)]))
    bad = header.make_header("emb", a, 1, 42, 0, counts=[0, 0], error=units.INDEX_OUT_OF_RANGE, error_detail=99, nnz=3)
    with pytest.raises(header.InvalidTensorError, match="rank 1 has a sparse index out of range.*99"):
        header.check_table("emb", _table([ok, bad]))


def test_imbalance_ratios():
    assert stats.push_imbalance(np.array([[5, 5], [2, 6]])) == pytest.approx(1.5)
    assert stats.pull_imbalance(np.array([10, 30])) == pytest.approx(1.5)
    assert stats.push_imbalance(np.zeros((2, 2), np.int64)) == 1.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-5, 50), max_size=200), st.booleans())
def test_sorted_unique_matches_numpy(values, presort):
    a = np.array(sorted(values) if presort else values, dtype=np.int64)
    u, inv = units.sorted_unique(a, return_inverse=True)
    ref_u, ref_inv = np.unique(a, return_inverse=True)
    np.testing.assert_array_equal(u, ref_u)
    np.testing.assert_array_equal(inv, ref_inv.reshape(-1))
    np.testing.assert_array_equal(units.sorted_unique(a), ref_u)
