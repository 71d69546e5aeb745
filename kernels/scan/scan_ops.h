// The scan family as (load -> state, combine, state -> store) triples over one
// engine. A state summarises a run of consecutive elements in scan order;
// combine(a, b) joins a run `a` with the run `b` that follows it, and must be
// associative (the engines regroup freely, in a fixed, timing-independent
// order). load(off, l) turns the element at memory offset `off` (position `l`
// on the axis) into a state; store(off, l, incl) receives the state of
// everything up to and including the element. Storage names the element
// type (engines size their batches by it). An op whose store reads memory
// besides the state names that as Aux: aux(off, l) reads it and
// store_with(off, l, incl, aux) uses it, so an engine that prefetches
// (column_strips) can load it with the states; store(off, l, incl) reads it
// on the spot.
// An op whose load and aux read element `off` of some input arrays and no
// other memory may name them: for_each_input(f) calls f on each of those
// pointer members, by reference, and kInputBytes is their element sizes
// summed. An engine may then copy a tile of every input elsewhere (shared
// memory) and run loads on a copy of the op pointed at it (column_strips).
// An op that also reads those arrays at the scan positions just before and
// just after its own (kReadsNeighbors) finds them at off - scan_step and
// off + scan_step, scan_step being a member that such an engine sets for
// its copy; it also has a member `interior`, which an engine may set on a
// copy it hands only positions that are neither the first nor the last of
// the scan, so that the op skips its tests for the axis ends.
// An op whose inputs are all arrays of its Storage, read at the element
// (and, with kReadsNeighbors, at its neighbours) alone, and whose store
// writes one more such array at the element and no other memory
// (kWholeRunIo) names it too: for_each_output(f) calls f on that pointer
// member, by reference. An engine may then move a thread's run of each array
// as one vector (with the neighbours around it) and run load, aux and store
// on a copy of the op pointed at registers (scan_block.cuh).
//
// Compiled for host and device: the CPU engine and the CUDA engine run the
// very same functors. T is the storage type, Acc the accumulation type
// (float for half types).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/acc_convert.h"
#include "common/fast_exp2.h"
#include "common/unit_types.h"

namespace baracuda {
namespace scan {

#define BHD BARACUDA_HOST_DEVICE

// for (int k = 0; k < N; ++k) { ... } over a run of N, unrolled in device
// code where N passes 32 (two-byte runs of a 128-byte line): rolled, a loop
// whose body is a join indexes the run by a variable, which puts the whole
// run in local memory. Shorter runs keep the compiler's own choice, as they
// were measured.
#ifdef __CUDA_ARCH__
#define BARACUDA_DEVICE_UNROLL _Pragma("unroll")
#else
#define BARACUDA_DEVICE_UNROLL
#endif
#define BARACUDA_RUN_LOOP(N, k, ...)                 \
  if constexpr ((N) > 32) {                          \
    BARACUDA_DEVICE_UNROLL                           \
    for (int k = 0; k < (N); ++k) { __VA_ARGS__ }    \
  } else {                                           \
    for (int k = 0; k < (N); ++k) { __VA_ARGS__ }    \
  }

template <typename Acc> BHD Acc neg_inf() { return -INFINITY; }
template <typename Acc> BHD bool is_nan(Acc v) { return v != v; }
// Neither infinite nor NaN.
template <typename Acc> BHD bool is_finite(Acc v) { return v - v == Acc(0); }

// How far below the largest exponent of a run, or of the totals a fold
// joins, a term may lie and still be weighed as a plain float against it:
// a weight of e^-64 or more keeps a sum of them far from both float's
// underflow and its overflow. Every "tame" test of the scans (runs scanned
// against their largest element, folds of scaled sums by reference) uses
// this one span.
template <typename Acc>
constexpr Acc kTameSpan = Acc(64);

// log(s) for s > 0 of moderate size (a sum of weights, never subnormal). On
// the GPU (float): log2 by the bare instruction (absolute error ~2^-22), in
// its flush-to-zero form (the other form tests for subnormal inputs and
// scales them, at every call), times ln 2 (measured faster).
BHD inline float log_of(float s) {
#ifdef __CUDA_ARCH__
  float log2_s;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(log2_s) : "f"(s));
  return log2_s * 0.693147181f;
#else
  return logf(s);
#endif
}
BHD inline double log_of(double s) { return log(s); }

// ---------------------------------------------------------------- combines

template <typename Acc>
struct SumCombine {
  using State = Acc;
  // -0 is the identity of addition (+0 would turn a lone -0 into +0).
  BHD State identity() const { return -Acc(0); }
  BHD State combine(State a, State b) const { return a + b; }
};

template <typename Acc>
struct ProdCombine {
  using State = Acc;
  BHD State identity() const { return Acc(1); }
  BHD State combine(State a, State b) const { return a * b; }
};

// exp(d) for d <= 0 up to rounding (-inf gives 0, NaN gives NaN). On the GPU
// the float case is a scan's inner cost, so it skips expf: 2^y with
// y = d log2(e), the product's rounding error put back (without that, the
// result is off by up to 3.6e-6 relative at d ~ -87), the power by the bare
// instruction (relative error ~2^-22). Results below 2^-126 flush to 0: the
// callers add them to a term of 1 (log-add-exp, scaled sums) or scale a
// gradient by them. The same form holds for d up to 88 (2^y below 2^127);
// join_folds_on_reference (scan_publish.cuh) takes it up to 20.
BHD inline float exp_nonpositive(float d) {
#ifdef __CUDA_ARCH__
  constexpr float kLog2e = 1.44269502f, kLog2eLow = 1.925963e-8f, kLn2 = 0.693147181f;
  // Below -104 the power flushes to 0 anyway; the clamp keeps -inf (whose
  // correction term would be NaN) out, and lets NaN through.
  d = d < -104.f ? -104.f : d;
  const float y = d * kLog2e;
  const float y_lost = fmaf(d, kLog2e, -y) + d * kLog2eLow;
  const float e = exp2_flush(y);
  return fmaf(e, y_lost * kLn2, e);
#else
  return expf(d);
#endif
}
BHD inline double exp_nonpositive(double d) { return exp(d); }

// exp_nonpositive where the result reaches nothing finer than a two-byte
// element T (float16, bfloat16: 11 and 8 significant bits): on the GPU the
// power of d log2(e) as rounded, without the correction (off by up to
// 3.6e-6 relative, a thousandth of a bfloat16 step, for about five
// instructions fewer). Elsewhere exp_nonpositive.
template <typename T>
BHD inline float exp_nonpositive_for(float d) {
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(T) == 2) return exp2_flush(d * 1.44269502f);
#endif
  return exp_nonpositive(d);
}
template <typename T>
BHD inline double exp_nonpositive_for(double d) {
  return exp_nonpositive(d);
}

// exp(x - hi) for x <= hi, as exp_nonpositive_for<T>(x - hi); on the GPU,
// for a two-byte T, the subtraction folds into the scaling: 2^(x log2(e) -
// hi log2(e)), one fma, with hi log2(e) rounded once (the same for every x
// of a run). That puts the exponent off by up to |hi| 2^-24: under 2^-14
// relative for |hi| < 1024, and where |hi| is larger, the two-byte results
// near it have a step larger still.
template <typename T>
BHD inline float exp_below_for(float x, float hi) {
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(T) == 2) {
    constexpr float kLog2e = 1.44269502f;
    return exp2_flush(fmaf(x, kLog2e, -(hi * kLog2e)));
  }
#endif
  return exp_nonpositive_for<T>(x - hi);
}
template <typename T>
BHD inline double exp_below_for(double x, double hi) {
  return exp_nonpositive(x - hi);
}

// Hands f(k, w_k) the weights w_k = exp(e(k) - hi) of a run's N terms, in
// order (every e(k) <= hi), for the running sums of a scaled run. `span`
// bounds hi - e over the terms every one of those sums holds (a
// logcumsumexp forward run's first element; a backward run's every term).
// For float on the GPU, where span <= kBareWeightSpan, a weight is the bare
// power of (e - hi) log2(e) as rounded: that rounding puts it off by
// |e - hi| 2^-24 relative, so each sum by at most about (span + 2) 2^-24
// = 6e-7 relative (a weighted mean over its terms; far terms weigh
// little), where the instruction's own error is about 2^-22. That skips the
// correction exp_nonpositive makes for a lone result, five instructions a
// weight (measured faster; with no span limit, faster still). Wider runs,
// and every other type, take exp_below_for: a wide run's results near its
// start already carry the rounding of log(S) (up to 64 x 2^-24,
// test_logcumsumexp_float32_rising_runs_near_zero), and bare weights would
// add as much again.
constexpr float kBareWeightSpan = 8.f;

template <typename T, int N, typename Acc, typename Exponent, typename F>
BHD void for_each_run_weight(Acc hi, Acc span, Exponent e, F f) {
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(T) == 4 && sizeof(Acc) == 4) {
    if (span <= kBareWeightSpan) {
      for (int k = 0; k < N; ++k) f(k, exp2_flush((e(k) - hi) * 1.44269502f));
      return;
    }
  }
#endif
  for (int k = 0; k < N; ++k) f(k, exp_below_for<T>(e(k), hi));
}

// log(1 + exp(d)) for a finite d <= 0: what log_add_exp adds to the larger
// argument. On the GPU (float) it skips log1pf (~40 instructions):
// log1p(e) = 2 atanh(t), t = e / (2 + e) in [0, 1/3], as the odd series
// 2 t (1 + t^2/3 + t^4/5 + ...) cut after t^15 (next term < 2e-9).
// Emulated in float32 over d in [-87, 0], it stays within 2.7e-7 of the exact
// value, relative, as log1pf(expf(d)) does (2.6e-7), before the instruction's
// own error.
BHD inline float log1p_exp(float d) {
#ifdef __CUDA_ARCH__
  const float e = exp_nonpositive(d);
  const float t = __fdividef(e, 2.f + e);
  const float t2 = t * t;
  float p = 1.f / 15.f;
  p = fmaf(p, t2, 1.f / 13.f);
  p = fmaf(p, t2, 1.f / 11.f);
  p = fmaf(p, t2, 1.f / 9.f);
  p = fmaf(p, t2, 1.f / 7.f);
  p = fmaf(p, t2, 1.f / 5.f);
  p = fmaf(p, t2, 1.f / 3.f);
  p = fmaf(p, t2, 1.f);
  return 2.f * t * p;
#else
  return log1pf(expf(d));
#endif
}
BHD inline double log1p_exp(double d) { return log1p(exp(d)); }

// log(exp(a) + exp(b)) without overflow; -inf is the identity, so an all
// -inf prefix stays -inf (never NaN), and +inf absorbs everything but NaN.
template <typename Acc>
BHD Acc log_add_exp(Acc a, Acc b) {
  if (is_nan(a) || is_nan(b)) return a + b;
  const Acc hi = a > b ? a : b;
  const Acc lo = a > b ? b : a;
  if (lo == neg_inf<Acc>() || hi == -neg_inf<Acc>()) return hi;
  return hi + log1p_exp(lo - hi);
}

template <typename Acc>
struct LogAddExpCombine {
  using State = Acc;
  BHD State identity() const { return neg_inf<Acc>(); }
  BHD State combine(State a, State b) const { return log_add_exp(a, b); }
};

// A sum of terms c_j exp(e_j) (any signs c_j) kept as m = the largest e_j and
// s = sum of c_j exp(e_j - m): joining two runs costs one exp, where the log
// domain (log_add_exp) costs an exp and a log1p per join and needs separate
// runs for positive and negative terms. m = -inf is the empty run (the
// identity); +inf absorbs everything but NaN; NaN propagates.
// The logcumsumexp forward keeps the scalar log-domain state: with this
// two-word state it measured slower on most shapes, while the backward ran
// twice as fast.
template <typename Acc>
struct ScaledSum {
  Acc m;
  Acc s;
};

template <typename Acc>
struct ScaledSumCombine {
  using State = ScaledSum<Acc>;
  BHD State identity() const { return {neg_inf<Acc>(), Acc(0)}; }
  BHD State combine(State a, State b) const {
    if (is_nan(a.m) || is_nan(b.m)) return {a.m + b.m, a.s + b.s};
    if (b.m == neg_inf<Acc>()) return a;
    if (a.m == neg_inf<Acc>()) return b;
    const bool a_high = a.m >= b.m;
    const State hi = a_high ? a : b;
    const State lo = a_high ? b : a;
    // Equal exponents (two +inf included, where lo.m - hi.m is NaN) weigh 1.
    const Acc w = lo.m == hi.m ? Acc(1) : exp_nonpositive(lo.m - hi.m);
    return {hi.m, hi.s + lo.s * w};
  }
};

// Running extreme with its index, exactly as torch's cummax / cummin: a NaN
// always takes over (so the last NaN so far wins) and nothing but a NaN
// replaces a NaN; otherwise a later element wins ties (>= / <=). That is a
// selection by one total order, hence associative.
// index < 0 marks the identity (no element yet). Pos, the type of a position
// on the axis, is int32 wherever the axis allows (scan_dispatch.h): the
// state is then 8 bytes for float, not 16, and a block holds twice as many.
template <typename Acc, typename Pos>
struct ValueIndex {
  Acc value;
  Pos index;
};

template <typename Acc, typename Pos, bool kMax>
struct ExtremeCombine {
  using State = ValueIndex<Acc, Pos>;
  BHD State identity() const { return {Acc(0), -1}; }
  BHD State combine(State a, State b) const {
    if (b.index < 0) return a;
    if (a.index < 0) return b;
    if (is_nan(b.value)) return b;
    if (is_nan(a.value)) return a;
    const bool later_wins = kMax ? b.value >= a.value : b.value <= a.value;
    return later_wins ? b : a;
  }
};

// Sum over the trailing run of equal keys. The keys of one scan are monotone
// (cummax indices), so equal keys are contiguous and the sum of a run is all
// of it that shares the last key. key < 0 marks the identity. Keys are
// positions (Pos as in ValueIndex).
template <typename Acc, typename Pos>
struct KeyedSum {
  Pos key;
  Acc sum;
};

template <typename Acc, typename Pos>
struct KeyedSumCombine {
  using State = KeyedSum<Acc, Pos>;
  BHD State identity() const { return {-1, Acc(0)}; }
  BHD State combine(State a, State b) const {
    if (b.key < 0) return a;
    if (a.key == b.key) return {b.key, a.sum + b.sum};
    return b;
  }
};

// The affine map q -> scale * q + shift; a run composes its maps in order
// (earlier first). Applied to 0 it gives the recurrence's value.
template <typename Acc>
struct Affine {
  Acc scale;
  Acc shift;
};

template <typename Acc>
struct AffineCombine {
  using State = Affine<Acc>;
  BHD State identity() const { return {Acc(1), Acc(0)}; }
  BHD State combine(State a, State b) const {
    return {b.scale * a.scale, b.scale * a.shift + b.shift};
  }
};

// ---------------------------------------------------------------- forward ops

// One storage array in (src), one out (dst), the state being the
// accumulated value itself and the store reading the inclusive state alone.
// kPlainIo tells an engine it may move such runs as whole 16-byte vectors
// (scan_block.cuh) rather than element by element through load and store;
// they are whole-run ops too (kWholeRunIo).
template <typename T, typename Acc>
struct PlainIo {
  static constexpr bool kPlainIo = true;
  static constexpr bool kWholeRunIo = true;
  const T* src;
  T* dst;
  static constexpr int kInputBytes = sizeof(T);
  template <typename F> BHD void for_each_input(F&& f) { f(src); }
  template <typename F> BHD void for_each_input(F&& f) const { f(src); }
  template <typename F> BHD void for_each_output(F&& f) { f(dst); }
  template <typename F> BHD void for_each_output(F&& f) const { f(dst); }
  BHD Acc load(int64_t off, int64_t) const { return to_acc<Acc>(src[off]); }
  BHD void store(int64_t off, int64_t, Acc incl) const { dst[off] = from_acc<T>(incl); }
};

// cumsum / cumprod: y (dst) = inclusive scan of x (src).
template <typename T, typename Acc, template <typename> class Combine>
struct PlainForward : Combine<Acc>, PlainIo<T, Acc> {
  using State = typename Combine<Acc>::State;
  using Storage = T;
};

// logcumsumexp forward: the log-domain scan, with a cheaper scan of one
// thread's own run of N consecutive elements, which the CUDA engines call in
// place of N log_add_exp joins (kRunScan). When the run is tame -- its
// largest element hi finite, its first within 64 of hi -- the weights
// w_k = exp(x_k - hi) do not overflow, and their running sum S_k is at
// least w_0 >= e^-64, so a weight flushed to 0 (below 2^-126) costs it
// under e^-23 relative. With everything before the run the scaled sum
// (m, s) and top = max(m, hi):
//   y_k = top + log(s exp(m - top) + exp(hi - top) S_k),
// an exp and a log per element where log_add_exp costs an exp, a division
// and a series. A -inf after the first element weighs 0, and a NaN there
// turns S_k, and so every result from it on, to NaN, as the joins would.
// A run of -inf alone (a masked stretch of logits, or the identity an
// engine puts past the end of a row) adds nothing: its total is the
// identity and each of its results the prefix's, as the joins give
// them, but at many times a tame run's cost once unrolled over a long
// run (on masked input this measured faster than the joins).
// With kLateRuns, a run that starts with -inf and is tame from its lead,
// its first element that is not -inf (a masked stretch ends inside it),
// is weighed as a tame run whose first element is the lead: the -inf
// before it weigh 0, so a running sum is 0 before the lead and at least
// e^-64 from it on, and the results before it are the prefix's. Without
// it such runs take the joins, up to 64 of them in the fold and again in
// the scan. Only the column strips take kLateRuns (with_late_runs): there
// it ran much faster on masked input and about as fast on unmasked. Given to
// every engine, it slowed unmasked float32 rows, and of the row engines
// only float32 long rows gained on masked input.
// Other runs (+inf, a first element NaN or far below hi, a NaN before the
// lead) take the joins. Which way a run goes depends on its data alone,
// so results stay bit-reproducible. (Testing the first element rather
// than every element's span measured faster.)
//
// The runs' totals are joined (across threads, warps, blocks and tiles) as
// scaled sums (TotalCombine): a join costs one exp where log_add_exp costs
// an exp and a log1p, and a tame run's total is (hi, S_N) with no log at
// all. run_total leaves the weights in place of the elements and what
// scan_run needs of the run in a RunMemo, so each element costs one exp.
template <typename T, typename Acc, bool kLateRuns = false>
struct LogcumsumexpForward : LogAddExpCombine<Acc>, PlainIo<T, Acc> {
  using State = Acc;
  using Storage = T;
  static constexpr bool kRunScan = true;
  using TotalCombine = ScaledSumCombine<Acc>;
  using Total = ScaledSum<Acc>;
  struct RunMemo {
    Acc hi;       // the run's largest element (fmax: NaN passed over)
    bool tame;    // the elements were replaced by their weights
    bool absent;  // every element is -inf
  };

  // fmax passes over NaN: a NaN after the first element reaches the weights
  // (above); a first one fails the comparison.
  template <int N>
  BHD static bool tame(const Acc (&x)[N], Acc& hi) {
    hi = x[0];
    for (int k = 1; k < N; ++k) hi = fmax(hi, x[k]);
    return is_finite(hi) && x[0] >= hi - kTameSpan<Acc>;
  }
  // A log-domain value as a total, and back. A total's s is at least 1
  // unless it is the empty run (m = -inf, s = 0), so m + log(s) is -inf,
  // +inf and NaN where m is.
  BHD static Total lift(Acc v) { return {v, v == neg_inf<Acc>() ? Acc(0) : Acc(1)}; }
  BHD static Acc lower(const Total& t) {
    return is_finite(t.m) ? t.m + log_of(t.s) : t.m;
  }
  // Whether every element is -inf, given the run's fmax `hi`, which is
  // -inf only when every element is -inf or NaN.
  template <int N>
  BHD static bool all_neg_inf(const Acc (&x)[N], Acc hi) {
    if (hi != neg_inf<Acc>()) return false;
    bool all = true;
    for (int k = 0; k < N; ++k) all &= x[k] == neg_inf<Acc>();
    return all;
  }
  // The run's lead: its first element that is not -inf (a NaN is one),
  // given that one is.
  template <int N>
  BHD static Acc lead_of(const Acc (&x)[N]) {
    Acc lead = x[N - 1];
    for (int k = N - 2; k >= 0; --k) lead = x[k] == neg_inf<Acc>() ? lead : x[k];
    return lead;
  }
  // The total of the whole run; a tame run's elements become their weights.
  template <int N>
  BHD Total run_total(Acc (&x)[N], RunMemo& memo) const {
    memo.tame = tame(x, memo.hi);
    Acc first = x[0];
    if constexpr (kLateRuns) {
      if (!memo.tame && first == neg_inf<Acc>() && is_finite(memo.hi)) {
        first = lead_of(x);
        memo.tame = first >= memo.hi - kTameSpan<Acc>;  // false for NaN
      }
    }
    memo.absent = !memo.tame && all_neg_inf(x, memo.hi);
    if (memo.absent) return lift(this->identity());
    if (!memo.tame) {
      Acc t = this->identity();
      BARACUDA_RUN_LOOP(N, k, t = this->combine(t, x[k]);)
      return lift(t);
    }
    Acc s = Acc(0);
    for_each_run_weight<T, N>(memo.hi, memo.hi - first, [&](int k) { return x[k]; },
                              [&](int k, Acc w) {
                                x[k] = w;
                                s += w;
                              });
    // A NaN among the elements goes into the exponent too, where the joins
    // look for it (a total (m, NaN) joined to a +inf would become +inf).
    return {is_nan(s) ? s : memo.hi, s};
  }
  // x[k] becomes the join of `prefix` and the run's elements up to k.
  template <int N>
  BHD void scan_run(const Total& prefix, Acc (&x)[N], const RunMemo& memo) const {
    if (memo.absent) {
      const Acc p = lower(prefix);
      for (int k = 0; k < N; ++k) x[k] = p;
      return;
    }
    if (!memo.tame) {
      Acc p = lower(prefix);
      BARACUDA_RUN_LOOP(N, k, x[k] = p = this->combine(p, x[k]);)
      return;
    }
    // +inf and NaN absorb every finite element; a NaN in the run (its sum
    // of weights NaN from there on) still turns a +inf to NaN.
    if (!(prefix.m == neg_inf<Acc>() || is_finite(prefix.m))) {
      Acc s = Acc(0);
      for (int k = 0; k < N; ++k) {
        s += x[k];
        x[k] = prefix.m + Acc(0) * s;
      }
      return;
    }
    const Acc top = prefix.m > memo.hi ? prefix.m : memo.hi;
    const Acc a = prefix.s * exp_nonpositive_for<T>(prefix.m - top);
    const Acc b = exp_nonpositive_for<T>(memo.hi - top);
    // A tame run's first weight is 0 only where it starts with -inf (its
    // lead later).
    const bool late = kLateRuns && x[0] == Acc(0);
    Acc s = Acc(0);
    for (int k = 0; k < N; ++k) {
      s += x[k];
      x[k] = top + log_of(a + b * s);
    }
    // Before a late run's lead the sum is 0, so each result is top + log(a),
    // the prefix's, or -inf where a underflowed: the prefix's value then.
    if (late) {
      const Acc p = lower(prefix);
      for (int k = 0; k < N; ++k) x[k] = x[k] == neg_inf<Acc>() ? p : x[k];
    }
  }
};

// The op an engine that takes late runs (above) launches: the same op,
// except logcumsumexp forward, which becomes its kLateRuns form.
template <typename Op>
BHD Op with_late_runs(const Op& op) {
  return op;
}
template <typename T, typename Acc>
BHD LogcumsumexpForward<T, Acc, true> with_late_runs(const LogcumsumexpForward<T, Acc>& op) {
  LogcumsumexpForward<T, Acc, true> late;
  static_cast<PlainIo<T, Acc>&>(late) = op;  // its pointers, whatever they are
  return late;
}

// linear_scan: h_t = a_t h_{t-1} + b_t with h_{-1} = 0 (the op layer
// folds a given h0 into b's first position). Element t is the affine map
// q -> a_t q + b_t; the composition up to t applied to 0 is its shift, h_t.
// No division anywhere: zeros in a are exact. The tree-shaped joins also
// form products of a over stretches, so where such a product overflows
// (|a| > 1 over a long stretch) a result can be NaN where the sequential
// recurrence, whose h stayed 0 until then, is finite.
template <typename T, typename Acc>
struct LinearScanForward : AffineCombine<Acc> {
  using State = Affine<Acc>;
  using Storage = T;
  static constexpr bool kWholeRunIo = true;  // a, b in, h out, at the element
  const T* a;
  const T* b;
  T* h;
  static constexpr int kInputBytes = 2 * sizeof(T);
  template <typename F> BHD void for_each_input(F&& f) { f(a), f(b); }
  template <typename F> BHD void for_each_input(F&& f) const { f(a), f(b); }
  template <typename F> BHD void for_each_output(F&& f) { f(h); }
  template <typename F> BHD void for_each_output(F&& f) const { f(h); }
  BHD State load(int64_t off, int64_t) const { return {to_acc<Acc>(a[off]), to_acc<Acc>(b[off])}; }
  BHD void store(int64_t off, int64_t, State incl) const { h[off] = from_acc<T>(incl.shift); }
};

template <typename T, typename Acc, typename Pos, bool kMax>
struct ExtremeForward : ExtremeCombine<Acc, Pos, kMax> {
  using State = ValueIndex<Acc, Pos>;
  using Storage = T;
  const T* x;
  T* y;
  int64_t* indices;
  static constexpr int kInputBytes = sizeof(T);
  template <typename F> BHD void for_each_input(F&& f) { f(x); }
  template <typename F> BHD void for_each_input(F&& f) const { f(x); }
  template <typename F> BHD void for_each_output(F&& f) { f(y), f(indices); }
  template <typename F> BHD void for_each_output(F&& f) const { f(y), f(indices); }
  BHD State load(int64_t off, int64_t l) const {
    return {to_acc<Acc>(x[off]), static_cast<Pos>(l)};
  }
  BHD void store(int64_t off, int64_t, State incl) const {
    y[off] = from_acc<T>(incl.value);
    indices[off] = incl.index;
  }
};

// ---------------------------------------------------------------- backward ops
// Each runs in the opposite direction of its forward scan.

// The gradient in and out, and the saved forward input and output; the
// three inputs and the output are named for the engines that stage them
// (scan_strips.cuh) or move them as whole runs (kWholeRunIo, scan_block.cuh).
template <typename T>
struct GradWithSaved {
  const T* dy;
  const T* x;
  const T* y;
  T* dx;
  static constexpr int kInputBytes = 3 * sizeof(T);
  template <typename F> BHD void for_each_input(F&& f) { f(dy), f(x), f(y); }
  template <typename F> BHD void for_each_input(F&& f) const { f(dy), f(x), f(y); }
  template <typename F> BHD void for_each_output(F&& f) { f(dx); }
  template <typename F> BHD void for_each_output(F&& f) const { f(dx); }
};

// cumprod: dx_i = y_{i-1} R_i (y_{-1} = 1), where R_i = sum over j >= i of
// dy_j x_{i+1} ... x_j is the reverse linear recurrence
// R_i = dy_i + x_{i+1} R_{i+1} (forward order). In the backward's scan
// order, element p's affine map q -> x_{p-1} q + dy_p (x at the scan
// position before it; 1 at the first, where q is 0) composes to R_p, so
// the store reads the inclusive state alone, times y at the scan position
// after it. No division: zeros in x are exact.
template <typename T, typename Acc>
struct CumprodBackward : AffineCombine<Acc>, GradWithSaved<T> {
  using State = Affine<Acc>;
  using Storage = T;
  using GradWithSaved<T>::dy;
  using GradWithSaved<T>::x;
  using GradWithSaved<T>::y;
  using GradWithSaved<T>::dx;
  static constexpr bool kReadsNeighbors = true;
  static constexpr bool kWholeRunIo = true;  // dy, x before, y after in; dx out
  int64_t len;
  int64_t scan_step;      // memory offset from a scan position to the next
  bool scan_reverse;      // the backward walks from l = len - 1 down to 0
  bool interior = false;  // no position handed over is an end of the scan
  BHD bool first_in_scan(int64_t l) const {
    return !interior && l == (scan_reverse ? len - 1 : 0);
  }
  BHD bool last_in_scan(int64_t l) const { return !interior && l == (scan_reverse ? 0 : len - 1); }
  BHD State load(int64_t off, int64_t l) const {
    const Acc a = first_in_scan(l) ? Acc(1) : to_acc<Acc>(x[off - scan_step]);
    return {a, to_acc<Acc>(dy[off])};
  }
  using Aux = Acc;  // y at the next scan position (1 at the last position)
  BHD Aux aux(int64_t off, int64_t l) const {
    return last_in_scan(l) ? Acc(1) : to_acc<Acc>(y[off + scan_step]);
  }
  BHD void store_with(int64_t off, int64_t, State incl, Aux e) const {
    dx[off] = from_acc<T>(e * incl.shift);
  }
  BHD void store(int64_t off, int64_t l, State incl) const {
    store_with(off, l, incl, aux(off, l));
  }
};

// linear_scan backward, for h_t = a_t h_{t-1} + b_t: the gradient g_t
// reaching h_t is the reverse recurrence g_t = dh_t + a_{t+1} g_{t+1}
// (forward order), cumprod's R with a for x; db_t = g_t and
// da_t = g_t h_{t-1}. The load is cumprod's (dy = dh, x = a, y = h); the
// store reads h at the scan position after it in the backward's order, the
// forward's h_{t-1}, 0 at the forward's first position (the op layer adds
// h0's term there). Two outputs, so no whole-run moves.
template <typename T, typename Acc>
struct LinearScanBackward : CumprodBackward<T, Acc> {
  static constexpr bool kWholeRunIo = false;
  using Base = CumprodBackward<T, Acc>;
  using typename Base::State;
  T* db;
  template <typename F> BHD void for_each_output(F&& f) { f(this->dx), f(db); }
  template <typename F> BHD void for_each_output(F&& f) const { f(this->dx), f(db); }
  using Aux = Acc;  // h at the forward's position before (0 at the first)
  BHD Aux aux(int64_t off, int64_t l) const {
    return this->last_in_scan(l) ? Acc(0) : to_acc<Acc>(this->y[off + this->scan_step]);
  }
  BHD void store_with(int64_t off, int64_t, State incl, Aux h_before) const {
    this->dx[off] = from_acc<T>(h_before * incl.shift);
    db[off] = from_acc<T>(incl.shift);
  }
  BHD void store(int64_t off, int64_t l, State incl) const {
    store_with(off, l, incl, aux(off, l));
  }
};

// logcumsumexp: dx_i = exp(x_i) * sum over the later j of dy_j exp(-y_j),
// that sum kept as a scaled run with exponents -y_j and signed terms dy_j.
// For j >= i, y_j >= x_i, so exp(x_i + m) <= 1: nothing overflows that dx_i
// does not. Terms with y_j = -inf (or dy_j = 0) drop out and x_i = -inf gives
// 0, so all -inf prefixes and magnitudes like 1e4 give finite gradients.
//
// A thread's own run scans by reference (kRunScan) where it is tame -- every
// exponent finite and within 64 of the run's largest, hi: each term's
// s exp(m - hi) is then a plain float and the run is a running sum S_k, and
// with everything before the run (m, s) and top = max(m, hi), the state up
// to element k is (top, s exp(m - top) + exp(hi - top) S_k): an exp per
// element where a join costs an exp and its tests. Other runs take the joins.
template <typename T, typename Acc>
struct LogcumsumexpBackward : ScaledSumCombine<Acc>, GradWithSaved<T> {
  using State = ScaledSum<Acc>;
  using Storage = T;
  static constexpr bool kRunScan = true;
  static constexpr bool kWholeRunIo = true;  // dy, x, y in, dx out, at the element
  using TotalCombine = ScaledSumCombine<Acc>;
  struct RunMemo {
    Acc hi;     // the run's largest exponent
    bool tame;  // the terms were replaced by their weights against hi
  };
  // The total of the whole run; a tame run's terms s become s exp(m - hi).
  template <int N>
  BHD State run_total(State (&x)[N], RunMemo& memo) const {
    Acc lo = x[0].m, sum = Acc(0);
    memo.hi = x[0].m;
    for (int k = 0; k < N; ++k) {
      memo.hi = fmax(memo.hi, x[k].m);
      lo = fmin(lo, x[k].m);
      sum += x[k].m;
    }
    // The sum catches NaN and infinities, -inf (a dropped term) included.
    memo.tame = is_finite(sum) && memo.hi - lo <= kTameSpan<Acc>;
    if (!memo.tame) {
      State t = this->identity();
      for (int k = 0; k < N; ++k) t = this->combine(t, x[k]);
      return t;
    }
    Acc total = Acc(0);
    for_each_run_weight<T, N>(memo.hi, memo.hi - lo, [&](int k) { return x[k].m; },
                              [&](int k, Acc w) {
                                x[k].s *= w;
                                total += x[k].s;
                              });
    return {memo.hi, total};
  }
  // x[k] becomes the join of `prefix` and the run's terms up to k.
  template <int N>
  BHD void scan_run(const State& prefix, State (&x)[N], const RunMemo& memo) const {
    if (!memo.tame) {
      State p = prefix;
      for (int k = 0; k < N; ++k) x[k] = p = this->combine(p, x[k]);
      return;
    }
    Acc run = Acc(0);
    if (!(prefix.m == neg_inf<Acc>() || is_finite(prefix.m))) {
      // +inf or NaN before the run: the joins, from the running sums.
      for (int k = 0; k < N; ++k) {
        run += x[k].s;
        x[k] = this->combine(prefix, State{memo.hi, run});
      }
      return;
    }
    const Acc top = prefix.m > memo.hi ? prefix.m : memo.hi;
    const Acc a = prefix.s * exp_nonpositive_for<T>(prefix.m - top);
    const Acc b = exp_nonpositive_for<T>(memo.hi - top);
    for (int k = 0; k < N; ++k) {
      run += x[k].s;
      x[k] = {top, a + b * run};
    }
  }
  using GradWithSaved<T>::dy;
  using GradWithSaved<T>::x;
  using GradWithSaved<T>::y;
  using GradWithSaved<T>::dx;
  BHD State load(int64_t off, int64_t) const {
    const Acc g = to_acc<Acc>(dy[off]);
    const Acc yv = to_acc<Acc>(y[off]);
    if (yv == neg_inf<Acc>() || g == Acc(0)) return this->identity();
    return {-yv, g};
  }
  using Aux = Acc;  // x at the element
  BHD Aux aux(int64_t off, int64_t) const { return to_acc<Acc>(x[off]); }
  BHD void store_with(int64_t off, int64_t, State incl, Aux xv) const {
    Acc out = Acc(0);
    if (xv != neg_inf<Acc>() && incl.m != neg_inf<Acc>()) {
      out = exp_nonpositive_for<T>(xv + incl.m) * incl.s;
    }
    dx[off] = from_acc<T>(out);
  }
  BHD void store(int64_t off, int64_t l, State incl) const {
    store_with(off, l, incl, aux(off, l));
  }
};

// cummax / cummin: the positions j with idx_j == i are a contiguous run that
// starts at i (in forward order), so dx_i is the keyed sum ending at i when
// idx_i == i and 0 otherwise. No scatter, no atomics.
template <typename T, typename Acc, typename Pos>
struct ExtremeBackward : KeyedSumCombine<Acc, Pos> {
  using State = KeyedSum<Acc, Pos>;
  using Storage = T;
  const T* dy;
  const int64_t* indices;
  T* dx;
  static constexpr int kInputBytes = sizeof(T) + sizeof(int64_t);
  // dy and dx are arrays of T read and written at the element alone, and
  // indices an int64 array read so (kGradWithIndices): an engine may move
  // runs of dy and dx as vectors and bring the indices in its own way, and
  // run load and store on a copy pointed at registers (scan_row_groups.cuh).
  static constexpr bool kGradWithIndices = true;
  template <typename F> BHD void for_each_input(F&& f) { f(dy), f(indices); }
  template <typename F> BHD void for_each_input(F&& f) const { f(dy), f(indices); }
  template <typename F> BHD void for_each_output(F&& f) { f(dx); }
  template <typename F> BHD void for_each_output(F&& f) const { f(dx); }
  BHD State load(int64_t off, int64_t) const {
    return {static_cast<Pos>(indices[off]), to_acc<Acc>(dy[off])};
  }
  // incl ends with this element, so its key is idx_i: no second read.
  BHD void store(int64_t off, int64_t l, State incl) const {
    dx[off] = from_acc<T>(incl.key == l ? incl.sum : Acc(0));
  }
};

#undef BHD
#undef BARACUDA_RUN_LOOP
#undef BARACUDA_DEVICE_UNROLL

}  // namespace scan
}  // namespace baracuda
