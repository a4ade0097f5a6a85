"""GPU check: the kernels on a real GPU, in one command (scripts/gpu_check.sh runs it).

    python -m zen_hvd.bench.gpu [--units 214000000] [--density 0.01] [--servers 8] [--repeats 5]
    python -m zen_hvd.bench.gpu --simulate     # tiny sizes in Numba's CUDA simulator (no GPU)

Prints one table and exits non-zero on any mismatch:
  - hierarchical hashing (Algorithm 1 with its compaction, hierarchical_hashing.py) on
    --units elements at --density (the paper: 214M elements at 1%, 6 ms on a V100), against
    the CPU twin's partition counts;
  - every step of one balanced-parallelism sync on the device (data_path_gpu.py), with
    --servers workers in this process: partition, pack, bitmap, prefix, aggregate, decode,
    scatter (median over --repeats), its result against a float64 sum on the host;
  - zen_hvd's own device path (balanced.py on backend.Device): a one-rank zen_hvd.sparse_allreduce
    of a CUDA tensor, every step timed, against the host path's result (skipped when torch has
    no CUDA; with --simulate, CPU tensors on the simulated kernels).
The kernel tests themselves run with ZEN_HVD_REAL_GPU=1 pytest tests/test_kernels.py
tests/test_gpu_data_path.py (the simulator's scripts, on the GPU).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def kernel_pipeline(inputs, values, M, seed, timer=None):
    """Balanced parallelism's sync of n workers' (unique int64 units, [nnz, D] values), all
    in this process and on the device: worker w partitions and packs, server s builds its
    bitmap, aggregates in rank order and Pulls, every worker decodes and scatters. Returns the
    [M, D] device array of the average. timer(step) -> context that times one step."""
    import contextlib

    import numpy as np
    from numba import cuda

    from ..cuda_kernels import data_path_gpu as gpu, h0, hierarchical_hashing as hh

    timer = timer or (lambda step: contextlib.nullcontext())
    n, D, dtype = len(inputs), values[0].shape[1], values[0].dtype
    keys = h0.derive_keys(seed)
    d_keys, B = cuda.to_device(keys), h0.domain_bits(M)
    pushed = [[None] * n for _ in range(n)]      # pushed[server][worker]: (positions, values)
    for w in range(n):
        d_units, d_values = cuda.to_device(inputs[w]), cuda.to_device(values[w])
        nnz = inputs[w].size
        with timer("partition (Algorithm 1)"):
            order, counts, pos = hh.group_by_partition_gpu(d_units, M, n, keys,
                                                           h0.second_level_seeds(seed, rank=w, k=3))
        counts = counts.copy_to_host()           # n integers: the Push sizes
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        d_idx, d_val = cuda.device_array(nnz, np.int64), cuda.device_array(nnz * D, dtype)
        with timer("pack"):
            gpu.launch_rows(gpu.pack_kernel, nnz, D, d_idx, d_val, cuda.to_device(starts[:-1]),
                            cuda.to_device(starts[:-1] * D), order, cuda.to_device(starts), pos,
                            d_units, d_values, False)
        for s in range(n):
            pushed[s][w] = (d_idx[starts[s]:starts[s + 1]],
                            d_val[starts[s] * D:starts[s + 1] * D].reshape((int(counts[s]), D)))
    out = cuda.to_device(np.zeros((M, D), dtype))
    for s in range(n):
        W = (h0.server_size(M, n, s) + 63) // 64
        d_words = cuda.to_device(np.zeros(W, np.uint64))
        with timer("bitmap (atomic or)"):
            for w in range(n):
                h0.launch_1d(gpu.set_bits_kernel, pushed[s][w][0].shape[0], d_words, pushed[s][w][0])
        with timer("popcount prefix"):
            prefix, K = gpu.word_prefix(d_words)
        acc = cuda.to_device(np.zeros((K, D), dtype))
        with timer("aggregate (rank order)"):
            for w in range(n):
                gpu.launch_rows(gpu.add_part_kernel, pushed[s][w][0].shape[0], D, acc, d_words, prefix,
                                *pushed[s][w], 1.0)
        with timer("scale (1/n)"):
            gpu.launch_rows(gpu.scale_rows_kernel, K, D, acc, 1.0 / n, 0)
        units = cuda.device_array(K, np.int64)
        with timer("decode (inverse bijection)"):
            h0.launch_1d(gpu.units_of_bitmap_kernel, W, d_words, prefix, s, n, M, B, d_keys, units)
        with timer("scatter"):
            gpu.launch_rows(gpu.scatter_kernel, K, D, out, units, acc)
    return out


class StepTimer:
    """Seconds per named step, each measured between device synchronizations."""

    def __init__(self):
        self.seconds = {}

    def __call__(self, step):
        import contextlib

        from numba import cuda

        @contextlib.contextmanager
        def timed():
            cuda.synchronize()
            t0 = time.perf_counter()
            yield
            cuda.synchronize()
            self.seconds[step] = self.seconds.get(step, 0.0) + time.perf_counter() - t0
        return timed()


def real_sync(units, values, M, repeats, device, failures):
    """Table rows of a one-rank zen_hvd.sparse_allreduce (scheme balanced) through the device
    path on `device`: each step's median over `repeats` syncs (after one that compiles), the
    whole call's, and whether the result equals the host path's bit for bit."""
    import torch

    import zen_hvd
    from .. import device as device_path

    zen_hvd.init()
    t = torch.sparse_coo_tensor(torch.from_numpy(units).reshape(1, -1), torch.from_numpy(values),
                                (M, values.shape[1])).coalesce()
    os.environ["ZEN_HVD_DATA_PATH"] = "host"
    want = zen_hvd.sparse_allreduce(t, name="gpu_check.host", op=zen_hvd.Sum, scheme="balanced")
    os.environ["ZEN_HVD_DATA_PATH"] = "device"
    d = t.to(device)
    per_step, totals = [], []
    for r in range(repeats + 1):
        with device_path.time_steps() as (seconds, _):
            t0 = time.perf_counter()
            got = zen_hvd.sparse_allreduce(d, name="gpu_check.device", op=zen_hvd.Sum, scheme="balanced")
            if got.is_cuda:
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
        if r:
            per_step.append(dict(seconds))
            totals.append(elapsed)
    del os.environ["ZEN_HVD_DATA_PATH"]
    ok = got.device.type == device and torch.equal(got.cpu()._indices(), want._indices()) and \
        torch.equal(got.cpu()._values(), want._values())
    if not ok:
        failures.append(f"sparse_allreduce on the device path ({device}) differs from the host path")
    rows = [(f"device path step: {name}", statistics.median(s.get(name, 0.0) for s in per_step), ok)
            for name in per_step[0]]
    rows.append((f"sparse_allreduce on the device path, 1 rank, {units.size:,} rows of M = {M:,} "
                 f"(steps timed apart)", statistics.median(totals), ok))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", type=int, default=214_000_000, help="M for the hashing benchmark")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--servers", type=int, default=8, help="n: partitions, and workers of the sync")
    ap.add_argument("--sync-units", type=int, default=1 << 24, help="M of the timed sync (D = 1)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--simulate", action="store_true", help="tiny sizes in the CUDA simulator")
    args = ap.parse_args()
    if args.simulate:
        if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":   # must be set before numba loads
            os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
            os.execv(sys.executable, [sys.executable, "-m", "zen_hvd.bench.gpu", *sys.argv[1:]])
        args.units, args.sync_units, args.servers, args.repeats = 20_000, 3_000, 3, 1
        args.density = max(args.density, 0.02)

    import numpy as np
    from numba import cuda

    from ..cuda_kernels import h0, hierarchical_hashing as hh

    name = "the CUDA simulator" if args.simulate else cuda.get_current_device().name
    where = name.decode() if isinstance(name, bytes) else str(name)
    rng = np.random.default_rng(0)
    rows, failures = [], []

    # Hierarchical hashing on M elements at the density (Section 3.2's microbenchmark).
    M, n = args.units, args.servers
    units = np.unique(rng.integers(0, M, int(M * args.density), dtype=np.int64))
    keys, seeds = h0.derive_keys(1), h0.second_level_seeds(1, rank=0, k=3)
    d_units = cuda.to_device(units)
    times, stats = [], {}
    for _ in range(args.repeats + 1):
        cuda.synchronize()
        t0 = time.perf_counter()
        order, counts, pos = hh.group_by_partition_gpu(d_units, M, n, keys, seeds, stats=stats)
        cuda.synchronize()
        times.append(time.perf_counter() - t0)
    _, cpu_counts, _ = hh.group_by_partition_cpu(units, M, n, keys)
    same = np.array_equal(counts.copy_to_host(), cpu_counts) and \
        np.array_equal(np.sort(order.copy_to_host()), np.arange(units.size))
    rows.append((f"hierarchical hashing + extraction, {M:,} elements at {args.density:g} "
                 f"({units.size:,} units, n = {n}, retries {stats.get('retries')})",
                 statistics.median(times[1:]), same))
    if not same:
        failures.append("hierarchical hashing: partition counts differ from the CPU twin")

    # One sync, every step on the device.
    M = args.sync_units
    inputs = [np.unique(rng.integers(0, M, int(M * args.density), dtype=np.int64)) for _ in range(n)]
    values = [rng.standard_normal((u.size, 1)).astype(np.float32) for u in inputs]
    per_step = []
    for r in range(args.repeats + 1):
        timer = StepTimer()
        out = kernel_pipeline(inputs, values, M, seed=7, timer=timer)
        if r:                                          # the first run compiles
            per_step.append(timer.seconds)
    ref = np.zeros((M, 1))
    for u, v in zip(inputs, values):
        ref[u] += v
    exact = bool(np.allclose(out.copy_to_host(), ref / n, atol=1e-5))
    if not exact:
        failures.append("device sync: the average differs from the float64 reference")
    for step in per_step[0]:
        rows.append((f"sync step: {step}", statistics.median(s[step] for s in per_step), exact))
    rows.append((f"sync total ({n} workers, M = {M:,}, {args.density:g} density, D = 1)",
                 statistics.median(sum(s.values()) for s in per_step), exact))

    # zen_hvd's own device path (balanced.py on backend.Device) in a one-rank sparse_allreduce of a
    # CUDA tensor (in the simulator, a CPU tensor on ZEN_HVD_DATA_PATH=device), every step
    # timed, against the host path's result on the CPU tensor.
    import torch
    if torch.cuda.is_available() or args.simulate:
        rows += real_sync(inputs[0], values[0], M, args.repeats, "cpu" if args.simulate else "cuda",
                          failures)
    else:
        rows.append(("sparse_allreduce of a CUDA tensor: skipped (torch without CUDA)", float("nan"), True))

    print(f"zen_hvd GPU check on {where}")
    print(f"  {'what':<92} {'ms':>9}  ok")
    for what, seconds, ok in rows:
        print(f"  {what:<92} {seconds * 1e3:>9.3f}  {'yes' if ok else 'NO'}")
    if failures:
        raise SystemExit("GPU check failed: " + "; ".join(failures))


if __name__ == "__main__":
    main()
