// Block-level building blocks of the CUDA scan engine (scan_launch.cuh): warp
// scans of states by shuffles, the combine as a cub scan operator, runs of
// consecutive elements of one line of the axis, and the striped-load /
// blocked-scan / striped-store chunk that the rows and long_rows paths
// share. No torch headers.
#pragma once

#include <cub/block/block_exchange.cuh>
#include <cub/util_ptx.cuh>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/acc_convert.h"

#include "scan/scan_ops.h"
#include "scan/scan_plan.h"

namespace baracuda {
namespace scan {

template <typename Op>
using StateOf = typename Op::State;

// The Aux of an op (scan_ops.h), or nothing.
struct NoAux {};
template <typename Op, typename = void>
struct AuxTrait {
  using type = NoAux;
  static constexpr bool kHas = false;
};
template <typename Op>
struct AuxTrait<Op, std::void_t<typename Op::Aux>> {
  using type = typename Op::Aux;
  static constexpr bool kHas = true;
};
template <typename Op>
using AuxOf = typename AuxTrait<Op>::type;

// Stores an element's inclusive state: with what the store reads besides it
// (loaded earlier by the caller) where the op has an Aux.
template <typename Op>
__device__ void store_state(const Op& op, int64_t off, int64_t l, const typename Op::State& incl,
                            const AuxOf<Op>& aux) {
  if constexpr (AuxTrait<Op>::kHas) {
    op.store_with(off, l, incl, aux);
  } else {
    op.store(off, l, incl);
  }
}

// Whether an op scans a thread's run itself (kRunScan: run_total and
// scan_run, scan_ops.h) rather than by one combine per element.
template <typename Op, typename = void>
struct HasRunScan : std::false_type {};
template <typename Op>
struct HasRunScan<Op, std::enable_if_t<Op::kRunScan>> : std::true_type {};

// Whether an op also reads its inputs at the scan positions next to its own
// (kReadsNeighbors, scan_ops.h; cumprod backward).
template <typename Op, typename = void>
struct ReadsNeighbors : std::false_type {};
template <typename Op>
struct ReadsNeighbors<Op, std::enable_if_t<Op::kReadsNeighbors>> : std::true_type {};

// Runs' totals, and the combine that joins them across threads, warps,
// blocks and tiles: the op's own states and combine, or for an op with a run
// scan the ones it names (Op::TotalCombine, whose states its run_total
// returns and its scan_run starts from). TotalsOf<Op> is an op in the sense
// the engine's block-level parts want: State, identity() and combine().
template <typename Op, typename = void>
struct TotalsTrait {
  using type = Op;
  __device__ static Op of(const Op& op) { return op; }
};
template <typename Op>
struct TotalsTrait<Op, std::enable_if_t<HasRunScan<Op>::value>> {
  using type = typename Op::TotalCombine;
  __device__ static type of(const Op&) { return type{}; }
};
template <typename Op>
using TotalsOf = typename TotalsTrait<Op>::type;
template <typename Op>
using TotalOf = StateOf<TotalsOf<Op>>;
template <typename Op>
__device__ TotalsOf<Op> totals_of(const Op& op) {
  return TotalsTrait<Op>::of(op);
}

// What fold_run learns of a run that scan_thread_run reuses: an op's
// RunMemo where it has a run scan, nothing otherwise.
struct NoMemo {};
template <typename Op, typename = void>
struct RunMemoTrait {
  using type = NoMemo;
};
template <typename Op>
struct RunMemoTrait<Op, std::enable_if_t<HasRunScan<Op>::value>> {
  using type = typename Op::RunMemo;
};
template <typename Op>
using RunMemoOf = typename RunMemoTrait<Op>::type;

// The total of a thread's run of items. An op with a run scan may rewrite
// the items for scan_thread_run (which then needs the same memo).
template <typename Op, int N>
__device__ TotalOf<Op> fold_run(const Op& op, StateOf<Op> (&items)[N], RunMemoOf<Op>& memo) {
  if constexpr (HasRunScan<Op>::value) {
    return op.run_total(items, memo);
  } else {
    StateOf<Op> total = op.identity();
#pragma unroll
    for (int k = 0; k < N; ++k) total = op.combine(total, items[k]);
    return total;
  }
}

// Whether an op is PlainIo (scan_ops.h): one storage array in, one out.
template <typename Op, typename = void>
struct HasPlainIo : std::false_type {};
template <typename Op>
struct HasPlainIo<Op, std::enable_if_t<Op::kPlainIo>> : std::true_type {};

// An inclusive scan of the kWidth lanes of each logical warp by something
// cheaper than joins, where that applies; false, in every lane, where it
// does not (the caller joins). Scaled sums (scan_ops.h): against the
// largest exponent M of the logical warp, where every lane's m is finite and
// within 64 of it, each lane's s exp(m - M) is a plain float, neither
// overflowing nor lost to underflow, and the scan is a running sum -- for a
// whole warp about 40 instructions where five joins cost 130. With
// kEmptyLanes, empty lanes (the identity, m = -inf and s = 0: the lanes past
// the last tile a prefix fold reads) add nothing, and a lane with nothing but
// empty lanes up to it stays the identity, as the joins would leave it,
// rather than (M, 0); without, an empty lane sends the warp to the joins. The
// block scans leave it off: their lanes are rarely empty (a row's tail, a
// stretch of -inf), and the ballot made float32 logcumsumexp forward on
// rows a few percent slower.
template <int kWidth, bool kEmptyLanes = false, typename T>
__device__ bool warp_scan_by_reference(T&) {
  return false;
}
template <int kWidth, bool kEmptyLanes = false>
__device__ bool warp_scan_by_reference(ScaledSum<float>& v) {
  constexpr unsigned kAll = 0xffffffffu;
  float top = v.m;
#pragma unroll
  for (int d = kWidth / 2; d >= 1; d /= 2) top = fmaxf(top, __shfl_xor_sync(kAll, top, d));
  const bool empty = kEmptyLanes && v.m == -INFINITY && v.s == 0.f;
  if (!__all_sync(kAll, empty || (is_finite(v.m) && v.m >= top - kTameSpan<float>))) return false;
  const int slot = threadIdx.x % kWidth;
  float sum = empty ? 0.f : v.s * exp_nonpositive(v.m - top);
#pragma unroll
  for (int d = 1; d < kWidth; d *= 2) {
    const float up = __shfl_up_sync(kAll, sum, d, kWidth);
    if (slot >= d) sum += up;
  }
  if constexpr (kEmptyLanes) {
    const int lane = threadIdx.x % 32;
    // This lane and the ones before it in its logical warp.
    const unsigned upto = ((2u << lane) - 1u) & ~((1u << (lane - slot)) - 1u);
    if ((__ballot_sync(kAll, !empty) & upto) == 0u) return true;
  }
  v = {top, sum};
  return true;
}
// The states warp_scan_by_reference may scan (the others always join).
template <typename T>
constexpr bool kScansByReference = false;
template <>
constexpr bool kScansByReference<ScaledSum<float>> = true;

// Shuffles of a state within logical warps of kWidth lanes (cub::ShuffleUp
// and cub::ShuffleIndex over all lanes), member by member for the states
// with padding. cub moves a value as 4-byte words of its bytes, padding
// included; for ValueIndex<double, int32_t> (12 bytes of members in 16) the
// compiler then rebuilt the members byte by byte: a 32-lane scan of them
// took nearly twice the instructions it takes member by member, and
// float64 cummax forward ran much slower. States without padding move
// whole, as before.
template <typename T, typename F>
__device__ T by_members(const T& v, F&& move) {
  return move(v);
}
// A state of members a and b, padded or not.
template <typename S, typename A, typename B, typename F>
__device__ S by_two_members(const S& v, A S::*a, B S::*b, F&& move) {
  if constexpr (sizeof(A) + sizeof(B) == sizeof(S)) {
    return move(v);
  } else {
    S out;
    out.*a = move(v.*a);
    out.*b = move(v.*b);
    return out;
  }
}
template <typename Acc, typename Pos, typename F>
__device__ ValueIndex<Acc, Pos> by_members(const ValueIndex<Acc, Pos>& v, F&& move) {
  using S = ValueIndex<Acc, Pos>;
  return by_two_members(v, &S::value, &S::index, move);
}
template <typename Acc, typename Pos, typename F>
__device__ KeyedSum<Acc, Pos> by_members(const KeyedSum<Acc, Pos>& v, F&& move) {
  using S = KeyedSum<Acc, Pos>;
  return by_two_members(v, &S::key, &S::sum, move);
}
template <int kWidth, typename T>
__device__ T shuffle_up(const T& v, int delta) {
  return by_members(v, [&](const auto& m) { return cub::ShuffleUp<kWidth>(m, delta, 0, 0xffffffffu); });
}
template <int kWidth, typename T>
__device__ T shuffle_index(const T& v, int lane) {
  return by_members(v, [&](const auto& m) { return cub::ShuffleIndex<kWidth>(m, lane, 0xffffffffu); });
}

// The inclusive scan of one total per lane across logical warps of kWidth
// lanes by joins: log2(kWidth) shuffles up, each joined below the lane's own.
template <int kWidth, typename Totals>
__device__ void warp_inclusive_by_joins(const Totals& totals, StateOf<Totals>& v) {
  const int slot = threadIdx.x % kWidth;
#pragma unroll
  for (int d = 1; d < kWidth; d *= 2) {
    const StateOf<Totals> up = shuffle_up<kWidth>(v, d);
    if (slot >= d) v = totals.combine(up, v);
  }
}

// The inclusive scan of one total per lane across logical warps of kWidth
// lanes: by reference where warp_scan_by_reference applies, else by joins.
template <int kWidth, bool kEmptyLanes = false, typename Totals>
__device__ void warp_inclusive(const Totals& totals, StateOf<Totals>& v) {
  if (!warp_scan_by_reference<kWidth, kEmptyLanes>(v)) warp_inclusive_by_joins<kWidth>(totals, v);
}

// An exclusive scan of one total per thread of a block, after `lead`, with
// the block's total (lead included), in at most ten joins a thread: each
// warp scans its lanes (five), every warp scans lead and the eight warp
// totals as four logical warps of eight lanes (four), and a thread joins
// its warp's prefix to its own (one); the two scans go by
// warp_scan_by_reference where they can. cub's
// BLOCK_SCAN_WARP_SCANS folds every warp total in every thread, fourteen
// joins, which the costly joins (scaled sums, extremes) feel. Totals is an
// op in the engine's sense (State, identity, combine). The association is
// fixed (the ops are associative, not commutative). The caller syncs before
// the shared memory is used again.
template <typename Totals>
struct BlockTotalsScan {
  using T = StateOf<Totals>;
  static constexpr int kWarps = kScanBlock / 32;
  static_assert(kWarps == 8, "the warp totals fill logical warps of eight lanes");
  struct TempStorage {
    T warp_totals[kWarps];
  };
  // Without `lead` (the identity), and one join fewer.
  __device__ static void exclusive(TempStorage& tmp, const Totals& totals, const T& v, T& before,
                                   T& block_total) {
    scan<false>(tmp, totals, v, totals.identity(), before, block_total);
  }
  __device__ static void exclusive(TempStorage& tmp, const Totals& totals, const T& v, T lead,
                                   T& before, T& block_total) {
    scan<true>(tmp, totals, v, lead, before, block_total);
  }

 private:
  template <bool kLead>
  __device__ static void scan(TempStorage& tmp, const Totals& totals, const T& v, T lead,
                              T& before, T& block_total) {
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    T incl = v;
    warp_inclusive<32>(totals, incl);
    if (lane == 31) tmp.warp_totals[warp] = incl;
    T excl = shuffle_up<32>(incl, 1);
    if (lane == 0) excl = totals.identity();
    __syncthreads();
    const int slot = lane % kWarps;
    T w = tmp.warp_totals[slot];
    if (kLead && slot == 0) w = totals.combine(lead, w);
    warp_inclusive<kWarps>(totals, w);
    if (warp == 0) {
      before = kLead ? totals.combine(lead, excl) : excl;
    } else {
      before = totals.combine(shuffle_index<32>(w, warp - 1), excl);
    }
    block_total = shuffle_index<32>(w, kWarps - 1);
  }
};

template <typename Op>
struct CombineFn {
  Op op;
  __device__ StateOf<Op> operator()(const StateOf<Op>& a, const StateOf<Op>& b) const {
    return op.combine(a, b);
  }
};

// Where a line of the axis lives: element l at base + l * stride.
struct Line {
  int64_t base;
  int64_t stride;
  int64_t len;
  bool reverse;
  __device__ int64_t position(int64_t p) const { return reverse ? len - 1 - p : p; }
};

// Calls f(op), or, where none of scan positions [first, last] is the first
// or the last of an axis of `len`, f on a copy of op told so (`interior`,
// scan_ops.h): an op that reads its neighbours then skips its tests of the
// axis ends (measured faster on cumprod backward).
template <typename Op, typename F>
__device__ void with_interior_hint(const Op& op, int64_t first, int64_t last, int64_t len,
                                   F&& f) {
  if constexpr (ReadsNeighbors<Op>::value) {
    if (first > 0 && last < len - 1) {
      Op inner = op;
      inner.interior = true;
      f(inner);
      return;
    }
  }
  f(op);
}

// Walks scan positions first, first + 1, ... of a line: their axis
// positions and memory offsets advance by one addition each (a 64-bit
// multiply per element cost about as much as a cheap scan's own work), and
// how many of them lie before p_end is counted once.
struct LineWalk {
  int64_t l;         // axis position of the current scan position
  int64_t off;       // its memory offset
  int64_t l_step;    // +1 or -1
  int64_t off_step;  // +stride or -stride
  int valid;         // scan positions from `first` before p_end (at most kItems)
  template <int kItems>
  __device__ static LineWalk from(const Line& line, int64_t first, int64_t p_end) {
    LineWalk w;
    w.l = line.position(first);
    w.off = line.base + w.l * line.stride;
    w.l_step = line.reverse ? -1 : 1;
    w.off_step = line.reverse ? -line.stride : line.stride;
    const int64_t left = p_end - first;
    w.valid = left >= kItems ? kItems : left > 0 ? int(left) : 0;
    return w;
  }
  __device__ void advance() {
    l += l_step;
    off += off_step;
  }
  // Calls f(k) at the walk's first `valid` scan positions (k = 0, 1, ...),
  // the walk on position k, advancing after each. With kWholePath, a whole
  // run (valid == kItems, the common case) goes without a test per element
  // (kWholeRunPath below says for which ops).
  template <int kItems, bool kWholePath, typename F>
  __device__ void for_each_valid(F&& f) {
    if (kWholePath && valid == kItems) {
#pragma unroll
      for (int k = 0; k < kItems; ++k, advance()) f(k);
    } else {
#pragma unroll
      for (int k = 0; k < kItems; ++k, advance()) {
        if (k < valid) f(k);
      }
    }
  }
};

// Whether an op's run loops take a path of their own for whole runs
// (LineWalk::for_each_valid). Under register pressure the compiler rebuilt
// the per-element test's 64-bit operands at every element, about 15 integer
// instructions each; the path made logcumsumexp, backward and forward,
// much faster. The other ops ran slightly slower with the larger code, so
// they keep the one loop.
template <typename Op>
constexpr bool kWholeRunPath = HasRunScan<Op>::value;

// A thread's kItems consecutive elements of a line from scan position
// `first`; positions at or past p_end hold the identity. Every load is issued
// before any store of the caller. Returns their total. Given `aux` (an array
// of kItems), an op with an Aux reads those too.
template <int kItems, typename Op>
__device__ StateOf<Op> load_run(const Op& op, const Line& line, int64_t first, int64_t p_end,
                                StateOf<Op> (&items)[kItems], AuxOf<Op>* aux = nullptr) {
  StateOf<Op> total = op.identity();
#pragma unroll
  for (int k = 0; k < kItems; ++k) items[k] = op.identity();
  LineWalk w = LineWalk::from<kItems>(line, first, p_end);
  w.for_each_valid<kItems, kWholeRunPath<Op>>([&](int k) {
    items[k] = op.load(w.off, w.l);
    if constexpr (AuxTrait<Op>::kHas) {
      if (aux != nullptr) aux[k] = op.aux(w.off, w.l);
    }
    total = op.combine(total, items[k]);
  });
  return total;
}

// Stores the run loaded by load_run, `run` being everything before it;
// returns everything up to its end.
template <int kItems, typename Op>
__device__ StateOf<Op> store_run(const Op& op, const Line& line, int64_t first, int64_t p_end,
                                 StateOf<Op> run, const StateOf<Op> (&items)[kItems]) {
  LineWalk w = LineWalk::from<kItems>(line, first, p_end);
  w.for_each_valid<kItems, kWholeRunPath<Op>>([&](int k) {
    run = op.combine(run, items[k]);
    op.store(w.off, w.l, run);
  });
  return run;
}

// Stores a run's inclusive states (as scan_thread_run leaves them), element
// by element; what a store reads besides the state it reads on the spot.
template <int kItems, typename Op>
__device__ void store_inclusive_run(const Op& op, const Line& line, int64_t first, int64_t p_end,
                                    const StateOf<Op> (&incl)[kItems]) {
  LineWalk w = LineWalk::from<kItems>(line, first, p_end);
  w.for_each_valid<kItems, kWholeRunPath<Op>>([&](int k) { op.store(w.off, w.l, incl[k]); });
}

// Direct runs of a PlainIo op: thread t's kItems consecutive scan positions
// are one 16-byte vector, read and written in the blocked order the scan
// wants, with no exchange through shared memory; a warp's vectors are 512
// contiguous bytes. (Runs of two vectors per thread measured 3x slower than
// the exchange: each instruction then writes half of every sector it
// touches.) Runs start kItems apart from the row's first element (forward)
// or one past its last (reverse, where the run is reversed in registers), so
// one alignment test per row covers them all.
template <int kItems, typename Op>
constexpr bool kDirectRuns = kItems * sizeof(typename Op::Storage) == 16;

// Whether every array an op names (for_each_input, scan_ops.h; with
// kOutputs its for_each_output too) is 16-byte aligned at element `at`.
template <bool kOutputs, typename Op>
__host__ __device__ bool arrays_aligned16(const Op& op, int64_t at) {
  bool aligned = true;
  const auto check = [&](const auto* p) {
    aligned = aligned && reinterpret_cast<uintptr_t>(p + at) % 16 == 0;
  };
  op.for_each_input(check);
  if constexpr (kOutputs) op.for_each_output(check);
  return aligned;
}


// A run that crosses the end of the line, element by element; positions at
// or past the end hold the identity. Given `aux` (an array of kItems), an op
// with an Aux reads those too.
template <int kItems, typename Op>
__device__ void load_ragged_run(const Op& op, const Line& line, int64_t first,
                                StateOf<Op> (&items)[kItems], AuxOf<Op>* aux = nullptr) {
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int64_t p = first + k;
    items[k] = op.identity();
    if (p < line.len) {
      const int64_t l = line.position(p);
      items[k] = op.load(line.base + l, l);
      if constexpr (AuxTrait<Op>::kHas) {
        if (aux != nullptr) aux[k] = op.aux(line.base + l, l);
      }
    }
  }
}

// Stores a run of 16 bytes of elements as one vector. Written as a plain
// uint4 store, the compiler split it into four of four bytes each
// (st.global.v2.u16 or .u32), every instruction writing a quarter of each
// sector it touched; __stwb is the same store (write-back) as one vector
// instruction.
template <typename T, int kItems>
__device__ void store_vector(T* at, const T (&run)[kItems]) {
  static_assert(kItems * sizeof(T) == 16, "a run is one 16-byte vector");
  uint4 u;
  memcpy(&u, run, sizeof(u));
  __stwb(reinterpret_cast<uint4*>(at), u);
}

// Loads the run of scan positions [first, first + kItems) into items, in
// scan order; positions at or past the end hold the identity.
template <int kItems, typename Op>
__device__ void load_direct(const Op& op, const Line& line, int64_t first,
                            StateOf<Op> (&items)[kItems]) {
  using T = typename Op::Storage;
  if (first + kItems <= line.len) {
    const int64_t lowest = line.reverse ? line.len - first - kItems : first;
    const uint4 u = *reinterpret_cast<const uint4*>(op.src + line.base + lowest);
    T raw[kItems];
    memcpy(raw, &u, sizeof(u));
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      items[k] = to_acc<StateOf<Op>>(raw[line.reverse ? kItems - 1 - k : k]);
    }
    return;
  }
  load_ragged_run(op, line, first, items);
}

// Stores the inclusive states of the run load_direct read.
template <int kItems, typename Op>
__device__ void store_direct(const Op& op, const Line& line, int64_t first,
                             const StateOf<Op> (&incl)[kItems]) {
  using T = typename Op::Storage;
  if (first + kItems <= line.len) {
    const int64_t lowest = line.reverse ? line.len - first - kItems : first;
    T raw[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      raw[line.reverse ? kItems - 1 - k : k] = from_acc<T>(incl[k]);
    }
    store_vector(op.dst + line.base + lowest, raw);
    return;
  }
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int64_t p = first + k;
    if (p < line.len) {
      const int64_t l = line.position(p);
      op.store(line.base + l, l, incl[k]);
    }
  }
}

// Whole runs: a thread's kItems consecutive elements of every input array
// read as one 16-byte vector per array, and the op's own load (and aux) run
// on a copy of the op pointed at them in registers (element k at offset k,
// its axis position as it is), so each state is built as the op builds it.
// This needs every input to be an array of the op's Storage, and one of two
// kinds of op:
// - ReadsOneArray: one input read at the element alone and no Aux (cummax /
//   cummin forward), whose stores, int64 indices among them, go through the
//   exchange;
// - kWholeRunIo (scan_ops.h): the output is an array of Storage too, written
//   a vector per run the same way (logcumsumexp backward). One that reads
//   its neighbours (cumprod backward) also gets each input at the scan
//   positions just before and just after the run, read one element each
//   (next to the vectors other threads read, so from cache), and sees the
//   registers with a scan step of one.
template <typename Op, typename = void>
struct ReadsOneArray : std::false_type {};
template <typename Op>
struct ReadsOneArray<Op, std::enable_if_t<Op::kInputBytes == sizeof(typename Op::Storage)>>
    : std::bool_constant<!AuxTrait<Op>::kHas && !ReadsNeighbors<Op>::value> {};

template <typename Op, typename = void>
struct HasWholeRunIo : std::false_type {};
template <typename Op>
struct HasWholeRunIo<Op, std::enable_if_t<Op::kWholeRunIo>> : std::true_type {};

template <typename Op>
constexpr int kInputArrays = Op::kInputBytes / int{sizeof(typename Op::Storage)};

// Each input at the scan positions just before and just after a run, for
// ops that read their neighbours (kRunHalo of them each side).
template <typename T, int kArrays>
struct RunNeighbors {
  T before[kArrays];
  T after[kArrays];
};
template <typename T>
struct RunNeighbors<T, 0> {};

template <typename Op>
constexpr int kRunHalo = ReadsNeighbors<Op>::value ? 1 : 0;

// A run's inputs as fetched, a vector per input array (and its neighbours).
template <typename Op>
struct WholeRun {
  uint4 input[kInputArrays<Op>];
  RunNeighbors<typename Op::Storage, kRunHalo<Op> ? kInputArrays<Op> : 0> halo;
};

// Whether a line's arrays lie so that runs of kItems move as 16-byte
// vectors (direct runs, and the whole runs below): unit stride, every input
// (and for kWholeRunIo, PlainIo among them, the output) aligned at the
// direction's anchor.
template <int kItems, typename Op>
__device__ bool whole_runs_fit(const Op& op, const Line& line) {
  static_assert(kDirectRuns<kItems, Op>, "a direct run is one 16-byte vector");
  const int64_t anchor = line.reverse ? line.base + line.len : line.base;
  return line.stride == 1 && arrays_aligned16<HasWholeRunIo<Op>::value>(op, anchor);
}

// Where run [first, first + kItems) starts in memory (its lowest offset).
template <int kItems>
__device__ int64_t whole_run_at(const Line& line, int64_t first) {
  return line.base + (line.reverse ? line.len - first - kItems : first);
}

// Reverses a run in registers (memory order <-> scan order).
template <int kItems, typename T>
__device__ void reverse_run(T (&v)[kItems]) {
#pragma unroll
  for (int k = 0; k < kItems / 2; ++k) {
    const T t = v[k];
    v[k] = v[kItems - 1 - k];
    v[kItems - 1 - k] = t;
  }
}

// Loads in two steps, so that a caller may fetch the next run before it
// scans this one: fetch_whole_run reads the vectors (nothing for a run that
// crosses the end), unpack_whole_run builds the states (and auxes), loading
// a run that crosses the end element by element.
template <int kItems, typename Op>
__device__ WholeRun<Op> fetch_whole_run(const Op& op, const Line& line, int64_t first) {
  using T = typename Op::Storage;
  WholeRun<Op> run{};
  if (first + kItems <= line.len) {
    const int64_t at = whole_run_at<kItems>(line, first);
    int a = 0;
    op.for_each_input(
        [&](const T* p) { run.input[a++] = *reinterpret_cast<const uint4*>(p + at); });
    if constexpr (kRunHalo<Op> > 0) {
      // Past an end of the axis the op reads nothing (it tests for the ends).
      const bool has_before = first > 0;
      const bool has_after = first + kItems < line.len;
      const int64_t before = line.base + line.position(has_before ? first - 1 : first);
      const int64_t after = line.base + line.position(has_after ? first + kItems : first);
      a = 0;
      op.for_each_input([&](const T* p) {
        run.halo.before[a] = has_before ? p[before] : T{};
        run.halo.after[a] = has_after ? p[after] : T{};
        ++a;
      });
    }
  }
  return run;
}

template <int kItems, typename Op>
__device__ void unpack_whole_run(const Op& op, const Line& line, int64_t first,
                                 const WholeRun<Op>& run, StateOf<Op> (&items)[kItems],
                                 AuxOf<Op> (&aux)[kItems]) {
  using T = typename Op::Storage;
  constexpr int H = kRunHalo<Op>;
  if (first + kItems <= line.len) {
    // Scan position first + k of input a at in_order[a][H + k].
    T in_order[kInputArrays<Op>][kItems + 2 * H];
#pragma unroll
    for (int a = 0; a < kInputArrays<Op>; ++a) {
      T run_in_memory_order[kItems];
      memcpy(run_in_memory_order, &run.input[a], sizeof(uint4));
      if (line.reverse) reverse_run(run_in_memory_order);
#pragma unroll
      for (int k = 0; k < kItems; ++k) in_order[a][H + k] = run_in_memory_order[k];
      if constexpr (H > 0) {
        in_order[a][0] = run.halo.before[a];
        in_order[a][H + kItems] = run.halo.after[a];
      }
    }
    with_interior_hint(op, first, first + kItems - 1, line.len, [&](const Op& o) {
      Op view = o;
      int a = 0;
      view.for_each_input([&](const T*& p) { p = in_order[a++] + H; });
      if constexpr (H > 0) view.scan_step = 1;
      LineWalk w = LineWalk::from<kItems>(line, first, line.len);
#pragma unroll
      for (int k = 0; k < kItems; ++k, w.advance()) {
        items[k] = view.load(k, w.l);
        if constexpr (AuxTrait<Op>::kHas) aux[k] = view.aux(k, w.l);
      }
    });
    return;
  }
  load_ragged_run(op, line, first, items, aux);
}

// A kWholeRunIo op's outputs for a whole run of kItems, gathered in `out`
// (memory order) by the op's own store on a copy pointed there; `w` walks
// the run from its first scan position (and ends past it).
template <int kItems, typename Op>
__device__ void whole_run_outputs(const Op& op, LineWalk& w, bool reverse,
                                  const StateOf<Op> (&incl)[kItems],
                                  const AuxOf<Op> (&aux)[kItems],
                                  typename Op::Storage (&out)[kItems]) {
  using T = typename Op::Storage;
  Op view = op;
  view.for_each_output([&](T*& p) { p = out; });
#pragma unroll
  for (int k = 0; k < kItems; ++k, w.advance()) store_state(view, k, w.l, incl[k], aux[k]);
  if (reverse) reverse_run(out);
}

// A kWholeRunIo op's single output array.
template <typename Op>
__device__ typename Op::Storage* whole_run_output(const Op& op) {
  typename Op::Storage* dst = nullptr;
  op.for_each_output([&](typename Op::Storage* p) { dst = p; });
  return dst;
}

// Stores a kWholeRunIo op's run: its outputs gathered in registers
// (whole_run_outputs), then written as one vector; a run that crosses the
// end is stored element by element.
template <int kItems, typename Op>
__device__ void store_whole_run(const Op& op, const Line& line, int64_t first,
                                const StateOf<Op> (&incl)[kItems],
                                const AuxOf<Op> (&aux)[kItems]) {
  using T = typename Op::Storage;
  LineWalk w = LineWalk::from<kItems>(line, first, line.len);
  if (first + kItems <= line.len) {
    T out[kItems];
    whole_run_outputs(op, w, line.reverse, incl, aux, out);
    store_vector(whole_run_output(op) + whole_run_at<kItems>(line, first), out);
    return;
  }
  w.for_each_valid<kItems, false>([&](int k) { store_state(op, w.off, w.l, incl[k], aux[k]); });
}

// Shared memory of a rows block: the block scan and the striped <-> blocked
// exchanges take turns (a __syncthreads separates every use).
template <typename Op>
using RowExchangeOf = cub::BlockExchange<StateOf<Op>, kScanBlock, kScanItems>;

template <typename Op>
union RowShared {
  typename BlockTotalsScan<TotalsOf<Op>>::TempStorage scan;
  typename RowExchangeOf<Op>::TempStorage exchange;
};

// Scans a thread's run of blocked states (as fold_run left them) from `run`,
// everything before it: leaves in `blocked` everything up to each element.
template <typename Op, int N>
__device__ void scan_thread_run(const Op& op, TotalOf<Op> run, StateOf<Op> (&blocked)[N],
                                const RunMemoOf<Op>& memo) {
  if constexpr (HasRunScan<Op>::value) {
    op.scan_run(run, blocked, memo);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) blocked[k] = run = op.combine(run, blocked[k]);
  }
}

// The block-wide part of a chunk scan: thread t holds kScanItems
// consecutive elements (blocked). A block scan of the per-thread totals
// after `carry`, the total of everything before the chunk, gives each thread
// its prefix; carry becomes the total up to the chunk's end. Leaves in
// `blocked` what scan_thread_run leaves.
template <typename Op>
__device__ void scan_blocked(const Op& op, StateOf<Op> (&blocked)[kScanItems],
                             RowShared<Op>& shared, TotalOf<Op>& carry) {
  using Total = TotalOf<Op>;
  // Positions past the end hold the identity, so they may be folded in.
  RunMemoOf<Op> memo;
  const Total total = fold_run(op, blocked, memo);
  Total before;
  BlockTotalsScan<TotalsOf<Op>>::exclusive(shared.scan, totals_of(op), total, carry, before,
                                           carry);
  __syncthreads();
  scan_thread_run(op, before, blocked, memo);
}

// Whether scan_chunk may move an op's runs directly (kDirectRuns), both ways.
template <typename Op>
constexpr bool kMayGoDirect = HasPlainIo<Op>::value && kDirectRuns<kScanItems, Op>;

// Whether scan_chunk may load an op's runs whole, storing them through the
// exchange (ReadsOneArray) or whole too (kMayStoreWhole). For bfloat16
// cummax along dim -1 of [4096, 8192] this drops the load exchange of 8-byte
// states and seven of every eight loads.
template <typename Op>
constexpr bool kMayLoadDirect =
    !kMayGoDirect<Op> && (ReadsOneArray<Op>::value || HasWholeRunIo<Op>::value) &&
    kDirectRuns<kScanItems, Op>;
template <typename Op>
constexpr bool kMayStoreWhole = kMayLoadDirect<Op> && HasWholeRunIo<Op>::value;

// Whether the chunks of a line are loaded directly (and, for kMayGoDirect
// ops, stored so): the same for every thread.
template <typename Op>
__device__ bool chunks_go_direct(const Op& op, const Line& line) {
  if constexpr (kMayGoDirect<Op> || kMayLoadDirect<Op>) {
    return whole_runs_fit<kScanItems>(op, line);
  } else {
    return false;
  }
}

// A thread's part of one chunk of kRowChunk positions: its kScanItems
// consecutive states (blocked), and on the striped layout what it loaded,
// in memory order, with what the stores read besides the states.
template <typename Op>
struct ChunkRegs {
  StateOf<Op> blocked[kScanItems];
  StateOf<Op> striped[kScanItems];
  AuxOf<Op> aux[kScanItems];
  RunMemoOf<Op> memo;  // of the blocked run
};

// Memory is read and written striped (element k * kScanBlock + t by thread
// t: every warp access is one contiguous run), the scan runs blocked, the two
// arrangements being exchanged through shared memory -- except for PlainIo
// ops on aligned rows whose runs are one 16-byte vector (kDirectRuns): those
// move directly (kMayGoDirect), and the ops with whole runs (kMayLoadDirect)
// load directly and store striped, or directly too (kMayStoreWhole). A
// chunk goes through load_chunk (issues its loads), arrange_chunk (blocked
// states in r.blocked), a scan of r.blocked, and store_chunk; the steps of
// several chunks may interleave, all loads first.
template <typename Op>
__device__ void load_chunk(const Op& op, const Line& line, int64_t chunk, bool direct,
                           ChunkRegs<Op>& r) {
  if constexpr (kMayGoDirect<Op>) {
    if (direct) {
      load_direct(op, line, chunk + int64_t{threadIdx.x} * kScanItems, r.blocked);
      return;
    }
  }
  if constexpr (kMayLoadDirect<Op>) {
    if (direct) {
      const int64_t first = chunk + int64_t{threadIdx.x} * kScanItems;
      unpack_whole_run(op, line, first, fetch_whole_run<kScanItems>(op, line, first), r.blocked,
                       r.aux);
      return;
    }
  }
  with_interior_hint(op, chunk, chunk + kRowChunk - 1, line.len, [&](const Op& o) {
#pragma unroll
    for (int k = 0; k < kScanItems; ++k) {
      const int64_t p = chunk + int64_t(k) * kScanBlock + threadIdx.x;
      r.striped[k] = o.identity();
      if (p < line.len) {
        const int64_t l = line.position(p);
        r.striped[k] = o.load(line.base + l, l);
        if constexpr (AuxTrait<Op>::kHas) r.aux[k] = o.aux(line.base + l, l);
      }
    }
  });
}

// Ends with a barrier on the striped layout (shared memory is free again).
template <typename Op>
__device__ void arrange_chunk(bool direct, ChunkRegs<Op>& r, RowShared<Op>& shared) {
  if (direct) return;
  RowExchangeOf<Op>(shared.exchange).StripedToBlocked(r.striped, r.blocked);
  __syncthreads();
}

// Stores the scanned r.blocked. What the stores read besides the states came
// in with the loads: the stores are striped as the loads were. Ends with a
// barrier on the striped layout.
template <typename Op>
__device__ void store_chunk(const Op& op, const Line& line, int64_t chunk, bool direct,
                            ChunkRegs<Op>& r, RowShared<Op>& shared) {
  if constexpr (kMayGoDirect<Op>) {
    if (direct) {
      store_direct(op, line, chunk + int64_t{threadIdx.x} * kScanItems, r.blocked);
      return;
    }
  }
  if constexpr (kMayStoreWhole<Op>) {
    if (direct) {
      store_whole_run(op, line, chunk + int64_t{threadIdx.x} * kScanItems, r.blocked, r.aux);
      return;
    }
  }
  RowExchangeOf<Op>(shared.exchange).BlockedToStriped(r.blocked, r.blocked);
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kScanItems; ++k) {
    const int64_t p = chunk + int64_t(k) * kScanBlock + threadIdx.x;
    if (p < line.len) {
      const int64_t l = line.position(p);
      store_state(op, line.base + l, l, r.blocked[k], r.aux[k]);
    }
  }
}

// One block scans kRowChunk elements of a row (inner == 1) from scan
// position `chunk` (scan_blocked; carry as there).
template <typename Op>
__device__ void scan_chunk(const Op& op, const Line& line, int64_t chunk, RowShared<Op>& shared,
                           TotalOf<Op>& carry) {
  const bool direct = chunks_go_direct(op, line);
  ChunkRegs<Op> r;
  load_chunk(op, line, chunk, direct, r);
  arrange_chunk(direct, r, shared);
  scan_blocked(op, r.blocked, shared, carry);
  store_chunk(op, line, chunk, direct, r, shared);
}

}  // namespace scan
}  // namespace baracuda
