#!/usr/bin/env bash
# Installs what baracuda_torch needs and builds it in place (editable).
# Idempotent: on a machine that already has torch (e.g. a CUDA build) it keeps
# that torch and builds the CUDA kernels too; on a fresh CPU machine it takes
# torch 2.13.0 from the package index (the CPU wheel, never CUDA wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install --quiet --prefer-binary "torch==2.13.0"
fi
"$PY" -m pip install --quiet ninja pytest expecttest numpy "setuptools>=64" wheel
MAX_JOBS=${MAX_JOBS:-$(nproc)} "$PY" -m pip install --quiet --no-build-isolation --no-deps -e .
"$PY" -c "import baracuda_torch, torch; print('baracuda_torch built against torch', torch.__version__)"
