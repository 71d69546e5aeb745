#!/usr/bin/env bash
# The test command: set up (incremental: seconds when nothing changed), then
# run the whole suite, the slow tier included (--runslow). On a GPU machine
# the same suite also runs every test on CUDA. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/setup.sh
"$PY" -m pytest -q tests --runslow "$@"
