#!/usr/bin/env bash
# One command on a machine with an NVIDIA GPU: the kernel tests on the GPU (the simulator's
# scripts without the simulator), the PTX checks, then zen_hvd.bench.gpu's table (hierarchical
# hashing on 214M elements at 1%, every step of one sync on the device, a CUDA tensor's
# sparse_allreduce against the CPU's). Exits non-zero on any mismatch.
#   scripts/gpu_check.sh [zen_hvd.bench.gpu options]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${ZEN_HVD_VENV:-.venv}/bin/python"
[ -x "$PY" ] || bash scripts/setup.sh
ZEN_HVD_REAL_GPU=1 "$PY" -m pytest -q tests/test_kernels.py tests/test_gpu_data_path.py -k "simulator or ptx"
exec "$PY" -m zen_hvd.bench.gpu "$@"
