#!/usr/bin/env bash
# Set up everything zen_hvd needs on a fresh Debian machine, idempotently:
#   Open MPI (system packages), a virtual environment with torch 2.13.0 (CPU), numba,
#   numba-cuda, mpi4py, pytest, hypothesis, mmh3, matplotlib, tqdm, the CUDA compiler
#   libraries (for PTX tests), and Horovod 0.28.1 built with PyTorch, MPI and Gloo.
# The Horovod wheel is built once and cached; a second run reuses it.
#
# Environment:
#   ZEN_HVD_VENV   virtual environment to create or reuse (default: .venv in the repo)
#   ZEN_HVD_CACHE  where the built Horovod wheel is kept (default: ~/.cache/zen_hvd)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${ZEN_HVD_VENV:-$repo/.venv}
cache=${ZEN_HVD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/zen_hvd}
torch_pin=2.13.0
horovod_pin=0.28.1

log() { printf '[setup] %s\n' "$*" >&2; }
sudo_if_needed() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# 1. Open MPI from the system packages.
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
    log "installing Open MPI"
    sudo_if_needed apt-get update -qq
    DEBIAN_FRONTEND=noninteractive sudo_if_needed apt-get install -y -qq libopenmpi-dev openmpi-bin >/dev/null
fi

# 2. The virtual environment and the pure-Python / binary-wheel dependencies.
if [ ! -x "$venv/bin/python" ]; then
    log "creating $venv"
    python3 -m venv "$venv"
fi
py="$venv/bin/python"
pip_install() { "$py" -m pip install -q --disable-pip-version-check "$@"; }
if ! "$py" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_pin')" 2>/dev/null; then
    log "installing torch $torch_pin (CPU)"
    pip_install "torch==$torch_pin"
fi
if ! "$py" -c "import numba, numba_cuda, mpi4py, pytest, hypothesis, mmh3, psutil, matplotlib, tqdm
from importlib.metadata import version; version('nvidia-cuda-nvrtc'); version('nvidia-nvvm')" 2>/dev/null; then
    log "installing numba, numba-cuda, mpi4py, pytest, hypothesis, mmh3, matplotlib, tqdm, CUDA compiler libraries"
    pip_install wheel setuptools numba numba-cuda mpi4py pytest hypothesis mmh3 psutil matplotlib tqdm \
        "cuda-toolkit[nvrtc,nvvm,cudart]==13.*" "torch==$torch_pin"
fi

# 3. Horovod 0.28.1 with PyTorch, MPI and Gloo. Its CMakeLists pins C++14, which PyTorch >= 2.1
#    headers reject; a cmake wrapper injects a project include that maps C++14 to C++17.
if ! "$py" -c "import horovod.torch as h, sys; sys.exit(not (h.mpi_built() and h.gloo_built()))" 2>/dev/null; then
    tag="horovod-$horovod_pin-torch-$torch_pin-$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
    wheels="$cache/$tag"
    if ! ls "$wheels"/horovod-*.whl >/dev/null 2>&1; then
        log "building Horovod $horovod_pin (about 10 minutes on 2 cores; cached in $wheels)"
        work=$(mktemp -d)
        trap 'rm -rf "$work"' EXIT
        cat > "$work/cxx17.cmake" <<'CMAKE'
set(CMAKE_CXX14_STANDARD_COMPILE_OPTION "-std=c++17")
set(CMAKE_CXX14_EXTENSION_COMPILE_OPTION "-std=gnu++17")
CMAKE
        cat > "$work/cmake" <<WRAP
#!/usr/bin/env bash
# Add the C++17 project include on configure calls only (not on --build).
for a in "\$@"; do case "\$a" in --build|--install|-E) exec $(command -v cmake) "\$@";; esac; done
exec $(command -v cmake) -DCMAKE_PROJECT_INCLUDE=$work/cxx17.cmake "\$@"
WRAP
        chmod +x "$work/cmake"
        mkdir -p "$wheels"
        HOROVOD_CMAKE="$work/cmake" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
        HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_CPU_OPERATIONS=MPI MAKEFLAGS=-j"$(nproc)" \
            "$py" -m pip wheel -q --no-build-isolation --no-deps --no-binary horovod \
            -w "$wheels" "horovod==$horovod_pin"
    fi
    log "installing Horovod from $wheels"
    pip_install --no-deps "$wheels"/horovod-*.whl
    pip_install cloudpickle psutil pyyaml packaging cffi
fi

# 4. zen_hvd itself (editable, so tests see the working tree).
if ! "$py" -c "import zen_hvd" 2>/dev/null || [ "${ZEN_HVD_REINSTALL:-0}" = 1 ]; then
    log "installing zen_hvd"
    pip_install --no-deps --no-build-isolation -e "$repo"
fi
log "ready: $venv"
