#!/usr/bin/env bash
# Everything a GPU machine runs, in one go: build for the local GPU, record the
# environment, run the test suite, the main job and the benchmarks.
#
#   bash benchmarks/gpu_check.sh OUT_DIR
#
# A part of it, for a short run on a GPU machine:
#   TESTS="-q -n 8 tests -k cuda"   pytest's arguments, shell-quoted (default: -q tests;
#                                    none: skip)
#   FAMILIES="merge scan"            benchmark families (default: all; none: skip)
#   MAIN=0                           skip the main job
#
# Logs land in OUT_DIR (build.log, env.txt, tests.log, main.log, bench.log,
# results.md). A failing step is recorded and the later steps still run, so one
# run yields every log; the exit status is non-zero if any step failed.
set -euo pipefail

OUT=${1:?usage: gpu_check.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1   # logs stay in order and survive a kill

# Wheels carried alongside the tree (e.g. expecttest) for machines without an index.
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

# Build for this GPU only: one architecture compiles several times faster.
if [[ -z "${TORCH_CUDA_ARCH_LIST:-}" ]]; then
    TORCH_CUDA_ARCH_LIST=$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
fi
export TORCH_CUDA_ARCH_LIST MAX_JOBS=${MAX_JOBS:-16} BARACUDA_WITH_CUDA=1
echo "== build (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST, MAX_JOBS=$MAX_JOBS)"
"$PY" -m pip install --no-build-isolation --no-deps -e . 2>&1 | tee "$OUT/build.log"

{
    nvidia-smi || true
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
          "cudnn", torch.backends.cudnn.version(), "gpu", torch.cuda.get_device_name())'
    git log -1 --oneline 2>/dev/null || true
} 2>&1 | tee "$OUT/env.txt"

# step NAME LOG CMD...: run CMD with output teed to LOG; remember a failure, go on.
failed=()
step() {
    local name=$1 log=$2 rc=0
    shift 2
    echo "== $name"
    "$@" 2>&1 | tee "$log" || rc=$?
    if (( rc != 0 )); then failed+=("$name (exit $rc)"); fi
}

TESTS=${TESTS:--q tests}
FAMILIES=${FAMILIES:-all}
if [[ $TESTS != none ]]; then
    # Through a shell, so that a quoted -k expression stays one argument.
    step tests "$OUT/tests.log" bash -c "exec \"\$0\" -m pytest $TESTS" "$PY"
else
    echo "tests skipped" > "$OUT/tests.log"
fi
if [[ ${MAIN:-1} != 0 ]]; then
    step main "$OUT/main.log" "$PY" -m baracuda_torch
fi
if [[ $FAMILIES == all ]]; then
    step bench "$OUT/bench.log" "$PY" benchmarks/run.py --out "$OUT/results.md"
    # Time vs sparsity plot (CSV always, PNG when matplotlib is installed).
    step plot "$OUT/plot.log" "$PY" benchmarks/plot_block_sparse_attention.py
    cp benchmarks/block_sparse_attention_sparsity.* "$OUT"/ 2>/dev/null || true
elif [[ $FAMILIES != none ]]; then
    family_args=()
    for f in $FAMILIES; do family_args+=(--family "$f"); done
    step bench "$OUT/bench.log" "$PY" benchmarks/run.py "${family_args[@]}" --out "$OUT/results.md"
fi

echo
echo "== summary"
echo "tests: $(tail -n 1 "$OUT/tests.log")"
if [[ -f "$OUT/results.md" ]]; then cat "$OUT/results.md"; fi
if (( ${#failed[@]} )); then
    echo "FAILED: ${failed[*]}"
    exit 1
fi
echo "all steps passed"
