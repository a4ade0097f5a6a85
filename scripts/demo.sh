#!/usr/bin/env bash
# Set up everything (scripts/setup.sh), then run the main job: the demo on 4 local ranks
# (an embedding-sized row-sparse gradient synchronized with Zen, Horovod's dense allreduce and
# Horovod's sparse allgather), then where Zen wins (zen_hvd.bench.scaling): emulated hosts on
# a network where the machine allows it (root: network namespaces), measured, and the time
# model's projection to 128 hosts, marked as such; its picture goes to bench_out/scaling.png.
# Set ZEN_HVD_RANKS to change the number of ranks; extra arguments go to examples/demo.py.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/scripts/setup.sh"
venv=${ZEN_HVD_VENV:-$repo/.venv}
ranks=${ZEN_HVD_RANKS:-4}
root=(); [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
mpirun "${root[@]}" --oversubscribe --bind-to none -np "$ranks" \
    "$venv/bin/python" "$repo/examples/demo.py" "$@"
cd "$repo"
exec "$venv/bin/python" -m zen_hvd.bench.scaling --out bench_out
