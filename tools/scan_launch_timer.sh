#!/usr/bin/env bash
# Builds tools/scan_launch_timer.cu against the scan kernels with nvcc
# (no torch, about a minute) and runs it on the local GPU.
#
#   bash tools/scan_launch_timer.sh [TEXT]     cases whose name contains TEXT
#
# SCAN_DTYPE=bf16|f32 keeps one dtype; SCAN_X=bench draws every op's x as
# the benchmark does (near 1), SCAN_X=masked / masked_short sets every
# other stretch of 65536 / 1000 positions to -inf; SCAN_REVERSE=1 times
# the reversed scans; SCAN_ROWS="R,L;..." and SCAN_COLS="O,L,I;..." add
# shapes (along dim -1 and dim 1);
# NVCC_ARCH (default 90a) picks the GPU target; NVCC_FLAGS adds flags to
# the kernels' and the timer's compile (a -D to try a variant: the timer
# sizes workspaces from the same plan);
# TIMER_BIN (default build/scan_launch_timer) is where the program goes;
# BUILD_ONLY=1 builds without running.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${TIMER_BIN:-build/scan_launch_timer}
arch=${NVCC_ARCH:-90a}
# The defines torch's extension build passes to nvcc, so the kernels compile
# as they do in the extension.
flags=(-O3 -std=c++17 -lineinfo --expt-relaxed-constexpr -Ikernels
       "-gencode=arch=compute_$arch,code=sm_$arch"
       -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__
       -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__)
mkdir -p "$(dirname "$bin")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The scan's .cu files (its entry points, and a part per storage type and
# direction: scan/scan_cuda_parts.h) and the timer compile side by side.
pids=()
for src in kernels/scan/*.cu tools/scan_launch_timer.cu; do
    # shellcheck disable=SC2086  # NVCC_FLAGS is a list of flags
    nvcc "${flags[@]}" ${NVCC_FLAGS:-} -c "$src" -o "$tmp/$(basename "$src" .cu).o" &
    pids+=("$!")
done
g++ -O2 -std=c++17 -Ikernels -c kernels/scan/scan_cpu.cpp -o "$tmp/scan_cpu.o"
for pid in "${pids[@]}"; do
    wait "$pid"
done
nvcc "-gencode=arch=compute_$arch,code=sm_$arch" "$tmp"/*.o -o "$bin"
if [[ ${BUILD_ONLY:-0} != 1 ]]; then
    "$bin" "$@"
fi
