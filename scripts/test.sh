#!/usr/bin/env bash
# Set up what is missing (scripts/setup.sh), then run the whole test suite.
# Extra arguments go to pytest (for example: scripts/test.sh -k kernels).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/scripts/setup.sh"
venv=${ZEN_HVD_VENV:-$repo/.venv}
cd "$repo"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
