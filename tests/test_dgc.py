"""Deep Gradient Compression (zen_hvd/dgc.py): the sparsifier, the residual memory and the
argument checks in one process; the optimizer on real ranks in tests/mpi/dgc_cases.py."""
import math

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

import zen_hvd
from zen_hvd import dgc
from conftest import mpirun


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), ratio=st.floats(0.001, 1.0), zeros=st.floats(0.0, 0.99),
       nans=st.integers(0, 3), seed=st.integers(0, 2**31 - 1), start=st.integers(0, 1000))
# A NaN as the sample's threshold once passed every entry, and the trim to k then took zeros.
@example(n=128, ratio=0.5, zeros=0.75, nans=1, seed=3824, start=389)
def test_top_k_takes_the_largest_and_never_more_than_k(n, ratio, zeros, nans, seed, start):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) ** 3
    x[torch.rand(n, generator=g) < zeros] = 0
    nan_at = torch.randint(0, n, (nans,), generator=g)
    x[nan_at] = math.nan
    k = max(1, math.ceil(ratio * n))
    mag = x.abs()
    chosen = dgc.top_k(mag, k, 0.01, start=start)
    assert chosen.numel() <= k
    assert chosen.numel() == 0 or bool((chosen[1:] > chosen[:-1]).all())      # ascending, unique
    picked = torch.zeros(n, dtype=torch.bool)
    picked[chosen] = True
    assert not bool((mag[picked] == 0).any())                                 # zeros never sent
    if torch.unique(nan_at).numel() <= k:
        assert bool(picked[nan_at].all())                                     # NaN always sent
    finite = ~torch.isnan(mag)
    sel, rest = mag[picked & finite], mag[~picked & finite]
    if sel.numel() and rest.numel():
        assert float(sel.min()) >= float(rest.max())                          # the largest ones


def test_top_k_is_close_to_k_on_a_gradient_like_vector():
    x = torch.randn(1_000_000, generator=torch.Generator().manual_seed(1))
    for ratio in (0.05, 0.01, 0.001):
        k = math.ceil(ratio * x.numel())
        chosen = dgc.top_k(x.abs(), k, 0.01)
        assert dgc.LOW * k <= chosen.numel() <= k, (ratio, chosen.numel(), k)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_memory_conserves_the_gradient(momentum):
    """Error feedback: everything accumulated is either sent or still kept. With momentum
    correction, v follows u <- m u + g, v <- v + u, both cleared where sent (float64 reference)."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.zeros(40, 25))
    bucket = dgc.Bucket("b", [p], dgc.DGC(ratio=0.07, momentum=momentum))
    u = torch.zeros(p.numel(), dtype=torch.float64)
    v = torch.zeros_like(u)
    total_sent = torch.zeros_like(u)
    total_accumulated = torch.zeros_like(u)
    for _ in range(12):
        p.grad = torch.randn_like(p)
        g = p.grad.reshape(-1).double()
        u = momentum * u + g
        v = v + u
        total_accumulated += u
        sent = bucket.compress(bucket.flat_gradient(), 1).coalesce()
        idx = sent.indices()[0]
        assert torch.allclose(sent.values().double(), v[idx], rtol=1e-5, atol=1e-6)
        total_sent[idx] += sent.values().double()
        v[idx] = 0
        u[idx] = 0 if momentum else u[idx]
        assert torch.allclose(bucket.memory.v.double(), v, rtol=1e-5, atol=1e-5)
        # sent + kept = accumulated
        assert torch.allclose(total_sent + bucket.memory.v.double(), total_accumulated, rtol=1e-5, atol=1e-4)
    assert 0 < idx.numel() <= math.ceil(0.07 * p.numel())


def test_each_parameter_of_a_bucket_keeps_its_own_top_ratio():
    """A bucket fuses the sync, not the selection: a layer with small gradients still sends its
    top ratio next to one with large gradients."""
    small, large = torch.nn.Parameter(torch.zeros(30, 30)), torch.nn.Parameter(torch.zeros(50, 20))
    small.grad, large.grad = torch.randn(30, 30) * 1e-4, torch.randn(50, 20) * 10
    bucket = dgc.Bucket("b", [small, large], dgc.DGC(ratio=0.05, momentum=0.0))
    sent = bucket.compress(bucket.flat_gradient(), 1).indices()[0]
    assert (sent < 900).sum() == math.ceil(0.05 * 900) and (sent >= 900).sum() == math.ceil(0.05 * 1000)
    assert bool((sent[1:] > sent[:-1]).all())


def test_warmup_densities_then_the_target():
    d = dgc.DGC(ratio=0.01, warmup_steps=10)
    assert [d.density(s) for s in (0, 9, 10, 20, 30, 40, 1000)] == [0.25, 0.25, 0.0625, 0.015625, 0.01, 0.01, 0.01]
    assert dgc.DGC(ratio=0.05).density(0) == 0.05
    assert dgc.DGC(ratio=0.05, warmup_steps=1).density(2) == 0.05   # a sparser stage is skipped


def test_local_clipping_scales_to_the_norm_over_sqrt_n():
    p = torch.nn.Parameter(torch.zeros(10, 10))
    p.grad = torch.full_like(p, 3.0)   # norm 30
    b = dgc.Bucket("b", [p], dgc.DGC(ratio=1.0, momentum=0.0, clip_norm=2.0))
    sent = b.compress(b.flat_gradient(), 4)
    assert math.isclose(float(torch.linalg.vector_norm(sent.values())), 1.0, rel_tol=1e-5)


def test_buckets_fuse_up_to_the_byte_limit_and_split_by_dtype():
    ps = [(f"p{i}", torch.nn.Parameter(torch.zeros(10, 10))) for i in range(5)]
    ps.append(("h", torch.nn.Parameter(torch.zeros(10, 10, dtype=torch.float64))))
    bs = dgc.buckets(ps, dgc.DGC(bucket_bytes=1000))   # 400 B per float32 parameter
    assert [len(b.params) for b in bs] == [2, 2, 1, 1]
    assert bs[-1].params[0].dtype == torch.float64
    assert len({b.name for b in bs}) == len(bs)


@pytest.mark.parametrize("kw, text", [
    (dict(ratio=0.0), "ratio must be in (0, 1]"), (dict(ratio=1.5), "ratio must be in (0, 1]"),
    (dict(bucket_bytes=0), "bucket_bytes must be a positive integer"),
    (dict(momentum=1.0), "momentum must be in [0, 1)"),
    (dict(sample_ratio=0), "sample_ratio"), (dict(warmup_steps=-1), "warmup_steps"),
    (dict(clip_norm=0), "clip_norm")])
def test_bad_settings_name_the_argument(kw, text):
    with pytest.raises(ValueError, match=__import__("re").escape(text)):
        zen_hvd.Compression.dgc(**kw)


def test_compression_keeps_horovods_choices():
    import horovod.torch as hvd

    assert zen_hvd.Compression.none is hvd.Compression.none
    assert zen_hvd.Compression.fp16 is hvd.Compression.fp16
    assert isinstance(zen_hvd.Compression.dgc(), zen_hvd.DGC)


@pytest.mark.parametrize("ranks", [2, 3])
def test_dgc_optimizer_cases(ranks):
    proc = mpirun(ranks, "dgc_cases.py", timeout=300)
    assert "all DGC cases passed (" in proc.stdout and f"{ranks} ranks" in proc.stdout
