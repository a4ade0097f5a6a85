"""cuda_kernels: murmur, h0 and hierarchical hashing; CPU twins, CUDA simulator, PTX compile.

The simulator and PTX parts run in subprocesses: NUMBA_ENABLE_CUDASIM must be set before numba
is imported, and PTX must be compiled by the real CUDA target (the simulator type-checks
nothing).
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from zen_hvd.cuda_kernels import h0, hierarchical_hashing as hh
from zen_hvd.cuda_kernels.murmur import hash64, hash64_cpu, murmur3_32, murmur3_32_cpu

U32 = st.integers(0, 2**32 - 1)
MS = [1, 2, 3, 1000, 2**20 + 7, 2**40 + 5]
KEYS = h0.derive_keys(2025)


try:   # the independent MurmurHash3 reference; a GPU machine may not have it
    import mmh3
except ImportError:
    mmh3 = None
needs_mmh3 = pytest.mark.skipif(mmh3 is None, reason="mmh3 (the reference MurmurHash3) is not installed")


def mmh3_u32(key, seed):
    return mmh3.hash(struct.pack("<I", key), seed, signed=False)


# ---- murmur --------------------------------------------------------------------------------

@needs_mmh3
@settings(max_examples=500, deadline=None)
@given(U32, U32)
@example(0, 0)
@example(2**32 - 1, 2**32 - 1)
@example(0, 2**32 - 1)
@example(2**32 - 1, 0)
def test_murmur3_32_matches_mmh3(key, seed):
    assert murmur3_32_cpu(key, seed) == murmur3_32(key, seed) == mmh3_u32(key, seed)


@needs_mmh3
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**62 - 1), U32)
@example(0, 0)
@example(2**62 - 1, 2**32 - 1)
def test_hash64_matches_mmh3(u, seed):
    expected = mmh3_u32(u & 0xFFFFFFFF, mmh3_u32(u >> 32, seed))
    assert hash64_cpu(u, seed) == hash64(u, seed) == expected


# ---- h0 ------------------------------------------------------------------------------------

def reference_permute(u, M, keys):
    """Independent pi: 4-round unbalanced Feistel on B bits (mmh3 round function), cycle walk."""
    B = max(2, (M - 1).bit_length())

    def feistel(x):
        a = B // 2
        for key in keys:
            b = B - a
            hi, lo = x >> b, x % (1 << b)
            x = lo * (1 << a) + (hi ^ (mmh3_u32(lo, int(key)) % (1 << a)))
            a = b
        return x

    y = feistel(u)
    while y >= M:
        y = feistel(y)
    return y


def random_units(M, size, seed=0):
    rng = np.random.default_rng(seed)
    if M <= size:
        return np.arange(M, dtype=np.int64)
    return np.unique(rng.integers(0, M, size, dtype=np.int64))


@needs_mmh3
@pytest.mark.parametrize("M", MS)
def test_permute_matches_reference(M):
    u = random_units(M, 300)
    assert h0.permute_cpu(u, M, KEYS).tolist() == [reference_permute(int(x), M, KEYS) for x in u]


@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 17, 1000, 4096, 4097])
def test_permute_is_bijection(M):
    y = h0.permute_cpu(np.arange(M), M, KEYS)
    assert np.array_equal(np.sort(y), np.arange(M))


@pytest.mark.parametrize("M", MS + [2**62])
def test_unpermute_inverts_permute(M):
    u = random_units(M, 5000)
    y = h0.permute_cpu(u, M, KEYS)
    assert ((0 <= y) & (y < M)).all()
    assert np.array_equal(h0.unpermute_cpu(y, M, KEYS), u)


@pytest.mark.parametrize("M,n", [(1, 1), (3, 8), (1000, 7), (2**20 + 7, 16), (2**40 + 5, 128)])
def test_units_of_inverts_partition(M, n):
    u = random_units(M, 5000)
    part, pos = h0.partition_cpu(u, M, n, KEYS)
    for p in range(n):
        mine = part == p
        assert (pos[mine] < h0.server_size(M, n, p)).all()
        assert np.array_equal(h0.units_of_cpu(p, pos[mine], M, n, KEYS), u[mine])


@pytest.mark.parametrize("M,n", [(1, 1), (3, 8), (1000, 7), (4099, 16)])
def test_server_size_counts_partition(M, n):
    part, _ = h0.partition_cpu(np.arange(M), M, n, KEYS)
    assert [h0.server_size(M, n, p) for p in range(n)] == np.bincount(part, minlength=n).tolist()


def test_keys_are_deterministic():
    assert np.array_equal(h0.derive_keys(7), h0.derive_keys(7))
    assert not np.array_equal(h0.derive_keys(7), h0.derive_keys(8))
    s = h0.second_level_seeds(7, rank=3, k=3)
    assert s.shape == (3,) and s.dtype == np.int64 and len(set(s.tolist())) == 3
    assert not np.array_equal(s, h0.second_level_seeds(7, rank=4, k=3))


def test_domain_bits_rejects_bad_M():
    for M in (0, 2**62 + 1):
        with pytest.raises(ValueError):
            h0.domain_bits(M)


# ---- hierarchical hashing: CPU twin ----------------------------------------------------

def blocks(order, counts):
    starts = np.cumsum(counts) - counts
    return [order[s:s + c] for s, c in zip(starts, counts)]


@pytest.mark.parametrize("M,n,nnz", [(1000, 4, 1000), (2**24, 16, 20000), (2**40 + 5, 7, 3000),
                                     (50, 64, 20), (10, 3, 0)])
def test_group_by_partition_cpu(M, n, nnz):
    u = np.random.default_rng(1).permutation(random_units(M, nnz))
    order, counts, pos = hh.group_by_partition_cpu(u, M, n, KEYS)
    part, pos_in = h0.partition_cpu(u, M, n, KEYS)
    assert counts.sum() == u.size and np.array_equal(np.sort(order), np.arange(u.size))
    for p, block in enumerate(blocks(order, counts)):
        assert np.array_equal(block, np.flatnonzero(part == p))  # stable: ascending positions
    assert np.array_equal(pos, pos_in[order])


# ---- CUDA simulator ------------------------------------------------------------------------

SIM_SCRIPT = """
import json, numpy as np
from numba import cuda
from zen_hvd.cuda_kernels import h0, hierarchical_hashing as hh

def same_groups(u, gpu, cpu):
    (o, c, p), (oc, cc, pc) = gpu, cpu
    starts = np.cumsum(c) - c
    assert np.array_equal(c, cc), (c, cc)
    assert np.array_equal(np.sort(o), np.arange(u.size)), "a unit was lost or duplicated"
    for s, n_p in zip(starts, c):
        assert set(o[s:s + n_p]) == set(oc[s:s + n_p])
    pos_of = dict(zip(oc.tolist(), pc.tolist()))
    assert [pos_of[i] for i in o.tolist()] == p.tolist()

keys, seeds = h0.derive_keys(11), h0.second_level_seeds(11, rank=1, k=3)
rng = np.random.default_rng(5)
out = {}
for M in (3, 2**20 + 7, 2**40 + 5):
    u = np.unique(rng.integers(0, M, 200, dtype=np.int64))
    y = h0.permute_gpu(u, M, keys)
    assert np.array_equal(y, h0.permute_cpu(u, M, keys)), M
    assert np.array_equal(h0.unpermute_gpu(y, M, keys), u), M
d_y = h0.permute_gpu(cuda.to_device(u), M, keys)
assert not isinstance(d_y, np.ndarray) and np.array_equal(d_y.copy_to_host(), y)

M, n = 2**24, 4
u = rng.permutation(np.unique(rng.integers(0, M, 400, dtype=np.int64)))
cpu = hh.group_by_partition_cpu(u, M, n, keys)
for name, kw in [("default", {}), ("r1=2", dict(r1=2, r2=1, k=1)),
                 ("r1=1", dict(r1=1, r2=1, k=1))]:
    stats = {}
    same_groups(u, hh.group_by_partition_gpu(u, M, n, keys, seeds, stats=stats, **kw), cpu)
    out[name] = stats
empty = np.zeros(0, np.int64)
o, c, p = hh.group_by_partition_gpu(empty, M, n, keys, seeds)
assert o.size == 0 and p.size == 0 and c.tolist() == [0] * n
print("RESULT", json.dumps(out))
"""


def run_python(code, simulator):
    """stdout of `python -c code`, with or without the CUDA simulator. ZEN_HVD_REAL_GPU=1
    runs the simulator's scripts on the GPU instead (scripts/gpu_check.sh)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    if simulator and os.environ.get("ZEN_HVD_REAL_GPU") != "1":
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_gpu_kernels_in_simulator():
    stdout = run_python(SIM_SCRIPT, simulator=True)
    stats = json.loads(stdout.split("RESULT", 1)[1])
    assert stats["default"]["retries"] == 0
    for forced in ("r1=2", "r1=1"):  # heavy collisions: serial memory overflowed, then grew
        assert stats[forced]["retries"] >= 1 and stats[forced]["serial"] > 0


# ---- PTX compile (real CUDA target, no GPU needed) --------------------------------------

PTX_SCRIPT = """
import inspect, sys
from types import SimpleNamespace
from numba import cuda, types
import numba.cuda.dispatcher

cc = ({major}, {minor})
a, i = types.int64[::1], types.int64

def probe(x):
    x[0] = 1

try:
    cuda.compile_ptx(probe, (a,), cc=cc)
except Exception as e:  # NVVM / NVRTC libraries missing
    print("SKIP", type(e).__name__, e)
    sys.exit(0)
# Device functions are compiled for the *current* device's cc when a kernel calling them is
# typed; there is no GPU here, so report the target cc instead.
numba.cuda.dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc)

from zen_hvd.cuda_kernels import h0, hierarchical_hashing as hh
SCALARS = {{"M", "B", "n", "k", "r1", "r2", "value"}}
for kernel in (h0.permute_kernel, h0.unpermute_kernel, hh.hash_kernel, hh.compact_kernel, hh.fill_kernel):
    params = inspect.signature(kernel.py_func).parameters
    ptx, _ = cuda.compile_ptx(kernel.py_func, tuple(i if p in SCALARS else a for p in params),
                              cc=cc)
    assert ".target sm_{major}{minor}" in ptx
    atoms = sorted({{ln.split()[0] for ln in ptx.splitlines() if "atom." in ln}})
    print("KERNEL", kernel.py_func.__name__, " ".join(atoms))
"""


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
def test_kernels_compile_to_ptx(cc):
    stdout = run_python(PTX_SCRIPT.format(major=cc[0], minor=cc[1]), simulator=False)
    if stdout.startswith("SKIP"):
        pytest.skip(f"CUDA compiler libraries unavailable: {stdout.strip()}")
    atoms = {ln.split()[1]: ln.split()[2:] for ln in stdout.splitlines()
             if ln.startswith("KERNEL")}
    assert set(atoms) == {"permute_kernel", "unpermute_kernel", "hash_kernel", "compact_kernel",
                          "fill_kernel"}
    assert any("cas" in op for op in atoms["hash_kernel"]), atoms  # Algorithm 1's claim
