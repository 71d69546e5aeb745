// Swizzled staged runs: the run layout of the staged long rows
// (scan_staged_rows.cuh) for logcumsumexp forward, its stages laid out as
// the bulk tensor copy engine writes them with the 128-byte swizzle. Rows
// whose bytes are a whole number of 128-byte lines, with at least a tile for
// every SM, take them (launch_swizzled_runs, scan.cu); the others keep
// StagedPlainTiles. Included by scan.cu. No torch headers.
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
// line or a whole one) lies in a swizzled stage of kScanBlock such runs,
// runs following each other in scan order: its j-th vector in scan order
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

  static __device__ SwizzledRunAddress of_thread() {
    const uint32_t q = threadIdx.x * kVectors;  // the run's first vector in scan order
    const uint32_t m = kReverse ? kTileVectors - 1 - q : q;  // ... in memory order
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

  static __device__ void load(const unsigned char* stage, Acc (&v)[kLen]) {
    const Address a = Address::of_thread();
#pragma unroll
    for (int j = 0; j < kVectors; ++j) {
      const uint4 u = *reinterpret_cast<const uint4*>(a.vector(stage, j));
      Vector::unpack(u, part(v, j));
    }
  }
  static __device__ void put(unsigned char* stage, const Acc (&v)[kLen]) {
    const Address a = Address::of_thread();
#pragma unroll
    for (int j = 0; j < kVectors; ++j) {
      *reinterpret_cast<uint4*>(a.vector(stage, j)) = Vector::pack(part(v, j));
    }
  }
};

// The arrays of a swizzled launch, x and y, each as
// [rows][len * sizeof(T) / 128][128] bytes (encode_swizzled_rows, scan.cu).
struct SwizzledRowMaps {
  CUtensorMap src, dst;
};

// The tiles: StagedPlainTiles' run layout (the same fold, look-back and
// scan) on swizzled stages of kSwizzledTileBytes. The arrays are seen by
// the tensor maps as [rows][lines][128] bytes, a tile as a box of its
// lines; a row's last tile in memory, where short, reads zeros past the
// row, which the fold turns into the identity before anything reads them.
template <typename Op, bool kReverse>
struct StagedSwizzledRunTiles {
  using T = typename Op::Storage;
  using Run = SwizzledRun<Op, kReverse>;
  using Totals = TotalsOf<Op>;
  using Total = TotalOf<Op>;
  using Fold = StagedRunFold<Op>;
  static_assert(kStagedRuns<Op>, "the run layout's ops");
  static constexpr int64_t kTileLen = kSwizzledTileBytes / int64_t{sizeof(T)};
  static constexpr int kStageBytes = kSwizzledTileBytes;
  static constexpr int kStageAlign = kSwizzleStageAlign;
  static constexpr int kLines = kSwizzledTileBytes / kSwizzleLineBytes;
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
  static constexpr bool kDeferredRequests = false;
  using Maps = SwizzledRowMaps;
  Op op;
  int64_t len, tiles;

  __device__ Totals totals() const { return totals_of(op); }
  __device__ StagedPlace place(int64_t g) const {
    return place_staged_tile<kTileLen, kReverse>(g, len, tiles);
  }
  // The tile's first line in its row, the box's second coordinate.
  __device__ int first_line(const StagedPlace& p) const {
    return static_cast<int>((p.first - p.row * len) * int64_t{sizeof(T)} / kSwizzleLineBytes);
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
    if (p.valid < kTileLen) fill_past_row(stage, p.valid);
    StateOf<Op> v[Run::kLen];
    Run::load(stage, v);
    RunMemoOf<Op> memo;
    return join_staged_runs(scratch, totals(), fold_run(op, v, memo), f.before);
  }
  __device__ void scan(const StagedPlace& p, unsigned char* stage, const Fold& f,
                       const Total& prefix, const Maps& maps) const {
    StateOf<Op> v[Run::kLen];
    Run::load(stage, v);
    RunMemoOf<Op> memo;
    fold_run(op, v, memo);
    scan_thread_run(op, totals().combine(prefix, f.before), v, memo);
    Run::put(stage, v);
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
  // A short tile's positions past the row set to the identity (which a scan
  // may take anywhere: results past the row are not stored). Ends behind a
  // barrier.
  __device__ void fill_past_row(unsigned char* stage, int64_t valid) const {
    const T identity = from_acc<T>(op.identity());
    for (int64_t p = valid + threadIdx.x; p < kTileLen; p += kScanBlock) {
      *reinterpret_cast<T*>(stage + swizzled_offset(static_cast<uint32_t>(p * sizeof(T)))) =
          identity;
    }
    __syncthreads();
  }
  // A short tile's elements inside the row, by the threads, in memory
  // order: whole vectors where they are inside, else element by element.
  __device__ void store_short(const StagedPlace& p, const unsigned char* stage) const {
    constexpr int kElems = 16 / int{sizeof(T)};
    T* dst = op.dst + p.first;
#pragma unroll
    for (int c = 0; c < Run::kVectors; ++c) {
      const int m = c * kScanBlock + threadIdx.x;
      const int64_t first = int64_t{m} * kElems;
      const unsigned char* vector = stage + swizzled_offset(static_cast<uint32_t>(m) * 16);
      if (first + kElems <= p.valid) {
        reinterpret_cast<uint4*>(dst)[m] = *reinterpret_cast<const uint4*>(vector);
      } else {
        for (int64_t e = first; e < p.valid; ++e) {
          dst[e] = reinterpret_cast<const T*>(vector)[e - first];
        }
      }
    }
    // The copy engine writes this stage next, after the loop's barrier.
    fence_proxy_async_shared();
  }
};

}  // namespace scan
}  // namespace baracuda
