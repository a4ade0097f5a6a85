"""The GPU twins of the data path (cuda_kernels/data_path_gpu.py) against their CPU twins
(cuda_kernels/data_path.py) in Numba's CUDA simulator, bit for bit, and compiled to PTX for
compute capability 8.0 and 9.0 (real CUDA target, no GPU needed). Both run in subprocesses,
as NUMBA_ENABLE_CUDASIM must be set before numba is imported."""
import functools
import json

import pytest

from test_kernels import run_python

SIM_SCRIPT = r"""
import numpy as np
from numba import cuda
from zen_hvd.cuda_kernels import data_path as cpu, data_path_gpu as gpu, h0, hierarchical_hashing as hh

rng = np.random.default_rng(7)
launch_1d, launch_rows = h0.launch_1d, gpu.launch_rows
checked = []

def same(name, a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), (name, a, b)
    checked.append(name)

def words_of(positions, W):
    w = np.zeros(W, np.uint64)
    cpu.set_bits(w, positions)
    return w

def layout(counts, D, idt, vdt):
    # per server: [indices | values], each 8-byte aligned, as balanced.py lays them out
    isz, vsz = np.dtype(idt).itemsize, np.dtype(vdt).itemsize
    up8 = lambda x: (x + 7) // 8 * 8
    idx_bytes = np.array([up8(c * isz) for c in counts], np.int64)
    sizes = idx_bytes + np.array([up8(c * D * vsz) for c in counts], np.int64)
    offs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return np.zeros(int(sizes.sum()), np.uint8), offs // isz, (offs + idx_bytes) // vsz

# ---- 1. pack: hierarchical hashing's grouped order straight into the Push buffer ----
for M, n, nnz, D, idt, vdt, dense in [(1000, 3, 120, 4, np.int32, np.float32, False),
                                      (5000, 4, 300, 1, np.int64, np.float64, False),
                                      (200, 2, 60, 3, np.int32, np.float32, True),
                                      (64, 2, 0, 2, np.int32, np.float32, False)]:
    keys, seeds = h0.derive_keys(M), h0.second_level_seeds(M, rank=0, k=3)
    units = rng.permutation(rng.choice(M, nnz, replace=False)).astype(np.int64)
    values = rng.standard_normal((M if dense else nnz, D)).astype(vdt)
    order, counts, pos = hh.group_by_partition_gpu(units, M, n, keys, seeds)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    part, local, pos_i = (np.empty(nnz, np.int64) for _ in range(3))
    for p in range(n):
        for row, j in enumerate(range(starts[p], starts[p + 1])):
            part[order[j]], local[order[j]], pos_i[order[j]] = p, row, pos[j]
    buf_c, idx_off, val_off = layout(counts, D, idt, vdt)
    cpu.pack(buf_c.view(idt), buf_c.view(vdt), idx_off, val_off, part, local, pos_i, units, values, dense, True)
    d_buf = cuda.to_device(np.zeros_like(buf_c))
    launch_rows(gpu.pack_kernel, nnz, D, d_buf.view(idt), d_buf.view(vdt), cuda.to_device(idx_off),
                cuda.to_device(val_off), cuda.to_device(order), cuda.to_device(starts), cuda.to_device(pos),
                cuda.to_device(units), cuda.to_device(values), dense)
    same(f"pack M={M} n={n} dense={dense}", d_buf.copy_to_host(), buf_c)

# ---- 2. aggregate: bitmap, prefix, rank-order sums ----
for W, k in [(3, 40), (700, 900), (1, 64), (0, 0)]:   # 700 words: several words per thread
    positions = rng.integers(0, 64 * W, k).astype(np.int64) if W else np.zeros(0, np.int64)
    d_words = cuda.to_device(np.zeros(W, np.uint64))
    launch_1d(gpu.set_bits_kernel, k, d_words, cuda.to_device(positions))
    words = d_words.copy_to_host()
    same(f"set_bits W={W}", words, words_of(positions, W))
    prefix, total = gpu.word_prefix(d_words)
    c_prefix, c_total = cpu.word_prefix(words)
    same(f"word_prefix W={W}", prefix.copy_to_host(), c_prefix)
    assert total == c_total, (total, c_total)
    ones = np.zeros(c_total, np.int64)
    cpu.bitmap_positions(words, ones)
    d_out = cuda.to_device(np.zeros(c_total, np.int64))
    launch_1d(gpu.bitmap_positions_kernel, W, d_words, prefix, d_out)
    same(f"bitmap_positions W={W}", d_out.copy_to_host(), ones)

for D, vdt, prescale in [(4, np.float32, 1.0), (3, np.float64, 0.5), (1, np.float32, 0.25),
                         (2, np.float32, 1 / 3), (2, np.int64, 0.5)]:
    W, n = 20, 3
    parts = [np.sort(rng.choice(64 * W, 150, replace=False)).astype(np.int64) for _ in range(n)]
    words = words_of(np.concatenate(parts), W)
    prefix, total = cpu.word_prefix(words)
    vals = [(rng.standard_normal((150, D)) * 10).astype(vdt) for _ in range(n)]
    acc = np.zeros((total, D), vdt)
    d_acc = cuda.to_device(acc)
    d_words, d_prefix = cuda.to_device(words), cuda.to_device(prefix)
    for r in range(n):   # rank order, one launch per worker
        cpu.add_part(acc, words, prefix, parts[r], vals[r], prescale)
        launch_rows(gpu.add_part_kernel, parts[r].size, D, d_acc, d_words, d_prefix,
                    cuda.to_device(parts[r]), cuda.to_device(vals[r]), prescale)
    same(f"add_part D={D} {vdt.__name__} prescale={prescale}", d_acc.copy_to_host(), acc)
    slots = np.sort(rng.choice(total, 40, replace=False)).astype(np.int64)
    v = rng.standard_normal((40, D)).astype(vdt)
    cpu.add_slots(acc, slots, v, prescale)
    launch_rows(gpu.add_slots_kernel, 40, D, d_acc, cuda.to_device(slots), cuda.to_device(v), prescale)
    same(f"add_slots D={D}", d_acc.copy_to_host(), acc)

# ---- 3. decode and scatter ----
for M, n in [(1000, 3), (2**40 + 5, 4), (7, 1)]:
    keys, B = h0.derive_keys(3), h0.domain_bits(M)
    for p in range(n):
        size = h0.server_size(M, n, p)
        W = (min(size, 5000) + 63) // 64
        positions = np.unique(rng.integers(0, min(size, 64 * W), 50)).astype(np.int64)
        words = words_of(positions, W)
        prefix, total = cpu.word_prefix(words)
        ref = np.zeros(total, np.int64)
        cpu.units_of_bitmap(words, p, n, M, B, keys, ref)
        d_out = cuda.to_device(np.zeros(total, np.int64))
        launch_1d(gpu.units_of_bitmap_kernel, W, cuda.to_device(words), cuda.to_device(prefix), p, n, M, B,
                  cuda.to_device(keys), d_out)
        same(f"units_of_bitmap M={M} p={p}", d_out.copy_to_host(), ref)
        for idt in (np.int32, np.int64):   # the Pull's positions format
            pos = positions.astype(idt)
            ref = np.zeros(pos.size, np.int64)
            cpu.units_of_positions(pos, p, n, M, B, keys, ref)
            d_out = cuda.to_device(np.zeros(pos.size, np.int64))
            launch_1d(gpu.units_of_positions_kernel, pos.size, cuda.to_device(pos), p, n, M, B,
                      cuda.to_device(keys), d_out)
            same(f"units_of_positions M={M} p={p} {idt.__name__}", d_out.copy_to_host(), ref)

for vdt, scale, divisor in [(np.float32, 1.0, 0), (np.float64, 0.25, 0), (np.int64, 1.0, 3),
                            (np.float32, 1 / 3, 0), (np.int32, 0.5, 0)]:
    vals = (rng.standard_normal((30, 2)) * 10).astype(vdt)
    rows = rng.choice(100, 30, replace=False).astype(np.int64)
    acc = vals.copy()
    cpu.scale_rows(acc, scale, divisor)
    d_acc = cuda.to_device(vals)
    launch_rows(gpu.scale_rows_kernel, 30, 2, d_acc, scale, divisor)
    same(f"scale_rows {vdt.__name__} scale={scale} divisor={divisor}", d_acc.copy_to_host(), acc)
    out = np.zeros((100, 2), vdt)
    cpu.scatter(out, rows, acc)
    d_out = cuda.to_device(np.zeros((100, 2), vdt))
    launch_rows(gpu.scatter_kernel, 30, 2, d_out, cuda.to_device(rows), d_acc)
    same(f"scatter {vdt.__name__}", d_out.copy_to_host(), out)

# ---- the device pipeline (zen_hvd.bench.gpu.kernel_pipeline), n workers, against a float64 sum ----
from zen_hvd.bench.gpu import kernel_pipeline
M, n, D = 3000, 3, 2
inputs = [np.sort(rng.choice(M, 200, replace=False)).astype(np.int64) for _ in range(n)]
vals = [rng.standard_normal((200, D)).astype(np.float32) for _ in range(n)]
ref = np.zeros((M, D))
for u, v in zip(inputs, vals):
    ref[u] += v
out = kernel_pipeline(inputs, vals, M, seed=99).copy_to_host()
assert np.allclose(out, ref / n, atol=1e-6), "device pipeline: wrong average"
assert np.array_equal(out != 0, ref != 0), "device pipeline: rows lost or invented"
checked.append("pipeline")
print("CHECKED", len(checked))
"""


def test_gpu_data_path_matches_cpu_twins_in_simulator():
    stdout = run_python(SIM_SCRIPT, simulator=True)
    assert "CHECKED" in stdout and int(stdout.split("CHECKED", 1)[1]) >= 30, stdout[-2000:]


PTX_SCRIPT = """
import inspect, json, sys
from types import SimpleNamespace
from numba import cuda, types
import numba.cuda.dispatcher

cc = ({major}, {minor})
try:
    cuda.compile_ptx(lambda x: None, (types.int64[::1],), cc=cc)
except Exception as e:  # NVVM / NVRTC libraries missing
    print("SKIP", type(e).__name__, e)
    sys.exit(0)
numba.cuda.dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc)

from zen_hvd.cuda_kernels import data_path_gpu as g
i64, u64, i32 = types.int64[::1], types.uint64[::1], types.int32[::1]
i, f = types.int64, types.float64
for vals, rows in [(types.float32[::1], types.float32[:, ::1]), (types.float64[::1], types.float64[:, ::1]),
                   (types.int64[::1], types.int64[:, ::1])]:
    sigs = {{
        "pack_kernel": (i32, vals, i64, i64, i64, i64, i64, i64, rows, types.boolean),
        "set_bits_kernel": (u64, i64),
        "check_positions_kernel": (i32, i, i64),
        "mark_bad_kernel": (u64, i32, i, i64),
        "clear_marks_kernel": (u64, i32, i),
        "word_block_sums_kernel": (u64, i, i64),
        "block_offsets_kernel": (i64, i, i, i64),
        "word_prefix_blocks_kernel": (u64, i, i64),
        "add_part_kernel": (rows, u64, i64, i64, rows, f),
        "add_slots_kernel": (rows, i64, rows, f),
        "units_of_bitmap_kernel": (u64, i64, i, i, i, i, i64, i64),
        "units_of_positions_kernel": (i32, i, i, i, i, i64, i64),
        "bitmap_positions_kernel": (u64, i64, i64),
        "scale_rows_kernel": (rows, f, i),
        "scatter_kernel": (rows, i64, rows),
    }}
    for name, sig in sigs.items():
        kernel = getattr(g, name, None)
        if kernel is None:   # not in this version of the module
            continue
        # a kernel with an optional error counter: without it (omitted) and with it
        bad = inspect.signature(kernel.py_func).parameters.get("bad")
        counters = [types.Omitted(None), i64] if bad is not None and bad.default is None else [None]
        for bad in counters:
            ptx, _ = cuda.compile_ptx(kernel.py_func, sig + (() if bad is None else (bad,)), cc=cc)
            assert ".target sm_{major}{minor}" in ptx
            print("KERNEL", json.dumps(dict(
                name=name, dtype=str(rows.dtype), counter=bad is i64,
                atoms=sorted({{ln.split()[0] for ln in ptx.splitlines() if "atom." in ln}}),
                fma=[ln.strip() for ln in ptx.splitlines() if "fma." in ln])))
"""


@functools.lru_cache(maxsize=None)
def ptx_report(cc):
    """One record per (kernel, value dtype, error counter or not) compiled for `cc`."""
    stdout = run_python(PTX_SCRIPT.format(major=cc[0], minor=cc[1]), simulator=False)
    if stdout.startswith("SKIP"):
        pytest.skip(f"CUDA compiler libraries unavailable: {stdout.strip()}")
    return [json.loads(ln.split(None, 1)[1]) for ln in stdout.splitlines() if ln.startswith("KERNEL")]


KERNELS = {"pack_kernel", "set_bits_kernel", "check_positions_kernel", "mark_bad_kernel",
           "clear_marks_kernel", "word_block_sums_kernel",
           "block_offsets_kernel", "word_prefix_blocks_kernel", "add_part_kernel", "add_slots_kernel",
           "units_of_bitmap_kernel", "units_of_positions_kernel", "bitmap_positions_kernel",
           "scale_rows_kernel", "scatter_kernel"}
COUNTED = {"set_bits_kernel", "add_part_kernel", "add_slots_kernel", "units_of_bitmap_kernel",
           "units_of_positions_kernel", "bitmap_positions_kernel", "scatter_kernel"}


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
def test_gpu_data_path_compiles_to_ptx(cc):
    report = ptx_report(cc)
    atoms = {}
    for r in report:
        atoms.setdefault((r["name"], r["counter"]), set()).update(r["atoms"] or ["-"])
    assert {name for name, _ in atoms} == KERNELS, atoms
    assert {name for name, counter in atoms if counter} == COUNTED, atoms
    assert any("or" in op for op in atoms["set_bits_kernel", False]), atoms     # the bitmap's atomic or
    assert any("or" in op for op in atoms["mark_bad_kernel", False]), atoms     # test-and-set of a mark
    assert any("and" in op for op in atoms["clear_marks_kernel", False]), atoms
    # deterministic aggregation: no atomics where values are added; the error counter's
    # integer add only where one is given
    for name in ("add_part_kernel", "add_slots_kernel", "scatter_kernel"):
        assert atoms[name, False] == {"-"} and atoms[name, True] == {"atom.global.add.u64"}, atoms
    assert atoms["scale_rows_kernel", False] == {"-"}, atoms


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
def test_gpu_data_path_ptx_never_fuses_multiply_add(cc):
    # NVVM contracts a * b + c into one fma by default, rounding once where the CPU twins
    # round twice: no kernel may contain one, for any values' dtype.
    fused = [(r["name"], r["dtype"], r["fma"]) for r in ptx_report(cc) if r["fma"]]
    assert not fused, fused
    assert {r["dtype"] for r in ptx_report(cc)} == {"float32", "float64", "int64"}


# ---- float rounding: the device sums round as their CPU twins do, with a prescale ----------

ROUNDING_SCRIPT = r"""
from fractions import Fraction
import numpy as np
from numba import cuda
from zen_hvd.cuda_kernels import data_path as cpu, data_path_gpu as gpu

rng = np.random.default_rng(11)
p, W, K, D = 1 / 3, 8, 60, 2
positions = np.sort(rng.choice(64 * W, K, replace=False)).astype(np.int64)
words = np.zeros(W, np.uint64)
cpu.set_bits(words, positions)
prefix, _ = cpu.word_prefix(words)
slots = np.arange(K, dtype=np.int64)          # the sorted positions' slots
for vdt in (np.float64, np.float32):
    acc0 = rng.standard_normal((K, D)).astype(vdt)
    vals = rng.standard_normal((K, D)).astype(vdt)
    ref = acc0.copy()
    cpu.add_part(ref, words, prefix, positions, vals, p)
    d_acc = cuda.to_device(acc0)
    gpu.launch_rows(gpu.add_part_kernel, K, D, d_acc, cuda.to_device(words), cuda.to_device(prefix),
                    cuda.to_device(positions), cuda.to_device(vals), p)
    assert d_acc.copy_to_host().tobytes() == ref.tobytes(), ("add_part", vdt)
    d_acc = cuda.to_device(acc0)
    gpu.launch_rows(gpu.add_slots_kernel, K, D, d_acc, cuda.to_device(slots), cuda.to_device(vals), p)
    assert d_acc.copy_to_host().tobytes() == ref.tobytes(), ("add_slots", vdt)
    if vdt is np.float64:   # the data tells a fused multiply-add (one rounding) from the twins' two
        fused = np.array([[float(Fraction(a) + Fraction(p) * Fraction(v)) for a, v in zip(ra, rv)]
                          for ra, rv in zip(acc0.tolist(), vals.tolist())])
        assert (fused != ref).sum() >= K // 10, (fused != ref).sum()
print("ROUNDED")
"""


def test_sums_round_like_cpu_twins_in_simulator():
    assert "ROUNDED" in run_python(ROUNDING_SCRIPT, simulator=True)


# ---- the bitmap's popcount prefix over several blocks -------------------------------------

SCAN_SCRIPT = r"""
import numpy as np
from numba import cuda
from zen_hvd.cuda_kernels import data_path as cpu, data_path_gpu as gpu, h0

rng = np.random.default_rng(3)
grids = []


class Recorder:   # the grid of every launch of the scan's last pass
    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, config):
        grids.append(config[0])
        return self.kernel[config]


gpu.word_prefix_blocks_kernel = Recorder(gpu.word_prefix_blocks_kernel)


def bitmap(W, kind):
    if kind == "empty":
        return np.zeros(W, np.uint64)
    if kind == "full":
        return np.full(W, np.iinfo(np.uint64).max, np.uint64)
    words = rng.integers(0, np.iinfo(np.uint64).max, W, dtype=np.uint64, endpoint=True)
    return np.where(rng.random(W) < 0.3, np.uint64(0), words)   # some empty words


def check(words, *config, launch=gpu.word_prefix_device):
    d_prefix = cuda.to_device(np.full(words.size, -1, np.int64))
    d_total = cuda.to_device(np.array([-1], np.int64))
    launch(cuda.to_device(words), d_prefix, d_total, *config)
    prefix, total = cpu.word_prefix(words)
    assert np.array_equal(d_prefix.copy_to_host(), prefix), (words.size, config)
    assert d_total.copy_to_host()[0] == total, (words.size, config, d_total.copy_to_host(), total)


# (threads, words per thread): 64 words a block; 72 (not a power of two); 8, so that the block
# sums outnumber the threads that scan them
for threads, per_thread, sizes in [(32, 2, (0, 1, 63, 64, 65, 200, 657)), (24, 3, (200,)), (8, 1, (100,))]:
    for W in sizes:
        before = len(grids)
        check(bitmap(W, "random"), threads, per_thread)
        chunk = threads * per_thread
        assert grids[before:] == ([(W + chunk - 1) // chunk] if W else []), (W, grids[before:])
check(bitmap(100, "empty"), 32, 2)
check(bitmap(130, "full"), 32, 2)
assert max(grids) == 13   # 100 words by 8 threads: more block sums than threads to scan them
check(bitmap(5, "random"), launch=gpu.word_prefix_kernel[1, h0.THREADS])   # the old launch still works
try:
    gpu.word_prefix_device(cuda.to_device(np.zeros(3, np.uint64)), cuda.device_array(3, np.int64),
                           cuda.device_array(1, np.int64), h0.THREADS + 1)
    raise AssertionError("a block larger than the scan's shared memory was launched")
except ValueError:
    pass
print("SCANNED", len(grids))
"""


def test_word_prefix_multi_block_in_simulator():
    assert "SCANNED" in run_python(SCAN_SCRIPT, simulator=True)


# ---- received positions range-checked on the device ---------------------------------------

RANGE_SCRIPT = r"""
import json
import numpy as np
from numba import cuda
from zen_hvd.cuda_kernels import data_path as cpu, data_path_gpu as gpu, h0

rng = np.random.default_rng(5)
G = 4            # guard rows either side of every array a kernel writes
failed, cases = {}, []


def guarded(a, fill):
    # a on the device, inside a buffer with G rows of `fill` either side: (the view, the buffer)
    pad = np.full((G,) + a.shape[1:], fill, a.dtype)
    buf = cuda.to_device(np.concatenate([pad, a, pad]))
    return buf[G:G + a.shape[0]], buf


def expect(buf, content, fill, bad, n_bad):
    host = buf.copy_to_host()
    assert (host[:G] == fill).all() and (host[-G:] == fill).all(), f"a guard was written: {host}"
    assert host[G:-G].tobytes() == content.tobytes(), (host[G:-G], content)
    if bad is not None:
        assert bad.copy_to_host()[0] == n_bad, f"counted {bad.copy_to_host()[0]}, not {n_bad}"


def case(fn, modes=(True, False)):
    # the kernel with an error counter, then the unchecked call (counter omitted)
    for counted in modes:
        cases.append(fn.__name__)
        try:
            fn(cuda.to_device(np.zeros(1, np.int64)) if counted else None)
        except Exception as e:
            failed[f"{fn.__name__} counted={counted}"] = f"{type(e).__name__}: {e}"[:400]


def launch(kernel, threads, *args, bad):
    h0.launch_1d(kernel, threads, *args, *(() if bad is None else (bad,)))


def d(a):
    return cuda.to_device(np.ascontiguousarray(a))


WRONG = [-1, -64, 256, 1000, -2**40, 2**40]               # outside a 4-word bitmap's [0, 256)


def check_positions(bad):
    for idt in (np.int32, np.int64):
        pos = np.array([0, 5, 99, -1, 100, np.iinfo(idt).max, np.iinfo(idt).min], idt)
        launch(gpu.check_positions_kernel, pos.size, d(pos), 100, bad=bad)
        assert bad.copy_to_host()[0] == 4, bad.copy_to_host()
        bad = d(np.zeros(1, np.int64))


case(check_positions, modes=(True,))   # its counter is not optional


@case
def set_bits(bad):
    valid = np.array([0, 63, 64, 200, 255], np.int64)
    pos = rng.permutation(np.concatenate([valid, WRONG]))
    words, buf = guarded(np.zeros(4, np.uint64), 0)
    launch(gpu.set_bits_kernel, pos.size, words, d(pos), bad=bad)
    ref = np.zeros(4, np.uint64)
    cpu.set_bits(ref, valid)
    expect(buf, ref, 0, bad, len(WRONG))


# a server's bitmap of 4 words with K = 4 set bits; 230 is unset and past the last one: slot K
SET = np.array([0, 63, 64, 200], np.int64)
WORDS = np.zeros(4, np.uint64)
cpu.set_bits(WORDS, SET)
PREFIX, K = cpu.word_prefix(WORDS)
D = 3


@case
def add_part(bad):
    for prescale in (1.0, 1 / 3):
        pos = np.concatenate([SET, WRONG, [230]])
        vals = rng.standard_normal((pos.size, D)).astype(np.float32)
        acc0 = rng.standard_normal((K, D)).astype(np.float32)
        acc, buf = guarded(acc0, 7.0)
        launch(gpu.add_part_kernel, pos.size * D, acc, d(WORDS), d(PREFIX), d(pos), d(vals), prescale,
               bad=bad)
        ref = acc0.copy()
        cpu.add_part(ref, WORDS, PREFIX, SET, vals[:K], prescale)
        expect(buf, ref, np.float32(7.0), bad, len(WRONG) + 1)
        bad = None if bad is None else d(np.zeros(1, np.int64))


@case
def add_slots(bad):
    slots = np.array([2, 0, -1, 3, K, 100, 1, -2**40], np.int64)
    ok = (slots >= 0) & (slots < K)
    vals = rng.standard_normal((slots.size, D))
    acc0 = rng.standard_normal((K, D))
    acc, buf = guarded(acc0, 7.0)
    launch(gpu.add_slots_kernel, slots.size * D, acc, d(slots), d(vals), 0.5, bad=bad)
    ref = acc0.copy()
    cpu.add_slots(ref, slots[ok], vals[ok], 0.5)
    expect(buf, ref, 7.0, bad, (~ok).sum())


M, n, p = 1000, 3, 1                   # server p's positions are [0, 333)
SIZE, B, KEYS = h0.server_size(M, n, p), h0.domain_bits(M), h0.derive_keys(3)


@case
def units_of_positions(bad):
    for idt in (np.int32, np.int64):
        pos = np.array([0, -1, 5, SIZE, 332, 1000, np.iinfo(idt).max, np.iinfo(idt).min], idt)
        ok = (pos >= 0) & (pos < SIZE)
        out, buf = guarded(np.full(pos.size, -7, np.int64), -9)
        launch(gpu.units_of_positions_kernel, pos.size, d(pos), p, n, M, B, d(KEYS), out, bad=bad)
        ref = np.full(pos.size, -7, np.int64)
        units = np.zeros(ok.sum(), np.int64)
        cpu.units_of_positions(pos[ok], p, n, M, B, KEYS, units)
        ref[ok] = units
        expect(buf, ref, -9, bad, (~ok).sum())
        bad = None if bad is None else d(np.zeros(1, np.int64))


@case
def units_of_bitmap(bad):
    valid = np.array([0, 5, 100, 332], np.int64)
    units = np.zeros(valid.size, np.int64)
    words = np.zeros(6, np.uint64)
    cpu.set_bits(words, valid)
    cpu.units_of_bitmap(words, p, n, M, B, KEYS, units)
    # bits past |I_p| in the last word's padding: slots 4..6 exist but the bits are skipped
    padded = words.copy()
    cpu.set_bits(padded, np.array([333, 340, 383], np.int64))
    # a bitmap with more bits than the out array (its tag): the extra ones skipped
    for w, size, ref, n_bad in [(padded, 7, np.concatenate([units, [-7] * 3]), 3),
                                (words, 2, units[:2], 2)]:
        prefix, _ = cpu.word_prefix(w)
        out, buf = guarded(np.full(size, -7, np.int64), -9)
        launch(gpu.units_of_bitmap_kernel, w.size, d(w), d(prefix), p, n, M, B, d(KEYS), out, bad=bad)
        expect(buf, np.asarray(ref, np.int64), -9, bad, n_bad)
        bad = None if bad is None else d(np.zeros(1, np.int64))


@case
def bitmap_positions(bad):
    out, buf = guarded(np.full(2, -7, np.int64), -9)
    launch(gpu.bitmap_positions_kernel, WORDS.size, d(WORDS), d(PREFIX), out, bad=bad)
    expect(buf, SET[:2], -9, bad, K - 2)


@case
def scatter(bad):
    rows = np.array([0, -1, 3, 10, 9, 2**40, -2**40], np.int64)
    ok = (rows >= 0) & (rows < 10)
    vals = rng.standard_normal((rows.size, 2)).astype(np.float32)
    out, buf = guarded(np.zeros((10, 2), np.float32), 7.0)
    launch(gpu.scatter_kernel, rows.size * 2, out, d(rows), d(vals), bad=bad)
    ref = np.zeros((10, 2), np.float32)
    cpu.scatter(ref, rows[ok], vals[ok])
    expect(buf, ref, np.float32(7.0), bad, (~ok).sum())


print("CASES", len(cases))
print("FAILED", json.dumps(failed))
"""


def test_received_indices_range_checked_in_simulator():
    stdout = run_python(RANGE_SCRIPT, simulator=True)
    failed = json.loads(stdout.split("FAILED", 1)[1])
    assert int(stdout.split("CASES", 1)[1].split()[0]) == 15 and not failed, json.dumps(failed, indent=1)


def test_gpu_check_runs_in_simulator(tmp_path):
    # scripts/gpu_check.sh as a bare GPU machine runs it (no Horovod, no mmh3, no mpirun on
    # the PATH, no install), every step in Numba's CUDA simulator at tiny sizes.
    import os
    import subprocess
    import sys

    from conftest import NO_HOROVOD

    # The PATH's commands, less MPI's launchers (mpirun shares /usr/bin with bash).
    for d in reversed(os.environ["PATH"].split(os.pathsep)):
        for name in os.listdir(d) if os.path.isdir(d) else ():
            if not name.startswith(("mpi", "orte", "prte")):
                target = tmp_path / name
                target.unlink(missing_ok=True)
                target.symlink_to(os.path.join(d, name))
    env = dict(os.environ, PATH=str(tmp_path), PYTHON=sys.executable, **NO_HOROVOD)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "gpu_check.sh")
    proc = subprocess.run(["bash", script, "--simulate"], capture_output=True, text=True, env=env,
                          timeout=1200)
    table = proc.stdout
    assert proc.returncode == 0, table[-4000:] + proc.stderr[-3000:]
    for step in ("kernel tests", "device path, 2 ranks under torchrun", "DDP comm hook",
                 "zen_hvd.bench.gpu"):
        assert any(ln.strip().startswith(step) and ln.rstrip().endswith("pass")
                   for ln in table.splitlines()), table[-4000:]
    assert "GPU check on the CUDA simulator" in table and " NO" not in table, table
    for step in ("partition", "pack", "bitmap", "popcount prefix", "aggregate", "scale", "decode", "scatter"):
        assert f"sync step: {step}" in table, table
    # zen_hvd's own device path, every step timed, against the host path's result
    for step in ("partition", "pack", "Push", "header check", "aggregate", "Pull", "decode", "scatter"):
        assert f"device path step: {step}" in table, table
