// Rows scanned a warp each: a variant of the rows path (scan_plan.h) for rows
// that move as whole 16-byte runs, when there are rows enough to give every
// warp the GPU holds one. A warp walks its row in chunks of 32 runs; the
// lanes' run totals meet in one warp scan after the carry, with no shared
// memory and no barrier. The block-per-row kernel (scan_launch.cuh) joins its
// eight warps through shared memory at two barriers a chunk, which a costly op
// (logcumsumexp) waits on with few other warps to run. Included by
// scan_launch.cuh alone. No torch headers.
#pragma once

#include <cub/util_ptx.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/cuda_launch.cuh"
#include "scan/scan_block.cuh"
#include "scan/scan_plan.h"
#include "scan/scan_tuning.cuh"

namespace baracuda {
namespace scan {

constexpr int kWarpRowsWarps = kWarpRowsBlock / 32;
constexpr int64_t kWarpChunk = int64_t{32} * kScanItems;

// Ops whose runs move whole both ways (kWholeRunIo, scan_ops.h) in one
// 16-byte vector per array (the two-byte types), and scan their own runs
// (logcumsumexp): the costly ones. Against the block kernel this one ran
// faster for logcumsumexp, forward and backward, but slower for cumsum and
// for cumprod backward (one chunk ahead, 64 registers).
template <typename Op>
constexpr bool kWarpRowsApply =
    HasRunScan<Op>::value && HasWholeRunIo<Op>::value && kDirectRuns<kScanItems, Op>;

// An exclusive scan, after `lead` (the same in every lane), of one total
// per lane of a warp, and the total of all of it (lead included), by
// something cheaper than joins where that applies; false in every lane
// where it does not (the caller joins). Scaled sums (scan_ops.h): against
// the largest exponent M of the lanes and the lead, where each is finite and
// within 64 of M (the lead may be the empty run, whose weight is 0), each
// s exp(m - M) is a plain float and the scan a running sum. Lane 0's prefix
// is the lead as it is; a later lane's includes lane 0's total, whose
// s exp(m - M) is at least e^-64 for the forward (a non-empty total has
// s >= 1 at its own m), so no prefix that logcumsumexp takes the log of is
// lost to underflow. The exps are those of the element type T
// (exp_nonpositive_for).
//
// M is usually the lead's exponent (the forward's running maximum) or the
// last lane's (the backward's exponents, -y, grow along its scan): where
// every lane lies at or below the larger of those two, one shuffle finds it
// rather than a reduction of five.
template <typename T, typename State>
__device__ bool warp_exclusive_by_reference(const State&, const State&, State&, State&) {
  return false;
}
template <typename T>
__device__ bool warp_exclusive_by_reference(const ScaledSum<float>& v,
                                            const ScaledSum<float>& lead,
                                            ScaledSum<float>& before, ScaledSum<float>& total) {
  constexpr unsigned kAll = 0xffffffffu;
  const bool lead_empty = lead.m == -INFINITY;
  const auto all_fit_under = [&](float top) {
    const bool lead_fits =
        lead_empty || (is_finite(lead.m) && lead.m >= top - kTameSpan<float> && lead.m <= top);
    return __all_sync(kAll, lead_fits && is_finite(v.m) && v.m >= top - kTameSpan<float> && v.m <= top);
  };
  float top = fmaxf(lead.m, __shfl_sync(kAll, v.m, 31));
  if (!all_fit_under(top)) {
    top = lead_empty ? v.m : fmaxf(v.m, lead.m);
#pragma unroll
    for (int d = 16; d >= 1; d /= 2) top = fmaxf(top, __shfl_xor_sync(kAll, top, d));
    if (!all_fit_under(top)) return false;
  }
  const int lane = threadIdx.x % 32;
  float sum = v.s * exp_nonpositive_for<T>(v.m - top);
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const float up = __shfl_up_sync(kAll, sum, d);
    if (lane >= d) sum += up;
  }
  const float base = lead_empty ? 0.f : lead.s * exp_nonpositive_for<T>(lead.m - top);
  const float excl = __shfl_up_sync(kAll, sum, 1);
  before = lane == 0 ? lead : ScaledSum<float>{top, base + excl};
  total = {top, base + __shfl_sync(kAll, sum, 31)};
  return true;
}

// T: the element type (for the exps of warp_exclusive_by_reference).
template <typename T, typename Totals>
__device__ void warp_exclusive_scan(const Totals& totals, const StateOf<Totals>& v,
                                    const StateOf<Totals>& lead, StateOf<Totals>& before,
                                    StateOf<Totals>& total) {
  using State = StateOf<Totals>;
  if (warp_exclusive_by_reference<T>(v, lead, before, total)) return;
  const int lane = threadIdx.x % 32;
  State incl = v;
  warp_inclusive_by_joins<32>(totals, incl);
  const State excl = shuffle_up<32>(incl, 1);
  before = lane == 0 ? lead : totals.combine(lead, excl);
  total = totals.combine(lead, shuffle_index<32>(incl, 31));
}

// The scan direction: compiled in (kReverse) for ops that read one array,
// where reversing runs at run time cost a select per element each way and
// more offset arithmetic; passed at run time to the backward, which reads
// three arrays and, compiled for the reverse direction it scans, spilled
// out of 64 registers (measured: the forward faster with the direction
// compiled in, the backward slower).
template <typename Op>
constexpr bool kDirectionCompiled = kInputArrays<Op> == 1;

// Row r goes to warp r mod (the grid's warps); every warp holds its row's
// next kWarpRowsAhead chunks in flight while it scans one.
template <typename Op, bool kReverse>
__global__ void __launch_bounds__(kWarpRowsBlock, kWarpRowsBlocksPerSm)
    warp_rows_kernel(Op op, int64_t outer, int64_t len, bool reverse) {
  using Total = TotalOf<Op>;
  const TotalsOf<Op> totals = totals_of(op);
  const int64_t lead = int64_t{threadIdx.x % 32} * kScanItems;
  const int64_t warps = int64_t{gridDim.x} * kWarpRowsWarps;
  for (int64_t row = int64_t{blockIdx.x} * kWarpRowsWarps + threadIdx.x / 32; row < outer;
       row += warps) {
    const Line line{row * len, 1, len, kDirectionCompiled<Op> ? kReverse : reverse};
    Total carry = totals.identity();
    WholeRun<Op> ahead[kWarpRowsAhead<Op>];
#pragma unroll
    for (int a = 0; a < kWarpRowsAhead<Op>; ++a) {
      ahead[a] = fetch_whole_run<kScanItems>(op, line, a * kWarpChunk + lead);
    }
    for (int64_t chunk = 0; chunk < len; chunk += kWarpChunk) {
      const WholeRun<Op> cur = ahead[0];
#pragma unroll
      for (int a = 0; a + 1 < kWarpRowsAhead<Op>; ++a) ahead[a] = ahead[a + 1];
      // Past the end of the row it reads nothing.
      ahead[kWarpRowsAhead<Op> - 1] =
          fetch_whole_run<kScanItems>(op, line, chunk + kWarpRowsAhead<Op> * kWarpChunk + lead);
      StateOf<Op> items[kScanItems];
      AuxOf<Op> aux[kScanItems];
      unpack_whole_run(op, line, chunk + lead, cur, items, aux);
      // Positions past the end hold the identity, so they may be folded in.
      RunMemoOf<Op> memo;
      const Total mine = fold_run(op, items, memo);
      Total before;
      warp_exclusive_scan<typename Op::Storage>(totals, mine, carry, before, carry);
      scan_thread_run(op, before, items, memo);
      store_whole_run<kScanItems>(op, line, chunk + lead, items, aux);
    }
  }
}

// Whether every row of [outer, len] moves as whole runs: each array aligned
// at its start, and rows a whole number of runs long (so every row's both
// ends are aligned too).
template <typename Op>
bool rows_move_whole(const Op& op, int64_t len) {
  return len % kScanItems == 0 && arrays_aligned16<true>(op, 0);
}

// Whether rows of [outer, len] take warp_rows_kernel: the op (kWarpRowsApply),
// every row whole, and rows enough that the rounds of resident warps they
// take are at least three quarters full (one round of 4096 rows on 4224
// warps is; 5000 rows would be 1.2 rounds in two, and the block kernel's
// many rounds lose less). Resident warps are counted as the kernel is
// compiled for, 32 per SM: one that takes fewer registers fits more, but
// rows too few to fill those leave each SM as many warps as before.
template <typename Op>
bool warp_rows_fit(const Op& op, const ScanShape& s) {
  if constexpr (kWarpRowsApply<Op>) {
    if (!rows_move_whole(op, s.len)) return false;
    const int64_t resident_warps =
        std::min(resident_capacity(warp_rows_kernel<Op, false>, kWarpRowsBlock, 0),
                 multiprocessors() * kWarpRowsBlocksPerSm) *
        kWarpRowsWarps;
    const int64_t rounds = ceil_div(s.outer, resident_warps);
    return s.outer * 4 >= rounds * resident_warps * 3;
  } else {
    (void)op, (void)s;
    return false;
  }
}

template <typename Op>
KernelStatus launch_warp_rows(const Op& op, const ScanShape& s, bool reverse,
                              cudaStream_t stream) {
  if constexpr (kWarpRowsApply<Op>) {
    auto kernel = warp_rows_kernel<Op, false>;
    if constexpr (kDirectionCompiled<Op>) {
      if (reverse) kernel = warp_rows_kernel<Op, true>;
    }
    const int64_t blocks = ceil_div(s.outer, int64_t{kWarpRowsWarps});
    const unsigned grid = static_cast<unsigned>(std::min(blocks, kMaxBlocks));
    kernel<<<grid, kWarpRowsBlock, 0, stream>>>(op, s.outer, s.len, reverse);
    return launch_status();
  } else {
    (void)op, (void)s, (void)reverse, (void)stream;
    return KernelStatus::invalid("scan: no warp rows for this op");
  }
}

}  // namespace scan
}  // namespace baracuda
