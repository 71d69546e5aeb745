// The column_strips path of the CUDA scan engine (scan_plan.h): a block walks
// kStripWidth (or more) adjacent columns of one outer index down the whole
// axis, in steps. Two loaders: loads staged through shared memory by
// asynchronous copies (two-byte types and logcumsumexp, aligned inputs); and
// loads prefetched into registers, for every other case. Included by
// scan_launch.cuh alone. No torch headers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/cp_async.cuh"
#include "common/cuda_launch.cuh"
#include "scan/scan_block.cuh"
#include "scan/scan_plan.h"
#include "scan/scan_tuning.cuh"

namespace baracuda {
namespace scan {

// ---------------------------------------------------------------- column_strips path
// Block b walks strip b: lane l of every warp owns column
// (strip mod strips_per_outer) * kStripWidth + l of outer index
// strip / strips_per_outer. A step covers kWarps * K positions, warp w the
// K from w * K. Per step each thread folds its K elements, the warps' totals
// go through shared memory (double-buffered, so one barrier a step), and
// every thread folds them in warp order from the carry of the steps before:
// the value reached at its own warp is its prefix, the full fold the next
// carry -- the same association in every thread, whatever the timing. (For
// some ops only the last warp folds them all: kFoldEarlierWarpsOnly.)

// The fold of `carry` and the warps' totals of a column by something
// cheaper than joins, where that applies (kFoldWarpsByReference); false,
// with nothing written, where it does not (the caller joins). Scaled sums
// (scan_ops.h): against the largest exponent M of the terms, where each one
// is finite and within 64 of M, or the empty run (-inf, whose weight is 0),
// each s exp(m - M) is a plain float and the fold is a sum -- exps side by
// side where the joins are a chain, each waiting for the one before. The
// sum runs in warp order, so the result depends on the data alone. Two
// forms, one for each way of folding (kFoldEarlierWarpsOnly).
//
// All the warps: the fold of those before warp `warp` into `prefix`, the
// whole fold into `carry`. T, the element type, picks the exps
// (exp_nonpositive_for).
template <typename T, int kWarps, int kWidth, typename State>
__device__ bool fold_all_warps_by_reference(const State (&)[kWarps][kWidth], int, int, State&,
                                            State&) {
  return false;
}
template <typename T, int kWarps, int kWidth>
__device__ bool fold_all_warps_by_reference(const ScaledSum<float> (&totals)[kWarps][kWidth],
                                            int column, int warp, ScaledSum<float>& prefix,
                                            ScaledSum<float>& carry) {
  ScaledSum<float> t[kWarps];
  float top = carry.m;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    t[w] = totals[w][column];
    top = fmaxf(top, t[w].m);
  }
  // fmaxf passes over NaN, which fails the window test below.
  const auto in_window = [&](float m) { return m == -INFINITY || m >= top - kTameSpan<float>; };
  bool fits = is_finite(top) && in_window(carry.m);
#pragma unroll
  for (int w = 0; w < kWarps; ++w) fits = fits && in_window(t[w].m);
  if (!fits) return false;
  float sum = carry.s * exp_nonpositive_for<T>(carry.m - top);
  float before = sum;
  // The largest exponent so far, and the one before warp `warp`.
  float high = carry.m;
  float before_high = high;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    if (w == warp) {
      before = sum;
      before_high = high;
    }
    sum = fmaf(t[w].s, exp_nonpositive_for<T>(t[w].m - top), sum);
    high = fmaxf(high, t[w].m);
  }
  // The prefix keeps its own largest exponent, as the joins leave it: scaled
  // to M, the terms the run scan joins to it later would be taken against M,
  // and those far below it lost (an empty prefix would swallow the whole run).
  prefix = before_high == -INFINITY
               ? ScaledSum<float>{-INFINITY, 0.f}
               : ScaledSum<float>{before_high,
                                  __fdividef(before, exp_nonpositive_for<T>(before_high - top))};
  carry = {top, sum};
  return true;
}

// The warps before `warp` only: the fold of `carry` and totals[w], w <
// warp, into `prefix`; `totals` are one column's, read out by the caller.
template <typename T, int kWarps, typename State>
__device__ bool fold_earlier_warps_by_reference(const State (&)[kWarps], int, const State&,
                                                State&) {
  return false;
}
template <typename T, int kWarps>
__device__ bool fold_earlier_warps_by_reference(const ScaledSum<float> (&totals)[kWarps],
                                                int warp, const ScaledSum<float>& carry,
                                                ScaledSum<float>& prefix) {
  // The largest exponent and the smallest other than -inf (fmaxf and fminf
  // pass over NaN: it is looked for apart).
  float top = carry.m;
  float low = carry.m == -INFINITY ? INFINITY : carry.m;
  bool nan = is_nan(carry.m);
#pragma unroll
  for (int w = 0; w < kWarps - 1; ++w) {
    if (w < warp) {
      const float m = totals[w].m;
      top = fmaxf(top, m);
      low = m == -INFINITY ? low : fminf(low, m);
      nan = nan || is_nan(m);
    }
  }
  if (nan || !is_finite(top) || low < top - kTameSpan<float>) {
    // Every term empty: the prefix is the carry (the empty run).
    if (!nan && top == -INFINITY) {
      prefix = carry;
      return true;
    }
    return false;
  }
  float sum = carry.s * exp_nonpositive_for<T>(carry.m - top);
#pragma unroll
  for (int w = 0; w < kWarps - 1; ++w) {
    if (w < warp) sum = fmaf(totals[w].s, exp_nonpositive_for<T>(totals[w].m - top), sum);
  }
  prefix = {top, sum};
  return true;
}

// One step of a strip, for one column of a thread: the thread has its K
// positions of the step in `cur` (identity past p_end; as fold_run left them,
// with `memo`) and each warp's total of them is in totals[warp][column] (a
// barrier after they were written); `carry` is the fold of every step
// before. The thread folds `carry` and the totals of the warps before its
// own, in warp order, into its prefix, and stores its positions from
// `first`. The next step's carry (kFoldEarlierWarpsOnly): by default every
// thread leaves it in `carry`; otherwise the last warp alone, in
// `next_carry`, and the caller reads it from there after the next barrier.
template <typename Op, int K, int kWarps, int kWidth>
__device__ void finish_strip_step(const Op& op, const Line& line, int64_t first, int64_t p_end,
                                  StateOf<Op> (&cur)[K], const AuxOf<Op> (&cur_aux)[K],
                                  const RunMemoOf<Op>& memo,
                                  const TotalOf<Op> (&totals)[kWarps][kWidth], int column,
                                  TotalOf<Op>& carry, TotalOf<Op>& next_carry) {
  using State = StateOf<Op>;
  const TotalsOf<Op> joins = totals_of(op);
  const int warp = threadIdx.x / 32;
  TotalOf<Op> prefix = carry;
  if constexpr (kFoldEarlierWarpsOnly<Op>) {
    // Every total read up front: a loop reading each as it goes waits for
    // every read in turn.
    TotalOf<Op> t[kWarps];
#pragma unroll
    for (int w = 0; w < kWarps; ++w) t[w] = totals[w][column];
    const bool folded =
        kFoldWarpsByReference<Op> &&
        fold_earlier_warps_by_reference<typename Op::Storage>(t, warp, carry, prefix);
    if (!folded) {
#pragma unroll
      for (int w = 0; w < kWarps - 1; ++w) {
        if (w < warp) prefix = joins.combine(prefix, t[w]);
      }
    }
    if (warp == kWarps - 1) next_carry = joins.combine(prefix, t[kWarps - 1]);
  } else if (!(kFoldWarpsByReference<Op> &&
                 fold_all_warps_by_reference<typename Op::Storage>(totals, column, warp, prefix,
                                                                   carry))) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (w == warp) prefix = carry;
      carry = joins.combine(carry, totals[w][column]);
    }
  }
  // Stores position k of the step (the walk's current one), with what the
  // store reads besides the state.
  LineWalk w = LineWalk::from<K>(line, first, p_end);
  const auto store = [&](int k, const State& incl) {
    store_state(op, w.off, w.l, incl, cur_aux[k]);
  };
  if constexpr (HasRunScan<Op>::value) {
    // The run scan leaves the inclusive states in cur.
    op.scan_run(prefix, cur, memo);
    w.for_each_valid<K, kWholeRunPath<Op>>([&](int k) { store(k, cur[k]); });
  } else {
    w.for_each_valid<K, kWholeRunPath<Op>>([&](int k) {
      prefix = op.combine(prefix, cur[k]);
      store(k, prefix);
    });
  }
}

template <typename Op>
__global__ void __launch_bounds__(kStripBlock, kStripBlocksPerSm<Op>)
    column_strips_kernel(Op op, ScanShape s, bool reverse, int64_t strips_per_outer) {
  using State = StateOf<Op>;
  using Total = TotalOf<Op>;
  using Aux = AuxOf<Op>;
  constexpr int K = kStripRows<Op>;
  constexpr int kWarps = kStripBlock / 32;
  constexpr int64_t kStepLen = int64_t{kWarps} * K;
  __shared__ Total totals[2][kWarps][kStripWidth];
  // The carry after each step, left by the last warp where only it folds
  // every total (kFoldEarlierWarpsOnly).
  __shared__ Total carries[2][kStripWidth];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int64_t strips = s.outer * strips_per_outer;
  for (int64_t strip = blockIdx.x; strip < strips; strip += gridDim.x) {
    const int64_t o = strip / strips_per_outer;
    const int64_t column = (strip - o * strips_per_outer) * kStripWidth + lane;
    // Lanes past the last column load and store nothing but keep step with
    // the barriers.
    const int64_t p_end = column < s.inner ? s.len : 0;
    const Line line{o * s.len * s.inner + column, s.inner, s.len, reverse};
    State cur[K], next[K];
    Aux cur_aux[K], next_aux[K];
    // The totals load_run returns are not used: only its loads stay.
    load_run(op, line, int64_t{warp} * K, p_end, cur, cur_aux);
    Total carry = totals_of(op).identity();
    int buffer = 0;
    for (int64_t p0 = 0; p0 < s.len; p0 += kStepLen, buffer ^= 1) {
      const bool more = p0 + kStepLen < s.len;
      if (more) load_run(op, line, p0 + kStepLen + int64_t{warp} * K, p_end, next, next_aux);
      RunMemoOf<Op> memo;
      totals[buffer][warp][lane] = fold_run(op, cur, memo);
      __syncthreads();
      if constexpr (kFoldEarlierWarpsOnly<Op>) {
        if (p0 != 0) carry = carries[buffer ^ 1][lane];
      }
      finish_strip_step(op, line, p0 + int64_t{warp} * K, p_end, cur, cur_aux, memo,
                        totals[buffer], lane, carry, carries[buffer][lane]);
      if (more) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
          cur[k] = next[k];
          cur_aux[k] = next_aux[k];
        }
      }
    }
    // The next strip's first totals reuse buffer 0.
    __syncthreads();
  }
}

// ---------------------------------------------------------------- staged column_strips
// The same walk, for ops that name their inputs (kInputBytes, scan_ops.h)
// where it pays (kStagingPays), with the loads staged through shared memory
// by asynchronous copies: each warp copies its own positions of the next
// kStripStages - 1 steps, so the bytes in flight hold no registers. (The
// register prefetch above keeps one step in flight, and for two-byte types
// as many loads, hence half the bytes, as for float32.) A strip is
// kStagedWidth columns, kLaneColumns per lane (lane, lane + 32). Only where
// every 16-byte piece of a row of each input lies wholly inside the tensor
// or wholly past its last column, aligned (staged_strips_fit).

template <typename Op>
constexpr int kStagedSmemBytes = kStripStages<Op> * kStagedStepBytes<Op>;

// Element (position p of the warp's part of the step, column c of the
// strip) of an input of element type U sits at U index p * kStagedWidth + c
// of the warp's region of the stage, the inputs one after the other.
// Two blocks per SM, but one for two columns per lane (their 2 x 16 states
// spilled in 128 registers). (Two-byte ops once walked two neighbouring
// strips a block, so that a block's copies covered whole 128-byte rows:
// that ran about as fast as one strip a block on every row of the scan
// benchmarks.)
template <typename Op>
__global__ void __launch_bounds__(kStripBlock, kLaneColumns<Op> == 2 ? 1 : 2)
    staged_strips_kernel(Op op, ScanShape s, bool reverse, int64_t strips_per_outer) {
  using State = StateOf<Op>;
  using Total = TotalOf<Op>;
  using Aux = AuxOf<Op>;
  constexpr int K = kStagedRows<Op>;
  constexpr int H = kHaloRows<Op>;
  constexpr int kSpan = kStagedSpan<Op>;
  constexpr int C = kLaneColumns<Op>;
  constexpr int W = kStagedWidth<Op>;
  constexpr int S = kStripStages<Op>;
  constexpr int kWarps = kStripBlock / 32;
  constexpr int64_t kStepLen = int64_t{kWarps} * K;
  extern __shared__ uint4 staged[];
  __shared__ Total totals[2][kWarps][W];
  // The carry after each step, left by the last warp where only it folds
  // every total (kFoldEarlierWarpsOnly).
  __shared__ Total carries[2][W];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int64_t strips = s.outer * strips_per_outer;
  const int64_t steps = (s.len + kStepLen - 1) / kStepLen;
  // The stage region of the warp for a step in slot `slot` (step % S; the
  // loop counts slots rather than divide the 64-bit step twice a step:
  // slightly faster for some bfloat16 ops, the others unchanged).
  const auto region = [&](int slot) {
    return reinterpret_cast<char*>(staged) +
           (slot * kWarps + warp) * kStagedWarpBytes<Op>;
  };
  for (int64_t strip = blockIdx.x; strip < strips; strip += gridDim.x) {
    const int64_t o = strip / strips_per_outer;
    const int64_t column0 = (strip - o * strips_per_outer) * W;
    const int64_t outer_base = o * s.len * s.inner;
    const bool strip_columns_whole = column0 + W <= s.inner;
    // Copies this warp's positions of `step` (and the halo rows around
    // them) into its region of `slot`; one commit group per call, empty
    // past the last step, so that waiting for all but the newest S - 1
    // groups waits for the step about to be scanned. Rows outside the axis
    // are zero-filled. Copy c of the warp (lane + 32 i) is piece c % kPieces
    // of row c / kPieces of the span, with kPieces 16-byte pieces to a row.
    const auto fetch = [&](int64_t step, int slot) {
      if (step < steps) {
        char* to = region(slot);
        const int64_t first = step * kStepLen + int64_t{warp} * K - H;
        // Every copy of the step valid: its rows inside the axis, the
        // strip's columns inside the tensor.
        const bool interior = strip_columns_whole && first >= 0 && first + kSpan <= s.len;
        op.for_each_input([&](const auto* from) {
          using U = std::remove_cv_t<std::remove_pointer_t<decltype(from)>>;
          constexpr int kPieces = W * int{sizeof(U)} / 16;  // of a row
          static_assert(32 % kPieces == 0, "a round of copies covers whole rows");
          constexpr int kPieceElems = 16 / int{sizeof(U)};
          // A stride walk over the span: a lane copies the same piece of
          // every row it copies, row r0 first, kRoundRows rows a round, from
          // one address plus a fixed stride per round.
          constexpr int kRoundRows = 32 / kPieces;
          // The memory row of position `first`, and the elements from one
          // row of the walk to the next.
          const int64_t first_row = reverse ? s.len - 1 - first : first;
          const int64_t row_step = reverse ? -s.inner : s.inner;
          const int r0 = lane / kPieces;
          const int64_t column = column0 + (lane % kPieces) * kPieceElems;
          const bool column_ok = column < s.inner;
          const U* at = from + outer_base + column + first_row * s.inner + r0 * row_step;
          if (kStagedInteriorFetch<Op, U> && interior) {
            // Every copy of the step valid: the stride walk, testing nothing.
#pragma unroll
            for (int i = 0; i < (kSpan + kRoundRows - 1) / kRoundRows; ++i) {
              if (kSpan % kRoundRows == 0 || r0 + i * kRoundRows < kSpan) {
                cp_async16<kStagedPrefetch256<Op>>(to + (i * 32 + lane) * 16, at, true);
              }
              at += kRoundRows * row_step;
            }
          } else if constexpr (sizeof(U) >= 4) {
            // Inputs of 8 or 16 pieces a row: the stride walk, where only
            // steps at either end of the axis test their rows. (Each
            // address from its position took 275 of float32 logcumsumexp
            // forward's 1200 instructions a warp and step; the stride walk
            // ran faster, most for bfloat16 cummax backward, whose indices
            // are 8 bytes.)
            const bool inside = first >= 0 && first + kSpan <= s.len;
#pragma unroll
            for (int i = 0; i < (kSpan + kRoundRows - 1) / kRoundRows; ++i) {
              const int r = r0 + i * kRoundRows;
              if (kSpan % kRoundRows == 0 || r < kSpan) {
                const bool valid = column_ok && (inside || static_cast<uint64_t>(first + r) <
                                                               static_cast<uint64_t>(s.len));
                cp_async16<kStagedPrefetch256<Op>>(to + (i * 32 + lane) * 16, valid ? at : from,
                                                   valid);
              }
              at += kRoundRows * row_step;
            }
          } else {
            // Two-byte inputs, 4 pieces a row (8 at two columns a lane):
            // each address from its position. The stride walk with its
            // tests on every step ran slower here, and took more registers.
            constexpr int kAll = kSpan * kPieces;
#pragma unroll
            for (int i = 0; i < (kAll + 31) / 32; ++i) {
              const int c = i * 32 + lane;
              if (kAll % 32 == 0 || c < kAll) {
                const int r = c / kPieces;
                const int q = c - r * kPieces;
                const int64_t p = first + r;
                const bool valid = p >= 0 && p < s.len && column0 + q * kPieceElems < s.inner;
                const U* at = from;
                if (valid) {
                  const int64_t l = reverse ? s.len - 1 - p : p;
                  at += outer_base + l * s.inner + column0 + q * kPieceElems;
                }
                cp_async16<kStagedPrefetch256<Op>>(to + c * 16, at, valid);
              }
            }
          }
          to += kSpan * W * int{sizeof(U)};
        });
      }
      cp_async_commit();
    };
#pragma unroll
    for (int j = 0; j < S - 1; ++j) fetch(j, j);
    int slot = 0;
    Total carry[C];
#pragma unroll
    for (int j = 0; j < C; ++j) carry[j] = totals_of(op).identity();
    for (int64_t step = 0; step < steps; ++step, slot = slot == S - 1 ? 0 : slot + 1) {
      // The region refilled now was read by this warp at the step before.
      __syncwarp();
      fetch(step + S - 1, slot == 0 ? S - 1 : slot - 1);
      cp_async_wait<S - 1>();
      __syncwarp();
      // The view reads row k of the warp's positions at k * W + column: each
      // input's pointer is past its halo row, and the next scan position is
      // the next row.
      Op view = op;
      {
        char* at = region(slot);
        view.for_each_input([&](auto& ptr) {
          using P = std::remove_reference_t<decltype(ptr)>;
          ptr = reinterpret_cast<P>(at) + H * W;
          at += kSpan * W * int{sizeof(*ptr)};
        });
        if constexpr (ReadsNeighbors<Op>::value) view.scan_step = W;
      }
      const int64_t first = step * kStepLen + int64_t{warp} * K;
      State cur[C][K];
      Aux cur_aux[C][K];
      RunMemoOf<Op> memo[C];
#pragma unroll
      for (int j = 0; j < C; ++j) {
        const int column = j * 32 + lane;
        const int64_t p_end = column0 + column < s.inner ? s.len : 0;
        // Only the axis positions matter here (the view has its own
        // offsets). (with_interior_hint, slightly faster for float32
        // cumprod backward, was slower for bfloat16.)
        LineWalk walk = LineWalk::from<K>(Line{0, 0, s.len, reverse}, first, p_end);
#pragma unroll
        for (int k = 0; k < K; ++k) cur[j][k] = op.identity();
        walk.for_each_valid<K, kWholeRunPath<Op>>([&](int k) {
          cur[j][k] = view.load(k * W + column, walk.l);
          if constexpr (AuxTrait<Op>::kHas) cur_aux[j][k] = view.aux(k * W + column, walk.l);
        });
        totals[step % 2][warp][column] = fold_run(op, cur[j], memo[j]);
      }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < C; ++j) {
        const int column = j * 32 + lane;
        const int64_t p_end = column0 + column < s.inner ? s.len : 0;
        const Line line{outer_base + column0 + column, s.inner, s.len, reverse};
        if constexpr (kFoldEarlierWarpsOnly<Op>) {
          if (step != 0) carry[j] = carries[(step - 1) % 2][column];
        }
        finish_strip_step(op, line, first, p_end, cur[j], cur_aux[j], memo[j],
                          totals[step % 2], column, carry[j],
                          carries[step % 2][column]);
      }
    }
    // The next strip's first totals reuse buffer 0, its first copies the
    // regions read last.
    __syncthreads();
  }
}

// Whether an op's strips are staged: where that pays (kStagingPays), its
// inputs 16-byte aligned, and every row a whole number of 16-byte pieces of
// each (8 elements of the narrowest input, two bytes, make 16 bytes).
template <typename Op>
bool staged_strips_fit(const Op& op, const ScanShape& s) {
  if constexpr (kStagingPays<Op>) {
    return arrays_aligned16<false>(op, 0) && s.inner % 8 == 0;
  } else {
    (void)op, (void)s;
    return false;
  }
}

// Launches the staged strips of an op, whose inputs must be named with
// element sizes that add up to kInputBytes.
template <typename Op>
KernelStatus launch_staged_strips(const Op& op, const ScanShape& s, bool reverse,
                                  cudaStream_t stream) {
  if constexpr (kStagingPays<Op>) {
    int bytes = 0;
    op.for_each_input([&](const auto* from) { bytes += int{sizeof(*from)}; });
    if (bytes != Op::kInputBytes) return KernelStatus::invalid("scan: an op misnames its inputs");
    constexpr int kSmem = kStagedSmemBytes<Op>;
    auto kernel = staged_strips_kernel<Op>;
    // Above 48 KiB, dynamic shared memory must be opted into per kernel.
    const KernelStatus st = to_status(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    if (!st.is_ok()) return st;
    const int64_t per_outer = ceil_div(s.inner, kStagedWidth<Op>);
    const unsigned grid = static_cast<unsigned>(std::min(s.outer * per_outer, kMaxBlocks));
    kernel<<<grid, kStripBlock, kSmem, stream>>>(op, s, reverse, per_outer);
    return launch_status();
  } else {
    (void)op, (void)s, (void)reverse, (void)stream;
    return KernelStatus::invalid("scan: no staged strips for this op");
  }
}

// Launches the strips of an op through registers.
template <typename Op>
KernelStatus launch_column_strips(const Op& op, const ScanShape& s, int64_t strips_per_outer,
                                  bool reverse, cudaStream_t stream) {
  const unsigned grid =
      static_cast<unsigned>(std::min(s.outer * strips_per_outer, kMaxBlocks));
  column_strips_kernel<<<grid, kStripBlock, 0, stream>>>(op, s, reverse, strips_per_outer);
  return launch_status();
}

}  // namespace scan
}  // namespace baracuda
