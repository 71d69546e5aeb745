#!/usr/bin/env bash
# Installs what baracuda_torch needs, builds its extension in place and makes
# the package importable from anywhere (an editable install of this tree).
#
# torch: an importable torch is kept, whatever its build (with a CUDA build and
# nvcc on PATH the CUDA kernels are built too; BARACUDA_WITH_CUDA=0 skips
# them). Without one, pip installs torch==2.13.0 from the configured index.
# On PyPI that is the default Linux wheel, a CUDA build: it runs the CPU
# kernels on a machine without a GPU as well, and setup.py then compiles the
# .cu files too if nvcc is found. A CPU-only wheel (torch 2.13.0+cpu) is used
# only where pip is already configured to find one (a local wheel directory or
# index); install it first to get a CPU-only build.
#
# Incremental: ninja recompiles only the objects whose sources or headers
# changed (and everything when a compile flag or torch changed), so a second
# run with nothing changed takes seconds. MAX_JOBS sets the compile jobs.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd -P)
PY=${PYTHON:-python3}

if ! "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)"; then
  "$PY" -m pip install --quiet --prefer-binary "torch==2.13.0"
fi
# Already-satisfied requirements cost no index look-up.
"$PY" -m pip install --quiet ninja pytest expecttest numpy "setuptools>=77" wheel "ruff==0.17.6"

# The build (both branches): ninja in build/ recompiles only what changed.
# Not yet installed editable from this tree: an editable install, which builds.
# Otherwise a rebuild in place; --force lets ninja decide what is out of date
# (setuptools alone would skip it when only a compile flag or torch changed),
# so with nothing to compile it is a relink.
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
# The tree that an editable install points at, from its metadata (no import;
# from / so that the egg-info of this tree is not what is read).
installed=$(cd / && "$PY" -c "
import importlib.metadata as m, json
url = json.loads(m.distribution('baracuda-torch').read_text('direct_url.json'))
print(url['url'] if url.get('dir_info', {}).get('editable') else '')" 2>/dev/null || true)
if [ "$installed" != "file://$ROOT" ]; then
  "$PY" -m pip install --quiet --no-build-isolation --no-deps -e .
else
  "$PY" setup.py --quiet build_ext --inplace --force
fi
(cd / && "$PY" -c "import baracuda_torch, torch; print('baracuda_torch', baracuda_torch.__version__, 'built against torch', torch.__version__)")
