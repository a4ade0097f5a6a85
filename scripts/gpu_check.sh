#!/usr/bin/env bash
# The GPU check: one command on a machine with one NVIDIA GPU and a CUDA build of torch, numba
# and numba-cuda. It installs nothing and needs no network, Horovod, mmh3 or MPI runtime:
#   1. the kernel tests on the GPU (the simulator's cases run on the device; PTX compiles);
#   2. the device data path in real 2-rank syncs of every scheme with a device path, under
#      torchrun on the one GPU (NCCL refuses two ranks on one device: the transport detects it
#      and stages through gloo, saying so), bit for bit against the host path;
#   3. the DDP comm hook on CUDA tensors (2 ranks under torchrun) against DDP's own reduction;
#   4. zen_hvd.bench.gpu: hierarchical hashing on 214M elements at 1%, every step of one sync,
#      and a CUDA tensor's sparse_allreduce against the host's.
# Then one table; it exits non-zero if any step failed.
#
#   [PYTHON=python3] scripts/gpu_check.sh [--simulate] [zen_hvd.bench.gpu options]
#
# PYTHON: the interpreter (default: the first of .venv/bin/python, python3, python whose torch
# sees a GPU). --simulate runs the same steps in Numba's CUDA simulator at tiny sizes, on a
# machine without a GPU (the test suite does, with Horovod and mmh3 unimportable and no
# mpirun on the PATH). zen_hvd is used where it is installed, else from a copy of this tree
# laid out as the installed package (nothing is installed).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
simulate=0
if [ "${1:-}" = "--simulate" ]; then simulate=1; shift; fi

# The interpreter.
if [ "$simulate" = 1 ]; then probe="import torch, numba"; else
    probe="import torch, sys; sys.exit(not torch.cuda.is_available())"; fi
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    for candidate in "$repo/.venv/bin/python" python3 python; do
        if command -v "$candidate" >/dev/null && "$candidate" -c "$probe" 2>/dev/null; then
            PY=$candidate; break; fi
    done
fi
if [ -z "$PY" ] || ! "$PY" -c "$probe" 2>/dev/null; then
    echo "gpu_check: no Python here whose torch sees a GPU (set PYTHON=...; without a GPU: --simulate)" >&2
    exit 2
fi

# zen_hvd as the installed package lays it out (zen_hvd.mpi, zen_hvd.cuda_kernels).
if ! (cd / && "$PY" -c "import zen_hvd.mpi, sys; sys.exit(zen_hvd.__file__ != '$repo/zen_hvd/__init__.py')") 2>/dev/null; then
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    cp -r zen_hvd "$stage/zen_hvd"
    cp -r mpi "$stage/zen_hvd/mpi"
    cp -r cuda_kernels "$stage/zen_hvd/cuda_kernels"
    export PYTHONPATH="$stage${PYTHONPATH:+:$PYTHONPATH}"
    echo "gpu_check: zen_hvd from a copy of this tree in $stage (not installed)"
fi

if [ "$simulate" = 1 ]; then
    export NUMBA_ENABLE_CUDASIM=1
    # (the suite runs every kernel test itself: here the data path's simulator cases suffice)
    kernels=(tests/test_gpu_data_path.py -k "simulator and not gpu_check") device=cpu examples=2
    bench=(--simulate)
else
    export ZEN_HVD_REAL_GPU=1
    kernels=(tests/test_kernels.py tests/test_gpu_data_path.py -k "(simulator or ptx) and not gpu_check")
    device=cuda examples=20 bench=()
fi
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
torchrun=("$PY" -m torch.distributed.run --nproc-per-node 2 --master-port "$("$PY" -c \
    'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')")

names=() results=() seconds=()
step() {   # step NAME CMD...: run, keep its output in a log, note pass or fail and time
    local name=$1; shift
    local log; log=$(mktemp)
    local t0=$SECONDS
    echo "== $name"
    if "$@" >"$log" 2>&1; then results+=(pass); else results+=(FAIL); tail -n 40 "$log"; fi
    grep -E "passed|failed|all cases|share a GPU|stages|GPU check on|^  " "$log" | tail -n 40
    names+=("$name") seconds+=($((SECONDS - t0)))
    rm -f "$log"
}

step "kernel tests ($([ $simulate = 1 ] && echo "simulator" || echo "GPU and PTX"))" \
    "$PY" -m pytest -q -p no:cacheprovider "${kernels[@]}"
step "device path, 2 ranks under torchrun, every device scheme" \
    "${torchrun[@]}" tests/mpi/device_path_cases.py --device "$device" --examples "$examples"
step "DDP comm hook, 2 ranks under torchrun, $device tensors" \
    "${torchrun[@]}" tests/mpi/ddp_cases.py --device "$device"
step "zen_hvd.bench.gpu" "$PY" -m zen_hvd.bench.gpu "${bench[@]}" "$@"

echo
echo "gpu_check ($([ $simulate = 1 ] && echo "Numba's CUDA simulator" || "$PY" -c \
    'import torch; print(torch.cuda.get_device_name())'), $("$PY" -c 'import torch; print("torch", torch.__version__)'))"
printf '  %-64s %6s  %s\n' "step" "s" "result"
failed=0
for i in "${!names[@]}"; do
    printf '  %-64s %6s  %s\n' "${names[$i]}" "${seconds[$i]}" "${results[$i]}"
    [ "${results[$i]}" = pass ] || failed=1
done
exit $failed
