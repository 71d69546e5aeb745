// CUDA engine of the scan family: the functors of scan_ops.h run over one of
// three paths (scan_plan.h). Every path combines in a fixed order that does
// not depend on timing, so results are bit-identical run to run, and no path
// uses atomics.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "common/cuda_launch.cuh"
#include "scan/scan_dispatch.h"
#include "scan/scan_kernels.h"
#include "scan/scan_plan.h"

namespace baracuda {
namespace {

template <typename Op>
using StateOf = typename Op::State;

template <typename Op>
using BlockScanOf = cub::BlockScan<StateOf<Op>, kScanBlock>;

template <typename Op>
struct CombineFn {
  Op op;
  __device__ StateOf<Op> operator()(const StateOf<Op>& a, const StateOf<Op>& b) const {
    return op.combine(a, b);
  }
};

// One block scans positions [p_begin, p_end) (in scan order) of the row that
// starts at row_base (inner == 1), kRowChunk elements at a time: each thread
// holds kScanItems consecutive elements, a block scan of the per-thread
// totals gives each thread its prefix, and `carry` (the same in every thread)
// chains the chunks. Returns carry combined with everything scanned. With
// kStore false nothing is written (a reduction).
template <bool kStore, typename Op>
__device__ StateOf<Op> scan_row_range(const Op& op, int64_t row_base, int64_t len, bool reverse,
                                      int64_t p_begin, int64_t p_end, StateOf<Op> carry,
                                      typename BlockScanOf<Op>::TempStorage& tmp) {
  using State = StateOf<Op>;
  for (int64_t chunk = p_begin; chunk < p_end; chunk += kRowChunk) {
    const int64_t first = chunk + int64_t(threadIdx.x) * kScanItems;
    State items[kScanItems];
    State total = op.identity();
#pragma unroll
    for (int k = 0; k < kScanItems; ++k) {
      const int64_t p = first + k;
      items[k] = op.identity();
      if (p < p_end) {
        const int64_t l = reverse ? len - 1 - p : p;
        items[k] = op.load(row_base + l, l);
        total = op.combine(total, items[k]);
      }
    }
    State before, chunk_total;
    BlockScanOf<Op>(tmp).ExclusiveScan(total, before, op.identity(), CombineFn<Op>{op},
                                       chunk_total);
    __syncthreads();  // tmp is reused by the next chunk's scan
    if (kStore) {
      State run = op.combine(carry, before);
#pragma unroll
      for (int k = 0; k < kScanItems; ++k) {
        const int64_t p = first + k;
        if (p < p_end) {
          const int64_t l = reverse ? len - 1 - p : p;
          const State incl = op.combine(run, items[k]);
          op.store(row_base + l, l, run, incl);
          run = incl;
        }
      }
    }
    carry = op.combine(carry, chunk_total);
  }
  return carry;
}

// ---------------------------------------------------------------- rows path

template <typename Op>
__global__ void __launch_bounds__(kScanBlock)
    rows_kernel(Op op, int64_t outer, int64_t len, bool reverse) {
  __shared__ typename BlockScanOf<Op>::TempStorage tmp;
  for (int64_t row = blockIdx.x; row < outer; row += gridDim.x) {
    scan_row_range<true>(op, row * len, len, reverse, 0, len, op.identity(), tmp);
  }
}

// ---------------------------------------------------------------- long_rows path
// Tile t of row r covers scan positions [t * kTileLen, (t + 1) * kTileLen).
// Workspace: one state per (row, tile), row-major.

template <typename Op>
__global__ void __launch_bounds__(kScanBlock)
    tile_total_kernel(Op op, int64_t len, bool reverse, int64_t tiles, StateOf<Op>* ws) {
  __shared__ typename BlockScanOf<Op>::TempStorage tmp;
  const int64_t tile = blockIdx.x, row = blockIdx.y;
  const int64_t p_begin = tile * kTileLen;
  const int64_t p_end = p_begin + kTileLen < len ? p_begin + kTileLen : len;
  const StateOf<Op> total =
      scan_row_range<false>(op, row * len, len, reverse, p_begin, p_end, op.identity(), tmp);
  if (threadIdx.x == 0) ws[row * tiles + tile] = total;
}

// Turns a row of tile totals into exclusive prefixes, in place (each thread
// reads and then writes only its own slots). Rows of the workspace are in
// scan order already.
template <typename Op>
struct ExclusivePrefixInPlace {
  using State = StateOf<Op>;
  Op op;
  State* ws;
  __device__ State identity() const { return op.identity(); }
  __device__ State combine(State a, State b) const { return op.combine(a, b); }
  __device__ State load(int64_t off, int64_t) const { return ws[off]; }
  __device__ void store(int64_t off, int64_t, State excl, State) const { ws[off] = excl; }
};

template <typename Op>
__global__ void __launch_bounds__(kScanBlock)
    tile_scan_kernel(Op op, int64_t len, bool reverse, int64_t tiles, const StateOf<Op>* ws) {
  __shared__ typename BlockScanOf<Op>::TempStorage tmp;
  const int64_t tile = blockIdx.x, row = blockIdx.y;
  const int64_t p_begin = tile * kTileLen;
  const int64_t p_end = p_begin + kTileLen < len ? p_begin + kTileLen : len;
  scan_row_range<true>(op, row * len, len, reverse, p_begin, p_end, ws[row * tiles + tile], tmp);
}

// ---------------------------------------------------------------- columns path
// Thread c owns column c = o * inner + i (consecutive threads, consecutive
// addresses) and walks segment blockIdx.y of its axis. Workspace: one state
// per (segment, column), segment-major.

struct ColumnSpan {
  int64_t base;     // offset of (o, 0, i)
  int64_t p_begin;  // scan positions of this thread's segment
  int64_t p_end;
};

__device__ inline bool column_span(const ScanShape& s, int64_t seg_len, ColumnSpan& span,
                                   int64_t& column) {
  column = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= s.outer * s.inner) return false;
  const int64_t o = column / s.inner;
  const int64_t i = column - o * s.inner;
  span.base = o * s.len * s.inner + i;
  span.p_begin = int64_t(blockIdx.y) * seg_len;
  span.p_end = span.p_begin + seg_len < s.len ? span.p_begin + seg_len : s.len;
  return true;
}

// Walks one thread's segment in batches of kColumnBatch: every load of a
// batch is issued before the first store, so each thread keeps several loads
// in flight (the compiler cannot reorder them past stores that may alias).
constexpr int kColumnBatch = 8;

template <bool kStore, typename Op>
__device__ StateOf<Op> walk_column(const Op& op, const ScanShape& s, bool reverse,
                                   const ColumnSpan& span, StateOf<Op> carry) {
  for (int64_t p0 = span.p_begin; p0 < span.p_end; p0 += kColumnBatch) {
    StateOf<Op> items[kColumnBatch];
#pragma unroll
    for (int k = 0; k < kColumnBatch; ++k) {
      const int64_t p = p0 + k;
      items[k] = op.identity();
      if (p < span.p_end) {
        const int64_t l = reverse ? s.len - 1 - p : p;
        items[k] = op.load(span.base + l * s.inner, l);
      }
    }
#pragma unroll
    for (int k = 0; k < kColumnBatch; ++k) {
      const int64_t p = p0 + k;
      if (p < span.p_end) {
        const StateOf<Op> incl = op.combine(carry, items[k]);
        if (kStore) {
          const int64_t l = reverse ? s.len - 1 - p : p;
          op.store(span.base + l * s.inner, l, carry, incl);
        }
        carry = incl;
      }
    }
  }
  return carry;
}

template <typename Op>
__global__ void __launch_bounds__(kColumnBlock)
    column_total_kernel(Op op, ScanShape s, bool reverse, int64_t seg_len, StateOf<Op>* ws) {
  ColumnSpan span;
  int64_t column;
  if (!column_span(s, seg_len, span, column)) return;
  ws[int64_t(blockIdx.y) * s.outer * s.inner + column] =
      walk_column<false>(op, s, reverse, span, op.identity());
}

template <typename Op>
__global__ void __launch_bounds__(kColumnBlock)
    column_prefix_kernel(Op op, int64_t columns, int64_t segments, StateOf<Op>* ws) {
  const int64_t column = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= columns) return;
  StateOf<Op> run = op.identity();
  for (int64_t seg = 0; seg < segments; ++seg) {
    const StateOf<Op> t = ws[seg * columns + column];
    ws[seg * columns + column] = run;
    run = op.combine(run, t);
  }
}

template <typename Op>
__global__ void __launch_bounds__(kColumnBlock)
    column_scan_kernel(Op op, ScanShape s, bool reverse, int64_t seg_len, const StateOf<Op>* ws) {
  ColumnSpan span;
  int64_t column;
  if (!column_span(s, seg_len, span, column)) return;
  const StateOf<Op> carry =
      ws ? ws[int64_t(blockIdx.y) * s.outer * s.inner + column] : op.identity();
  walk_column<true>(op, s, reverse, span, carry);
}

// ---------------------------------------------------------------- launch

constexpr int64_t kMaxRowBlocks = int64_t(1) << 30;

template <typename Op>
KernelStatus launch(const Op& op, const ScanShape& s, bool reverse, void* workspace,
                    cudaStream_t stream) {
  using State = StateOf<Op>;
  static_assert(sizeof(State) <= kWorkspaceSlotBytes, "scan state larger than a workspace slot");
  const ScanPlan plan = plan_scan(s);
  State* ws = static_cast<State*>(workspace);
  if (plan.workspace_slots > 0 && ws == nullptr) {
    return KernelStatus::invalid("scan: this shape needs a workspace");
  }
  switch (plan.path) {
    case ScanPath::kEmpty: return KernelStatus::ok();
    case ScanPath::kRows: {
      const unsigned grid = static_cast<unsigned>(std::min(s.outer, kMaxRowBlocks));
      rows_kernel<<<grid, kScanBlock, 0, stream>>>(op, s.outer, s.len, reverse);
      return launch_status();
    }
    case ScanPath::kLongRows: {
      const dim3 grid(static_cast<unsigned>(plan.tiles), static_cast<unsigned>(s.outer));
      tile_total_kernel<<<grid, kScanBlock, 0, stream>>>(op, s.len, reverse, plan.tiles, ws);
      KernelStatus st = launch_status();
      if (!st.is_ok()) return st;
      ExclusivePrefixInPlace<Op> prefix{op, ws};
      rows_kernel<<<static_cast<unsigned>(s.outer), kScanBlock, 0, stream>>>(prefix, s.outer,
                                                                             plan.tiles, false);
      st = launch_status();
      if (!st.is_ok()) return st;
      tile_scan_kernel<<<grid, kScanBlock, 0, stream>>>(op, s.len, reverse, plan.tiles, ws);
      return launch_status();
    }
    case ScanPath::kColumns: {
      const int64_t columns = s.outer * s.inner;
      const int64_t seg_len = ceil_div(s.len, plan.segments);
      const dim3 grid(static_cast<unsigned>(ceil_div(columns, kColumnBlock)),
                      static_cast<unsigned>(plan.segments));
      if (plan.segments == 1) {
        column_scan_kernel<<<grid, kColumnBlock, 0, stream>>>(op, s, reverse, seg_len, nullptr);
        return launch_status();
      }
      column_total_kernel<<<grid, kColumnBlock, 0, stream>>>(op, s, reverse, seg_len, ws);
      KernelStatus st = launch_status();
      if (!st.is_ok()) return st;
      column_prefix_kernel<<<grid.x, kColumnBlock, 0, stream>>>(op, columns, plan.segments, ws);
      st = launch_status();
      if (!st.is_ok()) return st;
      column_scan_kernel<<<grid, kColumnBlock, 0, stream>>>(op, s, reverse, seg_len, ws);
      return launch_status();
    }
  }
  return KernelStatus::invalid("scan: unknown path");
}

template <typename Args>
KernelStatus run_device(const Args& a, void* stream) {
  return scan::dispatch_scan<__half, __nv_bfloat16, float>(a, [&](const auto& op, bool reverse) {
    return launch(op, a.shape, reverse, a.workspace, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace

KernelStatus scan_forward_cuda(const ScanForwardArgs& args, void* stream) {
  return run_device(args, stream);
}
KernelStatus scan_backward_cuda(const ScanBackwardArgs& args, void* stream) {
  return run_device(args, stream);
}

}  // namespace baracuda
