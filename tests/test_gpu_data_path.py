"""The GPU twins of the data path (cuda_kernels/data_path_gpu.py) against their CPU twins
(cuda_kernels/data_path.py) in Numba's CUDA simulator, bit for bit, and compiled to PTX for
compute capability 8.0 and 9.0 (real CUDA target, no GPU needed). Both run in subprocesses,
as NUMBA_ENABLE_CUDASIM must be set before numba is imported."""
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

# ---- the device pipeline (zen_hvd.bench.gpu.device_sync), n workers, against a float64 sum ----
from zen_hvd.bench.gpu import device_sync
M, n, D = 3000, 3, 2
inputs = [np.sort(rng.choice(M, 200, replace=False)).astype(np.int64) for _ in range(n)]
vals = [rng.standard_normal((200, D)).astype(np.float32) for _ in range(n)]
ref = np.zeros((M, D))
for u, v in zip(inputs, vals):
    ref[u] += v
out = device_sync(inputs, vals, M, seed=99).copy_to_host()
assert np.allclose(out, ref / n, atol=1e-6), "device pipeline: wrong average"
assert np.array_equal(out != 0, ref != 0), "device pipeline: rows lost or invented"
checked.append("pipeline")
print("CHECKED", len(checked))
"""


def test_gpu_data_path_matches_cpu_twins_in_simulator():
    stdout = run_python(SIM_SCRIPT, simulator=True)
    assert "CHECKED" in stdout and int(stdout.split("CHECKED", 1)[1]) >= 30, stdout[-2000:]


PTX_SCRIPT = """
import sys
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
        g.pack_kernel: (i32, vals, i64, i64, i64, i64, i64, i64, rows, types.boolean),
        g.set_bits_kernel: (u64, i64),
        g.word_prefix_kernel: (u64, i64, i64),
        g.add_part_kernel: (rows, u64, i64, i64, rows, f),
        g.add_slots_kernel: (rows, i64, rows, f),
        g.units_of_bitmap_kernel: (u64, i64, i, i, i, i, i64, i64),
        g.units_of_positions_kernel: (i32, i, i, i, i, i64, i64),
        g.bitmap_positions_kernel: (u64, i64, i64),
        g.scale_rows_kernel: (rows, f, i),
        g.scatter_kernel: (rows, i64, rows),
    }}
    for kernel, sig in sigs.items():
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=cc)
        assert ".target sm_{major}{minor}" in ptx
        atoms = sorted({{ln.split()[0] for ln in ptx.splitlines() if "atom." in ln}})
        print("KERNEL", kernel.py_func.__name__, " ".join(atoms) or "-")
"""


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
def test_gpu_data_path_compiles_to_ptx(cc):
    stdout = run_python(PTX_SCRIPT.format(major=cc[0], minor=cc[1]), simulator=False)
    if stdout.startswith("SKIP"):
        pytest.skip(f"CUDA compiler libraries unavailable: {stdout.strip()}")
    atoms = {}
    for ln in stdout.splitlines():
        if ln.startswith("KERNEL"):
            atoms.setdefault(ln.split()[1], set()).update(ln.split()[2:])
    assert len(atoms) == 10, atoms
    assert any("or" in op for op in atoms["set_bits_kernel"]), atoms     # the bitmap's atomic or
    # deterministic aggregation: no atomics where values are added
    assert atoms["add_part_kernel"] == {"-"} and atoms["add_slots_kernel"] == {"-"}, atoms
    assert atoms["scale_rows_kernel"] == {"-"}, atoms


def test_gpu_check_runs_in_simulator():
    # The GPU check's own logic (scripts/gpu_check.sh on a GPU), at tiny sizes.
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "zen_hvd.bench.gpu", "--simulate"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout
    assert "GPU check on the CUDA simulator" in table and " NO" not in table, table
    for step in ("partition", "pack", "bitmap", "popcount prefix", "aggregate", "scale", "decode", "scatter"):
        assert f"sync step: {step}" in table, table
    # zen_hvd's own device path, every step timed, against the host path's result
    for step in ("partition", "pack", "Push", "header check", "aggregate", "Pull", "decode", "scatter"):
        assert f"device_sync step: {step}" in table, table
    assert "sparse_allreduce on the device path, 1 rank" in table, table
