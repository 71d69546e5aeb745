// Segmented long rows: a variant of the long_rows path (scan_plan.h) for
// two-byte logcumsumexp forward, whose exps and logs keep a long_rows tile
// computing with no loads in flight while the tiles after it wait for its
// total. The row is cut into segments of kSegmentLen; one kernel folds each
// segment into its total, one scans those totals per row (the carry each
// segment starts from), and the rows kernels then scan the segments as rows
// of their own from those carries: x is read twice, but the segments
// stream as rows do (a warp each, scan_warp_rows.cuh, where there are
// enough). Rows the staged kernel takes (scan_staged_rows.cuh: aligned rows
// on compute capability 9.0 and up, 56 us for bfloat16 [1, 16M] on H100
// against these segments' 70) do not come here. Included by scan_launch.cuh and
// scan_warp_rows.cuh (the carries a rows kernel starts from). No torch
// headers.
#pragma once

#include <algorithm>
#include <cstdint>

#include "scan/scan_block.cuh"
#include "scan/scan_plan.h"

namespace baracuda {
namespace scan {

constexpr int64_t kSegmentLen = 2 * kRowChunk;
constexpr int kSegmentChunks = static_cast<int>(kSegmentLen / kRowChunk);

// Measured on H100 (logcumsumexp, one row, x near 1; `+ 8` elements is
// not a whole number of segments and stays on long_rows), µs:
//   bfloat16 forward, 4M: 30.8 against 29.1 (+ 8); 8M: 48.6 / 51.2;
//     16M: 70.3 / 90.4; 64M: 235.1 / 333.2;
//   float32 forward, 16M: 106.4 / 108.6; 64M: 367.4 / 392.7; no faster at
//     4M and 8M;
//   the backward (reading dy and y twice), bfloat16 16M: 119.2 / 123.9,
//     but 4M and 8M slower (74.7 / 67.8 at 8M); float32 likewise.
// So two-byte forward rows take segments from 2048 of them (8M elements);
// the rest keep long_rows.
constexpr int64_t kMinSegments = 2048;

// A segment's total is folded thread by thread across its chunks (thread
// t's run of chunk 0, then of chunk 1), then across threads: an order that
// is fixed but not the elements' own, which only totals that commute may
// take -- the scaled sums of logcumsumexp.
template <typename Op>
constexpr bool kSegmentedRowsApply =
    HasRunScan<Op>::value && HasPlainIo<Op>::value && sizeof(typename Op::Storage) == 2;

// Where a segment's total and carry sit: per row, in scan order. Row q of
// the [outer * segments, kSegmentLen] view is segment q mod segments of row
// q / segments in memory order; a reversed scan meets the row's segments
// from its end.
struct SegmentLayout {
  int64_t segments = 1;
  bool reverse = false;
  __host__ __device__ int64_t slot(int64_t q) const {
    const int64_t row = q / segments;
    const int64_t j = q - row * segments;
    return row * segments + (reverse ? segments - 1 - j : j);
  }
};

// What a rows kernel starts row q from: the identity, or (for segments)
// the carry segment_carries_kernel left in its slot.
template <typename Total>
struct RowCarries {
  const Total* slots = nullptr;
  SegmentLayout layout;
};

// The carry row q starts from. Ops that never take segments start from the
// identity at compile time, so their rows kernels stay as they were.
template <typename Op>
__device__ TotalOf<Op> row_start(const RowCarries<TotalOf<Op>>& carries, int64_t q,
                                 const TotalOf<Op>& identity) {
  if constexpr (kSegmentedRowsApply<Op>) {
    if (carries.slots != nullptr) return carries.slots[carries.layout.slot(q)];
  }
  return identity;
}

// Block q folds segment q of the view; thread 0 leaves the total in its slot.
template <typename Op>
__global__ void __launch_bounds__(kScanBlock)
    segment_totals_kernel(Op op, int64_t view_rows, SegmentLayout layout, TotalOf<Op>* slots) {
  using Total = TotalOf<Op>;
  const TotalsOf<Op> totals = totals_of(op);
  __shared__ RowShared<Op> shared;
  for (int64_t q = blockIdx.x; q < view_rows; q += gridDim.x) {
    const Line line{q * kSegmentLen, 1, kSegmentLen, layout.reverse};
    const bool direct = chunks_go_direct(op, line);
    ChunkRegs<Op> r[kSegmentChunks];
#pragma unroll
    for (int c = 0; c < kSegmentChunks; ++c) load_chunk(op, line, c * kRowChunk, direct, r[c]);
    Total mine = totals.identity();
#pragma unroll
    for (int c = 0; c < kSegmentChunks; ++c) {
      arrange_chunk(direct, r[c], shared);
      mine = totals.combine(mine, fold_run(op, r[c].blocked, r[c].memo));
    }
    Total before, total;
    BlockTotalsScan<TotalsOf<Op>>::exclusive(shared.scan, totals, mine, before, total);
    if (threadIdx.x == 0) slots[layout.slot(q)] = total;
    // The next segment's exchange reuses the scan's shared memory.
    __syncthreads();
  }
}

// Slots a thread of segment_carries_kernel holds at once: a pass over up
// to 4096 segments with all its loads in flight together.
constexpr int kCarryItems = 16;

// Block `row` turns its row's segment totals, in place, into the carries
// the segments start from (an exclusive scan in segment order), in passes
// of kScanBlock * kCarryItems slots: each thread folds its kCarryItems
// consecutive slots, the block scans those folds after the passes before,
// and each thread rewrites its slots.
template <typename Op>
__global__ void __launch_bounds__(kScanBlock)
    segment_carries_kernel(Op op, int64_t segments, TotalOf<Op>* slots) {
  using Total = TotalOf<Op>;
  const TotalsOf<Op> totals = totals_of(op);
  __shared__ typename BlockTotalsScan<TotalsOf<Op>>::TempStorage scan;
  Total* row = slots + int64_t{blockIdx.x} * segments;
  Total lead = totals.identity();
  for (int64_t pass = 0; pass < segments; pass += int64_t{kScanBlock} * kCarryItems) {
    const int64_t first = pass + int64_t{threadIdx.x} * kCarryItems;
    Total v[kCarryItems];
#pragma unroll
    for (int k = 0; k < kCarryItems; ++k) {
      v[k] = first + k < segments ? row[first + k] : totals.identity();
    }
    Total mine = v[0];
#pragma unroll
    for (int k = 1; k < kCarryItems; ++k) mine = totals.combine(mine, v[k]);
    Total before;
    BlockTotalsScan<TotalsOf<Op>>::exclusive(scan, totals, mine, lead, before, lead);
#pragma unroll
    for (int k = 0; k < kCarryItems; ++k) {
      if (first + k < segments) row[first + k] = before;
      before = totals.combine(before, v[k]);
    }
    // The next pass's scan reuses the shared memory.
    __syncthreads();
  }
}

}  // namespace scan
}  // namespace baracuda
