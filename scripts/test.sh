#!/usr/bin/env bash
# The test command: set up (idempotent), then run the whole suite. On a GPU
# machine the same suite also runs every test on CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/setup.sh
"$PY" -m pytest -q tests "$@"
