// Staged logcumsumexp gradient: the staged long rows (scan_staged_rows.cuh)
// for logcumsumexp's backward (LogcumsumexpBackward, scan_ops.h) on float32
// and two-byte elements, on the tiles base StagedGradTiles
// (scan_staged_grad_tiles.cuh) or, for two-byte rows of whole 128-byte
// lines, StagedSwizzledGradTiles (scan_staged_swizzled_grad.cuh). Same loop
// and conditions as the staged long rows (rows starting 16 bytes aligned,
// compute capability 9.0 and up); only the tiles differ. Included by
// scan_launch.cuh. No torch headers.
//
// In the backward's scan order, dx_s = exp(x_s - y_s) S_s with
// S_s = sum over the terms j up to s of dy_j exp(y_s - y_j), a linear
// recurrence: S_s = dy_s + exp(y_s - y_{s-1}) S_{s-1}. y never rises along
// the scan (it is the forward's running log-sum), so every factor is at most
// 1 and nothing overflows, however far y spreads. A stretch of the scan
// sums to (m, s): m the y of its last element, s its S from its own terms
// alone; stretches join by one exp (TrailingSumCombine). A run folds
// and scans by the recurrence, one exp an element, where
// LogcumsumexpBackward's scaled sums weigh every term against the run's
// largest and rejoin the run at every element.
//
// Every exp of a run -- its factors and the weights exp(x_s - y_s) of dx --
// is the bare power of two (exp_of_gap), float32 included. A factor's
// arguments are neighbouring y, close together, so it is off by about the
// instruction's 2^-22, and a run chains 16 of them: about 4e-6 relative on
// the terms carried furthest, where LogcumsumexpBackward's float32 sums keep
// 6e-7 (scan_ops.h). A weight's argument, rounded once, puts it off by
// |x - y| 2^-24 besides: under 6e-6 relative down to where the power
// flushes to 0 (x more than 87 below y, a weight under 1e-38). Float32
// tiles' joins take the corrected exp_nonpositive; two-byte tiles' the bare
// power too (exp_nonpositive_for), whose error stays a thousandth of a
// two-byte step, as their factors' do.
//
// Faster than staged tiles that joined LogcumsumexpBackward's scaled sums
// along every run (float32 less so with its corrected exp in the runs).
// Slower: float32 folds that left each run's factors and weights in the
// stage for its scan (128 registers).
//
// Special values as LogcumsumexpBackward gives them: an element whose y is
// infinite carries no term (an all -inf prefix; everything after a +inf),
// dx is 0 where x is -inf or S is 0, and a NaN in y reaches every S after it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "scan/scan_staged_grad_tiles.cuh"
#include "scan/scan_staged_swizzled_grad.cuh"

namespace baracuda {
namespace scan {

template <typename Op>
constexpr bool kStagedLogcumsumexpGradApply = IsStagedGradOf<LogcumsumexpBackward, Op>::value;

// A stretch of the recurrence above: m the y of its last element, s the S
// there from its own terms alone. Its own type, not ScaledSum: the block
// scans take ScaledSum<float> by reference to its largest exponent
// (kScansByReference, scan_block.cuh), which is not this join.
template <typename Acc>
struct TrailingSum {
  Acc m;
  Acc s;
};

// The join of stretches. The identity, an empty stretch, is (+inf, 0); so
// is a stretch of elements whose y is +inf, which in the forward's output
// only ever come first in the scan. T: the elements' type; two-byte
// elements join by the bare power (exp_nonpositive_for), as every factor
// inside a run already is.
template <typename Acc, typename T = Acc>
struct TrailingSumCombine {
  using State = TrailingSum<Acc>;
  __device__ State identity() const { return {-neg_inf<Acc>(), Acc(0)}; }
  __device__ State combine(State a, State b) const {
    if (b.m == -neg_inf<Acc>() && b.s == Acc(0)) return a;
    if (a.s == Acc(0)) return b;  // nothing carried: no factor, no NaN from inf - inf
    return {b.m, fma(exp_nonpositive_for<T>(b.m - a.m), a.s, b.s)};
  }
};

// Base: the tiles' layout, StagedGradTiles or StagedSwizzledGradTiles
// (scan_staged_swizzled_grad.cuh), x being the input dx's weights alone read.
template <typename Op, bool kReverse, typename Base = StagedGradTiles<Op, kReverse, 1>>
struct StagedLogcumsumexpGradTiles : Base {
  using T = typename Op::Storage;
  using Base::Base;
  using Base::op;
  using Base::len;
  static constexpr bool kSwizzled = !std::is_same<TensorMapsOf<Base>, NoTensorMaps>::value;
  // kStride rather than kGroups: faster for float32 and on the swizzled
  // tiles (half as many tiles), slower for two-byte StagedGradTiles.
  static constexpr LookBack kLookBack =
      sizeof(T) == 4 || kSwizzled ? LookBack::kStride : LookBack::kGroups;
  static constexpr int R = Base::R;                // a run's elements
  static constexpr int kVectors = Base::kVectors;  // and its vectors of each input
  using Acc = float;
  using Totals = TrailingSumCombine<Acc, T>;
  using Total = TrailingSum<Acc>;
  static_assert(std::is_same<StateOf<Op>, ScaledSum<Acc>>::value, "float accumulators");

  struct PlainFold {
    Total before;  // everything in the tile before the thread's run
  };
  struct MemoFold {
    Total before;
    bool finite;  // every y of the thread's run (a whole tile's) is finite
  };
  // The swizzled tiles keep what the fold found of the run's finiteness
  // for the scan, which otherwise sums the run's y again (measured faster,
  // scan_staged_swizzled_grad.cuh); the others keep their measured
  // registers.
  static constexpr bool kMemo = kSwizzled;
  using Fold = std::conditional_t<kMemo, MemoFold, PlainFold>;

  __device__ Totals totals() const { return {}; }

  // One element's stretch: its y, and its term unless y is infinite.
  __device__ static Total element_stretch(Acc y, Acc dy) {
    return {y, is_finite(y) || y != y ? dy : Acc(0)};
  }
  // exp(d) as 2^(d log2(e)) by the bare instruction (see the head of the
  // file); 0 for d = -inf.
  __device__ static Acc exp_of_gap(Acc d) { return exp2_flush(d * 1.44269502f); }
  __device__ static Acc dx_of(Acc x, Acc y, Acc s) {
    // The product formed whatever the case, then dropped: a select, where
    // the condition around the product became predicated instructions and
    // a move of zero.
    const Acc dx = exp_of_gap(x - y) * s;
    return x == neg_inf<Acc>() || s == Acc(0) ? Acc(0) : dx;
  }

  // Whether every y(k) of the thread's run is finite (their sum is).
  template <typename Y>
  __device__ static bool run_finite(Y&& y) {
    Acc sum = Acc(0);
#pragma unroll
    for (int k = 0; k < R; ++k) sum += y(k);
    return is_finite(sum);
  }
  // Carries `st` along the thread's run (y(k), dy(k): its k-th element in
  // scan order), handing out(k, S_k). Where every y of the run is finite
  // (run_finite) the recurrence runs bare; otherwise element by element
  // through the join, which keeps infinities to their meaning.
  template <typename Y, typename Dy, typename Out>
  __device__ static void walk_run(Total& st, Y&& y, Dy&& dy, Out&& out, bool finite) {
    if (finite) {
      // An empty carry's m may be anything: its factor must be 0, not NaN.
      Acc m = st.s == Acc(0) ? -neg_inf<Acc>() : st.m, s = st.s;
#pragma unroll
      for (int k = 0; k < R; ++k) {
        const Acc yk = y(k);
        s = fmaf(exp_of_gap(yk - m), s, dy(k));
        m = yk;
        out(k, s);
      }
      st = {m, s};
      return;
    }
    const Totals join;
#pragma unroll
    for (int k = 0; k < R; ++k) {
      st = join.combine(st, element_stretch(y(k), dy(k)));
      out(k, st.s);
    }
  }

  __device__ Total fold(const StagedPlace& p, unsigned char* stage, Fold& f) const {
    __shared__ typename BlockTotalsScan<Totals>::TempStorage scratch;
    Total run = totals().identity();
    if (Base::whole(p)) {
      uint4 dy[kVectors], y[kVectors];
      Base::load_run(stage, 0, dy);
      Base::load_run(stage, 2, y);
      const auto y_at = [&](int k) { return Base::element(y, Base::memory_of(k)); };
      const bool finite = run_finite(y_at);
      if constexpr (kMemo) f.finite = finite;
      walk_run(
          run, y_at, [&](int k) { return Base::element(dy, Base::memory_of(k)); },
          [](int, Acc) {}, finite);
    } else {
      Base::for_each_short(p, [&](int64_t, int64_t off) {
        const Total e = element_stretch(to_acc<Acc>(op.y[off]), to_acc<Acc>(op.dy[off]));
        run = totals().combine(run, e);
      });
    }
    return join_staged_runs(scratch, totals(), run, f.before);
  }

  template <typename... Maps>
  __device__ void scan(const StagedPlace& p, unsigned char* stage, const Fold& f,
                       const Total& carry, const typename Base::Prefetched& pre = {},
                       const Maps&... maps) const {
    Total st = totals().combine(carry, f.before);
    if (!Base::whole(p)) {
      Base::for_each_short(p, [&](int64_t, int64_t off) {
        const Acc yv = to_acc<Acc>(op.y[off]);
        st = totals().combine(st, element_stretch(yv, to_acc<Acc>(op.dy[off])));
        op.dx[off] = from_acc<T>(dx_of(to_acc<Acc>(op.x[off]), yv, st.s));
      });
      return;
    }
    uint4 dy[kVectors], x[kVectors], y[kVectors], out[kVectors];
    Acc held = Acc(0);  // a pair's first dx, two-byte elements
    Base::load_run(stage, 0, dy);
    if constexpr (Base::kPrefetches) {
#pragma unroll
      for (int q = 0; q < kVectors; ++q) x[q] = pre.raw[q];
    } else {
      Base::load_run(stage, 1, x);
    }
    Base::load_run(stage, 2, y);
    const auto y_at = [&](int k) { return Base::element(y, Base::memory_of(k)); };
    bool finite;
    if constexpr (kMemo) {
      finite = f.finite;
    } else {
      finite = run_finite(y_at);
    }
    walk_run(
        st, y_at, [&](int k) { return Base::element(dy, Base::memory_of(k)); },
        [&](int k, Acc s) {
          const int e = Base::memory_of(k);
          const Acc dx = dx_of(Base::element(x, e), Base::element(y, e), s);
          if constexpr (sizeof(T) == 2) {
            // Two-byte dx go out a pair at a time (pack_two): memory
            // elements 2w and 2w + 1 are scan elements k - 1 and k.
            if (k % 2 == 0) {
              held = dx;
            } else {
              const uint32_t word = kReverse ? pack_two<T>(dx, held) : pack_two<T>(held, dx);
              memcpy(reinterpret_cast<unsigned char*>(out) + (e / 2) * 4, &word, 4);
            }
            return;
          }
          set_run_element<T>(out, e, dx);
        },
        finite);
    this->store_dx(p, stage, out, op.dx, maps...);
  }
};

}  // namespace scan
}  // namespace baracuda
