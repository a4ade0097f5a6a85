#!/usr/bin/env bash
# One command on a machine with an NVIDIA GPU: the kernel tests on the GPU (the simulator's
# scripts without the simulator), the PTX checks, the device data path in 2-rank syncs on
# CUDA tensors (tests/mpi/device_path_cases.py), then zen_hvd.bench.gpu's table (hierarchical
# hashing on 214M elements at 1%, every step of one sync on the device, a CUDA tensor's
# sparse_allreduce against the CPU's). Exits non-zero on any mismatch.
#   scripts/gpu_check.sh [zen_hvd.bench.gpu options]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${ZEN_HVD_VENV:-.venv}/bin/python"
[ -x "$PY" ] || bash scripts/setup.sh
ZEN_HVD_REAL_GPU=1 "$PY" -m pytest -q tests/test_kernels.py tests/test_gpu_data_path.py -k "simulator or ptx"
# The device data path in real 2-rank syncs on CUDA tensors (both ranks on one GPU, so the
# transport stages through host memory: NCCL needs a GPU per rank), against the host path.
MPIRUN=(mpirun -np 2 --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
(cd tests/mpi && "${MPIRUN[@]}" "../../$PY" device_path_cases.py --device cuda --examples 20)
exec "$PY" -m zen_hvd.bench.gpu "$@"
