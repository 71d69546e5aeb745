// CUDA engine of the integer scans (scan_integer_kernels.h): one small
// kernel per kind for every dtype and shape, since an integer scan is exact
// and needs none of the float engine's paths.
//
// A block takes `columns` (1, 2, ..., 32) neighbouring inner columns of one
// outer index, `columns` being the inner size rounded up to a power of two
// and capped at 32, so a warp's loads at one axis position cover consecutive
// memory; the remaining threads of the block spread along the axis. Each
// step, a thread scans kItems consecutive positions of its column in
// registers, the block scans the threads' run totals along each column in
// shared memory (Hillis-Steele), and a running carry takes the scan on to
// the next step. The grouping depends on the shape only, and the combines
// are exact, so results are the same run to run. No torch headers.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_launch.cuh"
#include "scan/scan_integer_kernels.h"
#include "scan/scan_integer_ops.h"

namespace baracuda {
namespace {

constexpr int kThreads = 256;
constexpr int kItems = 8;             // consecutive positions a thread scans per step
constexpr int kMaxColumnBits = 5;     // at most 32 columns a block
constexpr int64_t kMaxBlocks = 65536; // more tiles than this loop inside the blocks

template <typename Op>
__global__ void __launch_bounds__(kThreads)
integer_scan_kernel(Op op, ScanShape s, int64_t column_tiles, int column_bits, bool reverse) {
  using State = typename Op::State;
  __shared__ State totals[2][kThreads];
  const int columns = 1 << column_bits;
  const int rows = kThreads >> column_bits;  // threads along the axis per column
  const int c = threadIdx.x & (columns - 1);
  const int r = threadIdx.x >> column_bits;
  const int64_t positions_per_step = int64_t(rows) * kItems;
  for (int64_t tile = blockIdx.x; tile < s.outer * column_tiles; tile += gridDim.x) {
    const int64_t o = tile / column_tiles;
    const int64_t i = (tile % column_tiles) * columns + c;
    const bool live = i < s.inner;
    State carry = op.identity();
    for (int64_t step = 0; step < s.len; step += positions_per_step) {
      const int64_t first = step + int64_t(r) * kItems;
      State run[kItems];
      State total = op.identity();
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const int64_t p = first + k;
        if (live && p < s.len) {
          const int64_t l = reverse ? s.len - 1 - p : p;
          total = op.combine(total, op.load((o * s.len + l) * s.inner + i, l));
        }
        run[k] = total;
      }
      // Inclusive scan of the run totals along each column: thread r ends
      // with the total of runs 0..r of its column.
      int buf = 0;
      totals[0][threadIdx.x] = total;
      __syncthreads();
      for (int d = 1; d < rows; d <<= 1) {
        State v = totals[buf][threadIdx.x];
        if (r >= d) v = op.combine(totals[buf][threadIdx.x - (d << column_bits)], v);
        totals[buf ^ 1][threadIdx.x] = v;
        __syncthreads();
        buf ^= 1;
      }
      const State before = r == 0 ? carry : op.combine(carry, totals[buf][threadIdx.x - columns]);
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const int64_t p = first + k;
        if (live && p < s.len) {
          const int64_t l = reverse ? s.len - 1 - p : p;
          op.store((o * s.len + l) * s.inner + i, l, op.combine(before, run[k]));
        }
      }
      carry = op.combine(carry, totals[buf][((rows - 1) << column_bits) | c]);
      __syncthreads();  // the next step rewrites totals
    }
  }
}

// log2 of the columns a block takes: inner rounded up to a power of two,
// at most 32.
int column_bits_for(int64_t inner) {
  int bits = 0;
  while (bits < kMaxColumnBits && (int64_t(1) << bits) < inner) ++bits;
  return bits;
}

}  // namespace

KernelStatus scan_integer_cuda(const IntegerScanArgs& args, void* stream) {
  const ScanShape& s = args.shape;
  if (s.numel() == 0) return KernelStatus::ok();
  const int column_bits = column_bits_for(s.inner);
  const int64_t column_tiles = ceil_div(s.inner, int64_t(1) << column_bits);
  const int64_t blocks = std::min(s.outer * column_tiles, kMaxBlocks);
  return scan::dispatch_integer_scan(args, [&](const auto& op, bool reverse) {
    integer_scan_kernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                          static_cast<cudaStream_t>(stream)>>>(op, s, column_tiles, column_bits,
                                                               reverse);
    return launch_status();
  });
}

}  // namespace baracuda
