// Swizzled staged runs: the run layout of the staged long rows
// (scan_staged_rows.cuh) for logcumsumexp forward, its stages laid out as
// the bulk tensor copy engine writes them with the 128-byte swizzle. Rows
// whose bytes are a multiple of 16, with at least a tile for every SM, take
// them (launch_swizzled_runs, scan_launch.cuh); the others keep
// StagedPlainTiles. Included by scan_launch.cuh. No torch headers.
//
// The run layout gives thread t a run of consecutive vectors of its tile.
// Read from a stage laid out in memory order, the eight threads of a
// quarter warp meet in two of the eight 16-byte bank groups (runs 64 bytes
// apart) or in one (128 bytes apart), and StagedRun turns four-vector runs
// in registers to avoid it. Here the copy engine lays each 128-byte line of
// the tile with its 16-byte chunks turned by the line's index mod 8, so a
// thread reads its j-th vector at one xor of j from its own address, and
// the eight threads of a quarter warp, on eight consecutive lines (or four
// lines of two runs), meet in eight groups. Whole tiles leave the stage by
// one tensor store, which undoes the swizzle.
//
// With the selects gone a run can be a whole line: eight vectors, 32
// float32 or 64 two-byte elements a thread, in tiles of 32 KiB (two blocks
// an SM). Whatever a tile costs a thread besides its elements -- the join
// of the block's runs, the look-back, the barriers -- is then spread over
// twice the elements. H100, [1, 16M] logcumsumexp forward, launcher timer,
// three runs, us (both on kGroups, against StagedPlainTiles): float32
// 66.5-68.1 -> 61.1-63.1 with runs of a line, 63.9-64.3 with runs of half
// a line (16 KiB tiles, as many blocks as StagedPlainTiles); bfloat16
// 47.0-47.6 -> 41.2-42.4 and 44.1-44.5.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "common/fast_exp2.h"
#include "common/hopper.cuh"
#include "scan/scan_block.cuh"
#include "scan/scan_plan.h"
#include "scan/scan_publish.cuh"
#include "scan/scan_staged_rows.cuh"

namespace baracuda {
namespace scan {

// A thread's run in 16-byte vectors: a whole 128-byte line.
constexpr int kSwizzledRunVectors = 8;
constexpr int kSwizzledTileBytes = kScanBlock * kSwizzledRunVectors * 16;
constexpr int kSwizzleLineBytes = 128;
// The swizzle's pattern repeats every eight lines; a stage starts on one.
constexpr int kSwizzleStageAlign = 1024;

// Where byte `logical` of a tile lies in its stage: the 16-byte chunk
// within each 128-byte line turned by the line's index mod 8.
__device__ inline uint32_t swizzled_offset(uint32_t logical) {
  return logical ^ (((logical >> 7) & 7u) << 4);
}

// Where thread t's run of kVectors consecutive 16-byte vectors (half a
// line or a whole one) lies in a swizzled stage of `tile_vectors` vectors
// (kScanBlock runs, or fewer in a row's short tile, whose threads past its
// end have no run), runs following each other in scan order: its j-th
// vector in scan order
// at base + (key ^ 16 j). The run's vectors stay on one line: its first
// in scan order lies at chunk c of the line, and its j-th at c + j
// (forward, c a multiple of kVectors) or c - j (reversed, c + 1 a multiple
// of kVectors), which are both c ^ j; the swizzle xors the line's index
// into every chunk alike.
template <int kVectors, bool kReverse>
struct SwizzledRunAddress {
  static_assert(kVectors == 4 || kVectors == 8, "a run of half a line or a whole one");
  static constexpr uint32_t kTileVectors = kScanBlock * kVectors;
  uint32_t base, key;

  static __device__ SwizzledRunAddress of_thread(uint32_t tile_vectors = kTileVectors) {
    const uint32_t q = threadIdx.x * kVectors;  // the run's first vector in scan order
    const uint32_t m = kReverse ? tile_vectors - 1 - q : q;  // ... in memory order
    const uint32_t line = m / 8, chunk = m % 8;
    return {line * kSwizzleLineBytes, (chunk ^ (line & 7u)) << 4};
  }
  // The j-th vector in scan order from `stage`.
  template <typename Byte>
  __device__ Byte* vector(Byte* stage, int j) const {
    return stage + base + (key ^ (j << 4));
  }
};

// A thread's run in a swizzled stage, kSwizzledRunVectors vectors in scan
// order.
template <typename Op, bool kReverse>
struct SwizzledRun {
  using T = typename Op::Storage;
  using Acc = StateOf<Op>;
  using Vector = StagedVector<Op, kReverse, true>;
  static constexpr int kVectors = kSwizzledRunVectors;
  static constexpr int kLen = kVectors * Vector::kElems;
  using Part = Acc[Vector::kElems];
  static __device__ Part& part(Acc (&v)[kLen], int j) {
    return *reinterpret_cast<Part*>(v + j * Vector::kElems);
  }
  static __device__ const Part& part(const Acc (&v)[kLen], int j) {
    return *reinterpret_cast<const Part*>(v + j * Vector::kElems);
  }

  using Address = SwizzledRunAddress<kVectors, kReverse>;

  // The run's j-th vector, and back.
  static __device__ void load_vector(const unsigned char* stage, const Address& a, int j,
                                     Part& part) {
    // One 16-byte read, then the unpacking (handed the stage itself, it
    // reads word by word).
    const uint4 u = *reinterpret_cast<const uint4*>(a.vector(stage, j));
    Vector::unpack(u, part);
  }
  static __device__ void put_vector(unsigned char* stage, const Address& a, int j,
                                    const Part& part) {
    *reinterpret_cast<uint4*>(a.vector(stage, j)) = Vector::pack(part);
  }
  static __device__ void load(const unsigned char* stage, const Address& a, Acc (&v)[kLen]) {
#pragma unroll
    for (int j = 0; j < kVectors; ++j) load_vector(stage, a, j, part(v, j));
  }
  static __device__ void put(unsigned char* stage, const Address& a, const Acc (&v)[kLen]) {
#pragma unroll
    for (int j = 0; j < kVectors; ++j) put_vector(stage, a, j, part(v, j));
  }
};

// Two-byte runs folded and scanned against their first element x_0 rather
// than their largest (LogcumsumexpForward's run_total and scan_run,
// scan_ops.h, which need a pass for it): the fold sums the weights
// exp(x_k - x_0), and the scan takes its weights against
// top = max(m, x_0), the larger of the prefix's exponent and x_0, so that
//   y_k = top + log(s exp(m - top) + sum_{j <= k} exp(x_j - top))
// costs the scan an fma, an exp, an add, a log and an fma an element and
// the fold an fma, an exp and an add, where the op's run scan spends a max
// an element more on each and an fma more on the scan. A power is
// the bare instruction's of x log2(e) - top log2(e), that product rounded
// once a run, as exp_below_for takes it for two-byte elements. The first
// weight is 1 up to that rounding, so every running sum is at least about
// 1, and a weight flushed to 0 costs it under 2^-126 relative. A run is
// tame when its sum of weights is below 2^96 (about e^66.5): a first
// element NaN or infinite, a NaN or +inf anywhere, or an element more than
// about 66 above the first fails that, and such runs take the op's own
// fold and scan (a run that starts with -inf is first tried against its
// first element that is not: StagedSwizzledRunTiles::lead_of). Tame
// totals (x_0, S < 2^96), joined over a row of fewer than 2^31 elements,
// stay below 2^121. Neither keeps the run in registers:
// the fold adds it up and the scan rewrites it a vector at a time in its
// stage, and only a run that is not tame is loaded whole. H100, bfloat16
// [1, 16M], launcher timer, three runs in each of three machine starts:
// 39.8-40.7 us with the op's run scan, 36.2-37.6 so (benchmarks/RESULTS.md).
//
// The fold's running sum:
struct FirstReferencedSum {
  static constexpr float kLog2e = 1.44269502f;
  static constexpr float kTameSum = 0x1p96f;
  float first, ref, s;
  __device__ explicit FirstReferencedSum(float x0) : first(x0), ref(x0 * kLog2e), s(0.f) {}
  template <int N>
  __device__ void add(const float (&x)[N]) {
#pragma unroll
    for (int k = 0; k < N; ++k) s += exp2_flush(fmaf(x[k], kLog2e, -ref));
  }
  __device__ bool tame() const { return s < kTameSum; }  // false for NaN
  __device__ ScaledSum<float> total() const { return {first, s}; }
};
// The scan of a tame run from `prefix`, a finite exponent or the empty
// prefix (-inf, 0), which adds 0. It spends two special-function
// instructions an element (an exp and a log) where the fold spends one,
// and the last kWeightsByFma of every eight weights go to the FMA pipe
// instead (exp2_by_fma, whose 2^-126 for an exponent below -126 adds
// nothing to a sum of at least about 1). H100, bfloat16 [1, 16M], launcher
// timer, three runs in one machine start, both with kEarlyReadsAfterData:
// 36.0, 35.0, 35.6 us with every weight on the special-function unit, 34.4,
// 35.1, 34.6 with two of eight on the FMA pipe, and 34.3-35.5 with two of
// eight in the fold as well; in another start four of eight took
// 34.5-35.3 against two's 35.0-35.1 (benchmarks/RESULTS.md).
struct FirstReferencedScan {
  static constexpr float kLog2e = FirstReferencedSum::kLog2e;
  static constexpr int kWeightsByFma = 2;
  float top, ref, s;
  __device__ FirstReferencedScan(const ScaledSum<float>& prefix, float x0)
      : top(prefix.m > x0 ? prefix.m : x0), ref(top * kLog2e),
        s(prefix.s * exp2_flush(fmaf(prefix.m, kLog2e, -ref))) {}
  // x[k] becomes the join of everything up to it.
  template <int N>
  __device__ void scan(float (&x)[N]) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float power = fmaf(x[k], kLog2e, -ref);
      s += k % 8 >= 8 - kWeightsByFma ? exp2_by_fma(power) : exp2_flush(power);
      x[k] = top + log_of(s);
    }
  }
};

// How a thread's run of a swizzled tile is folded and scanned (two-byte
// runs): against its first element where it is tame; as a run of -inf
// alone (a stretch a mask set to -inf); against its lead, its first
// element that is not -inf, where it starts with -inf and is tame from
// there (a masked stretch ends inside it); else (and every float32 run)
// by the op's fold and scan.
enum class SwizzledRunPath : unsigned char {
  kJoins,
  kFirstReferenced,
  kAllNegInf,
  kLeadReferenced
};

// What a swizzled tile's fold leaves its scan: the thread's prefix within
// the tile, and its run's path.
template <typename Op>
struct SwizzledRunFold {
  TotalOf<Op> before;
  SwizzledRunPath path;
};

// The arrays of a swizzled launch, x and y, each as
// [rows][len * sizeof(T) / 128][128] bytes (encode_swizzled_rows,
// scan_launch.cuh).
struct SwizzledRowMaps {
  CUtensorMap src, dst;
};

// The tiles: StagedPlainTiles' run layout (the same fold, look-back and
// scan) on swizzled stages of kSwizzledTileBytes. The arrays are seen by
// the tensor maps as [rows][lines][128] bytes, a tile as a box of its
// lines; the rows are whole lines (launch_swizzled_runs, scan_launch.cuh:
// other rows take StagedPlainTiles, within 8 % of a part-line variant
// these tiles once had, on every row of the scan benchmarks). A row's
// short tile reads lines beyond its elements (past the row, read as
// zeros), which no thread reads: a thread whose line is outside the tile
// has no run (it adds the identity). The tiles are laid from the row's
// start in memory, as the other staged tiles are (place_staged_tile), so
// the short one is the row's last in memory.
//
// Past-row lines were once set to the identity, -inf, for every thread to
// scan; the runs of -inf took the op's joins, and a row with such a tile
// took twice as long or more (H100, bfloat16, launcher timer:
// [1, 16776704], eight lines short of 16M, 79.7 us so and 34.1 now;
// benchmarks/RESULTS.md).
template <typename Op, bool kReverse>
struct StagedSwizzledRunTiles {
  using T = typename Op::Storage;
  using Run = SwizzledRun<Op, kReverse>;
  using Totals = TotalsOf<Op>;
  using Total = TotalOf<Op>;
  using Fold = SwizzledRunFold<Op>;
  static_assert(kStagedRuns<Op>, "the run layout's ops");
  // Two-byte runs go against their first element where they are tame
  // (FirstReferencedSum, FirstReferencedScan).
  static constexpr bool kFirstReferenced =
      sizeof(T) == 2 && std::is_same<StateOf<Op>, float>::value;
  static constexpr int64_t kTileLen = kSwizzledTileBytes / int64_t{sizeof(T)};
  static constexpr int kStageBytes = kSwizzledTileBytes;
  static constexpr int kStageAlign = kSwizzleStageAlign;
  static constexpr int kLines = kSwizzledTileBytes / kSwizzleLineBytes;
  static constexpr int64_t kLineElems = kSwizzleLineBytes / int64_t{sizeof(T)};
  // Three stages of 32 KiB: two blocks fit an SM's shared memory, and their
  // runs may take 128 registers a thread (113-128, none spilled).
  static constexpr int kBlocksPerSm = 2;
  static constexpr int kStages = kStagedStages;
  static constexpr PrefixReads kPrefixReads = PrefixReads::kEarlyShared;
  // kStride: with half as many tiles as StagedPlainTiles' runs, a block
  // reads about one total a thread. H100, [1, 16M], launcher timer, three
  // runs: float32 60.9-62.3 us on kGroups, 57.9-58.2 on kStride; bfloat16
  // 41.4-42.1 and 39.7-40.1.
  static constexpr LookBack kLookBack = LookBack::kStride;
  static constexpr bool kPrefetches = false;
  static constexpr bool kBulkStores = true;
  // Two-byte runs ask for a scanned tile's stage again after the next
  // tile's fold, as StagedSwizzledGradTiles do: thread 0 then waits for its
  // tensor store to have read the stage while the block waits for its
  // prefix anyway, not before the fold, which the block's barrier held
  // back for it. H100, bfloat16 [1, 16M], launcher timer, three runs in
  // each of two machine starts: 36.6-36.9 and 36.4-37.0 us against 37.0-37.6
  // and 37.2 (benchmarks/RESULTS.md). Float32 runs ask at once (deferred,
  // 59.4 against 58.7).
  static constexpr bool kDeferredRequests = kFirstReferenced;
  // A round's early prefix reads go out once the next tile's data is in.
  // Their round trip to L2 took a median 2.4-2.6 us in the later rounds
  // wherever they went out, so they come back about as late after the fold
  // either way; but in the first round, sent at the round's start, they
  // went out before some of the earlier blocks' first totals (a median 40
  // threads of a block read again, 2.1 us), and the wait after the fold
  // was 2.7 us (median) against 1.8. H100, bfloat16 [1, 16M], launcher
  // timer, three runs in each of two machine starts: 35.6-36.4 -> 34.9-35.3
  // us and 36.1-36.4 -> 35.0-36.0; float32 58.8-59.1 -> 57.5-57.7.
  static constexpr bool kEarlyReadsAfterData = true;
  // logcumsumexp's prefix joins the between tiles' totals as one sum
  // against the block's previous prefix's exponent (in the first round,
  // the first tile's total's). H100, bfloat16 [1, 16M], launcher timer,
  // three runs in one machine start: 34.3-35.1 us by the joins, 33.7-34.0
  // by this sum; float32 57.9 -> 56.8 (benchmarks/RESULTS.md). Cumsum's
  // totals have no such join.
  static constexpr bool kJoinOnOwnPrefix = true;
  using Maps = SwizzledRowMaps;
  Op op;
  int64_t len, tiles;

  __device__ Totals totals() const { return totals_of(op); }
  // Tiles from the row's start in memory.
  __device__ StagedPlace place(int64_t g) const {
    return place_staged_tile<kTileLen, kReverse>(g, len, tiles);
  }
  // The tile's first line in its map, the box's second coordinate.
  __device__ int first_line(const StagedPlace& p) const {
    return static_cast<int>((p.first - p.row * len) / kLineElems);
  }
  // Thread 0: the whole box, lines past the row included (they count as
  // bytes that land, and read as zero).
  __device__ void request(const StagedPlace& p, unsigned char* stage, uint64_t* full,
                          const Maps& maps) const {
    mbarrier_arrive_expect_tx(full, kStageBytes);
    tma_load_3d<L2Lines::kEvictFirst>(stage, &maps.src, 0, first_line(p),
                                      static_cast<int>(p.row), full);
  }
  __device__ Total fold(const StagedPlace& p, unsigned char* stage, Fold& f) const {
    __shared__ typename BlockTotalsScan<Totals>::TempStorage scratch;
    return join_staged_runs(scratch, totals(), fold_thread_run(p, stage, f.path), f.before);
  }
  __device__ void scan(const StagedPlace& p, unsigned char* stage, const Fold& f,
                       const Total& prefix, const Maps& maps) const {
    if (has_run(p)) scan_thread_run_in_stage(p, stage, f, totals().combine(prefix, f.before));
    fence_proxy_async_shared();  // the threads' writes, before the copy engine reads them
    __syncthreads();
    if (p.valid == kTileLen) {
      if (threadIdx.x == 0) {
        tma_store_3d(&maps.dst, 0, first_line(p), static_cast<int>(p.row), stage);
      }
      return;
    }
    store_short(p, stage);
  }

 private:
  // The tile's lines inside its row.
  __device__ static uint32_t lines_of(const StagedPlace& p) {
    return static_cast<uint32_t>((p.valid + kLineElems - 1) / kLineElems);
  }
  __device__ static bool has_run(const StagedPlace& p) { return threadIdx.x < lines_of(p); }
  __device__ static typename Run::Address run_address(const StagedPlace& p) {
    return Run::Address::of_thread(lines_of(p) * Run::kVectors);
  }
  // The total of the thread's run: against its first element where that
  // is tame, the identity where it is all -inf or past the row, against
  // its lead where it starts with -inf and is tame from there, else by the
  // op's fold.
  __device__ Total fold_thread_run(const StagedPlace& p, unsigned char* stage,
                                   SwizzledRunPath& path) const {
    path = SwizzledRunPath::kJoins;
    if (!has_run(p)) return totals().identity();
    const typename Run::Address a = run_address(p);
    if constexpr (kFirstReferenced) {
      typename Run::Part part;
      Run::load_vector(stage, a, 0, part);
      FirstReferencedSum sum(part[0]);
      sum.add(part);
      add_vectors<1>(stage, a, sum);
      if (sum.tame()) {
        path = SwizzledRunPath::kFirstReferenced;
        return sum.total();
      }
      if (sum.first == neg_inf<float>()) {
        const Lead lead = lead_of(stage, a);
        if (lead.at == Run::kLen) {
          path = SwizzledRunPath::kAllNegInf;
          return totals().identity();
        }
        // The -inf before the lead weigh 0 against it.
        FirstReferencedSum from_lead(lead.value);
        add_vectors<0>(stage, a, from_lead);
        if (from_lead.tame()) {
          path = SwizzledRunPath::kLeadReferenced;
          return from_lead.total();
        }
      }
    }
    StateOf<Op> v[Run::kLen];
    Run::load(stage, a, v);
    RunMemoOf<Op> memo;
    return fold_run(op, v, memo);
  }
  // The thread's run scanned from `carry`, in place in its stage.
  __device__ void scan_thread_run_in_stage(const StagedPlace& p, unsigned char* stage,
                                           const Fold& f, const Total& carry) const {
    const typename Run::Address a = run_address(p);
    if constexpr (kFirstReferenced) {
      if (f.path == SwizzledRunPath::kFirstReferenced) {
        scan_first_referenced(stage, a, carry);
        return;
      }
      if (f.path == SwizzledRunPath::kAllNegInf) {
        // Each result is the carry's, as the op's joins leave it.
        put_run_of(stage, a, Op::lower(carry));
        return;
      }
      if (f.path == SwizzledRunPath::kLeadReferenced) {
        scan_lead_referenced(stage, a, carry);
        return;
      }
    }
    StateOf<Op> v[Run::kLen];
    Run::load(stage, a, v);
    RunMemoOf<Op> memo;
    fold_run(op, v, memo);
    scan_thread_run(op, carry, v, memo);
    Run::put(stage, a, v);
  }
  // The run's vectors from the kFrom-th on, added to `sum`.
  template <int kFrom>
  __device__ static void add_vectors(const unsigned char* stage, const typename Run::Address& a,
                                     FirstReferencedSum& sum) {
#pragma unroll
    for (int j = kFrom; j < Run::kVectors; ++j) {
      typename Run::Part part;
      Run::load_vector(stage, a, j, part);
      sum.add(part);
    }
  }
  // A run's lead: its first element in scan order that is not -inf (a NaN
  // is one), and where it stands; at Run::kLen where every element is -inf.
  struct Lead {
    int at;
    float value;
  };
  // Runs of -inf alone once took the op's joins: a tile of them took
  // 8.2-8.7 us to fold and 13.8 to scan, against about 1.5 and 1.8 for
  // tame runs, and with every other stretch of 65536 masked a row took
  // three times as long (H100, bfloat16 [1, 16M], launcher timer,
  // SCAN_X=masked: 100.8 us so, 33.2 now; benchmarks/RESULTS.md). The op's
  // run scan now takes such runs without the joins too (scan_ops.h), but
  // only once the run is loaded whole and its largest element found; this
  // search reads the stage a vector at a time. H200, launcher timer,
  // SCAN_X=masked, bfloat16, us, with a test of this kind (then one that
  // only asked whether every element is -inf) / the op's alone:
  // [1, 16M] 29.9 / 31.8, [4, 4194304] 29.6 / 31.6, [64, 262144] 29.5 / 30.9.
  // A run a masked stretch ends inside starts with -inf, which the op's
  // run test takes as far below the rest: such runs took its joins.
  __device__ static Lead lead_of(const unsigned char* stage, const typename Run::Address& a) {
    Lead lead{Run::kLen, neg_inf<float>()};
#pragma unroll
    for (int j = Run::kVectors - 1; j >= 0; --j) {
      typename Run::Part part;
      Run::load_vector(stage, a, j, part);
#pragma unroll
      for (int k = Run::Vector::kElems - 1; k >= 0; --k) {
        if (!(part[k] == neg_inf<float>())) lead = {j * Run::Vector::kElems + k, part[k]};
      }
    }
    return lead;
  }
  __device__ static void put_run_of(unsigned char* stage, const typename Run::Address& a,
                                    float value) {
    typename Run::Part part;
#pragma unroll
    for (int k = 0; k < Run::Vector::kElems; ++k) part[k] = value;
#pragma unroll
    for (int j = 0; j < Run::kVectors; ++j) Run::put_vector(stage, a, j, part);
  }
  // A tame run's scan, vector by vector in its stage.
  __device__ void scan_first_referenced(unsigned char* stage, const typename Run::Address& a,
                                        const Total& carry) const {
    typename Run::Part part;
    Run::load_vector(stage, a, 0, part);
    if (!(carry.m == neg_inf<float>() || is_finite(carry.m))) {
      put_run_of(stage, a, carry.m);  // +inf or NaN absorbs a tame run
      return;
    }
    FirstReferencedScan scan(carry, part[0]);
    scan.scan(part);
    Run::put_vector(stage, a, 0, part);
#pragma unroll
    for (int j = 1; j < Run::kVectors; ++j) {
      Run::load_vector(stage, a, j, part);
      scan.scan(part);
      Run::put_vector(stage, a, j, part);
    }
  }
  // The scan of a run that is tame from its lead on: each result before the
  // lead is the carry's, as the op's joins leave it, and the rest are
  // scanned as a tame run from its first element, the lead (the -inf
  // before it add at most 2^-126 to a sum that the lead makes about 1).
  __device__ void scan_lead_referenced(unsigned char* stage, const typename Run::Address& a,
                                       const Total& carry) const {
    if (!(carry.m == neg_inf<float>() || is_finite(carry.m))) {
      put_run_of(stage, a, carry.m);  // +inf or NaN absorbs a tame run
      return;
    }
    const Lead lead = lead_of(stage, a);
    const float before = Op::lower(carry);
    FirstReferencedScan scan(carry, lead.value);
#pragma unroll
    for (int j = 0; j < Run::kVectors; ++j) {
      typename Run::Part part;
      Run::load_vector(stage, a, j, part);
      scan.scan(part);
#pragma unroll
      for (int k = 0; k < Run::Vector::kElems; ++k) {
        if (j * Run::Vector::kElems + k < lead.at) part[k] = before;
      }
      Run::put_vector(stage, a, j, part);
    }
  }
  // A short tile's elements inside the row, by the threads, in memory
  // order: whole vectors (the row is whole lines).
  __device__ void store_short(const StagedPlace& p, const unsigned char* stage) const {
    constexpr int kElems = 16 / int{sizeof(T)};
    uint4* dst = reinterpret_cast<uint4*>(op.dst + p.first);
    const int64_t vectors = p.valid / kElems;
#pragma unroll
    for (int c = 0; c < Run::kVectors; ++c) {
      const int m = c * kScanBlock + threadIdx.x;
      const uint32_t at = swizzled_offset(static_cast<uint32_t>(m) * 16);
      if (m < vectors) dst[m] = *reinterpret_cast<const uint4*>(stage + at);
    }
    // The copy engine writes this stage next, after the loop's barrier.
    fence_proxy_async_shared();
  }
};

}  // namespace scan
}  // namespace baracuda
