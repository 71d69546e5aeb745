// What the staged gradient tiles -- cumprod's (scan_staged_cumprod_grad.cuh)
// and logcumsumexp's (scan_staged_logcumsumexp_grad.cuh) backward, on
// float32 and two-byte elements -- share, as their base: how they place,
// request and hold a tile. The copy engine stages dy, x and y a tile
// (kTileLen elements) at a time (float32: the two the fold reads, the
// third read by the scan from memory), thread t takes a run of R
// consecutive elements of each in scan order, and once the tile is scanned
// dx goes out through the thread's own vectors of dy's part of the stage:
// two-byte tiles by each warp's stores, each covering 512 contiguous bytes,
// float32 tiles by one bulk copy of that part. A row's last tile in memory,
// where it is short, is read and written element by element, straight from
// memory. The tiles add their math: the tiles type's fold, scan and totals
// (scan_staged_rows.cuh). Included by scan_launch.cuh. No torch headers.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/hopper.cuh"
#include "scan/scan_block.cuh"
#include "scan/scan_plan.h"
#include "scan/scan_staged_rows.cuh"

namespace baracuda {
namespace scan {

constexpr int kStagedGradRunLen = 16;

// Whether Op is the gradient op Grad<T, Acc> on elements these tiles take
// (float32 and two-byte).
template <template <typename, typename> class Grad, typename Op>
struct IsStagedGradOf : std::false_type {};
template <template <typename, typename> class Grad, typename T, typename Acc>
struct IsStagedGradOf<Grad, Grad<T, Acc>> : std::bool_constant<sizeof(T) <= 4> {};

// What the gradient tiles' layouts share, the unswizzled tiles below and the
// swizzled ones (scan_staged_swizzled_grad.cuh): the op and the rows, and
// where a tile's runs lie: thread t takes a run of R consecutive elements
// of each input in scan order, runs following each other in scan order, in
// tiles of kScanBlock runs.
template <typename Op, bool kReverse, int R>
struct GradRuns {
  using T = typename Op::Storage;
  static constexpr int kElems = 16 / int{sizeof(T)};  // a vector's
  static constexpr int kVectors = R / kElems;         // a run's, of each input
  static constexpr int64_t kTileLen = int64_t{kScanBlock} * R;
  static constexpr int kTileBytes = static_cast<int>(kTileLen * int64_t{sizeof(T)});

  Op op;
  int64_t len, tiles;  // a row's elements and tiles

  // The tiles types are built by the launcher as {op, len, tiles}.
  __host__ __device__ GradRuns(const Op& op_, int64_t len_, int64_t tiles_)
      : op(op_), len(len_), tiles(tiles_) {}

  __device__ StagedPlace place(int64_t g) const {
    return place_staged_tile<kTileLen, kReverse>(g, len, tiles);
  }
  __device__ static bool whole(const StagedPlace& p) { return p.valid == kTileLen; }
  __device__ const T* input(int a) const { return a == 0 ? op.dy : a == 1 ? op.x : op.y; }

  // Thread t's run in memory: the tile's run 255 - t when the scan walks
  // memory backwards, so that runs follow each other in scan order.
  __device__ static int run_in_tile() {
    return kReverse ? kScanBlock - 1 - int(threadIdx.x) : int(threadIdx.x);
  }
  // The memory place, within its run, of the run's s-th element in scan order.
  __device__ static int memory_of(int s) { return kReverse ? R - 1 - s : s; }

  __device__ static float element(const uint4 (&raw)[kVectors], int e) {
    return run_element<T, float>(raw, e);
  }

  // The thread's run of a short tile in scan order, element by element from
  // memory: f(tile element, its offset) for each element inside the row.
  template <typename F>
  __device__ static void for_each_short(const StagedPlace& p, F&& f) {
    const int64_t run_at = int64_t{run_in_tile()} * R;  // in the tile
#pragma unroll
    for (int s = 0; s < R; ++s) {
      const int64_t e = run_at + memory_of(s);
      if (e < p.valid) f(e, p.first + e);
    }
  }

  // The thread's run of a whole tile of `input` (starting at `tile`),
  // straight from memory, read once.
  __device__ static void read_run(const T* tile, uint4 (&raw)[kVectors]) {
    const uint4* run = reinterpret_cast<const uint4*>(tile + int64_t{run_in_tile()} * R);
#pragma unroll
    for (int q = 0; q < kVectors; ++q) raw[q] = __ldcs(run + q);
  }
};

// kScanOnly: the input (1 x, 2 y) that only the scan reads, not the fold.
template <typename Op, bool kReverse, int kScanOnly>
struct StagedGradTiles : GradRuns<Op, kReverse, kStagedGradRunLen> {
  using T = typename Op::Storage;
  using Runs = GradRuns<Op, kReverse, kStagedGradRunLen>;
  using Runs::input;
  using Runs::whole;
  static constexpr int R = kStagedGradRunLen;
  using Runs::kTileBytes;
  using Runs::kTileLen;
  using Runs::kVectors;
  using Runs::memory_of;
  using Runs::run_in_tile;
  static constexpr int kInputs = 3;  // dy, x, y
  // Float32 tiles leave the input only their scan reads out of the stage:
  // the scan's threads read their runs of it straight from memory
  // (prefetch), sent out after the fold ahead and before the wait for the
  // prefix. Three stages of the other two take 96 KiB a block, two blocks
  // an SM, where three stages of all three would leave one; with two
  // stages, a block asked for a tile only as the scan before it ended, and
  // waited for it at the next round's start (both float32 backward ops ran
  // faster with the prefetch). Two-byte tiles stage all three: three
  // stages, three blocks.
  static constexpr bool kPrefetches = sizeof(T) == 4;
  // Float32 tiles store dx by one bulk copy from the stage (store_dx),
  // measured faster. Two-byte tiles keep the threads' stores: with the bulk
  // copy both ran slower (cumprod backward spilled 56 bytes at 80 registers
  // rather than 40).
  static constexpr bool kBulkStores = sizeof(T) == 4;
  static constexpr bool kDeferredRequests = false;
  static constexpr bool kEarlyReadsAfterData = false;
  static constexpr bool kJoinOnOwnPrefix = false;
  static constexpr int kArrays = kPrefetches ? 2 : 3;  // staged, in input order
  static constexpr int kStageBytes = kArrays * kTileBytes;
  static constexpr int kBlocksPerSm = sizeof(T) == 2 ? 3 : 2;
  static constexpr int kStages = 3;
  // The early prefix reads' shared copies hold 4 KiB a block: with them,
  // three blocks of two-byte stages do not fit an SM, and two ran slower
  // than three without them. Two-byte tiles hold their copies in registers
  // (80 of them, up to 12 bytes of spill), three blocks still, faster than
  // reading after the fold. (That was one early read a thread; cumprod's
  // two under kStride spill 40 bytes and are faster still:
  // finish_stride_prefix.)
  static constexpr PrefixReads kPrefixReads =
      sizeof(T) == 4 ? PrefixReads::kEarlyShared : PrefixReads::kEarlyRegisters;
  static_assert(kTileLen >= ::baracuda::kTileLen, "the workspace holds a slot per tile");

  using Runs::Runs;

  // Whether input `a` is staged, and where.
  __device__ static constexpr bool staged(int a) { return !kPrefetches || a != kScanOnly; }
  __device__ static constexpr int stage_part(int a) {
    return kPrefetches && a > kScanOnly ? a - 1 : a;
  }

  // Thread 0: asks the copy engine for the tile's staged inputs (nothing
  // for a short tile, read from memory).
  __device__ void request(const StagedPlace& p, unsigned char* stage, uint64_t* full) const {
    if (!whole(p)) {
      mbarrier_arrive_expect_tx(full, 0);
      return;
    }
    mbarrier_arrive_expect_tx(full, kArrays * kTileBytes);
#pragma unroll
    for (int a = 0; a < kInputs; ++a) {
      if (staged(a)) {
        bulk_copy_to_shared(stage + stage_part(a) * kTileBytes, input(a) + p.first, kTileBytes,
                            full);
      }
    }
  }

  // The thread's run of the input its scan alone reads, from memory, for a
  // whole tile (a short one reads element by element); and where that
  // input is y, for a warp's last lane, `next`: y one past the run in scan
  // order, where it is in the tile (cumprod's gradient reads it there, the
  // other lanes take it from their neighbour).
  struct Prefetched {
    uint4 raw[kVectors];
    float next;
  };
  __device__ Prefetched prefetch(const StagedPlace& p) const {
    Prefetched pre{};
    if constexpr (kPrefetches) {
      if (whole(p)) {
        Runs::read_run(input(kScanOnly) + p.first, pre.raw);
        const T* mine = input(kScanOnly) + p.first + int64_t{run_in_tile()} * R;
        const int64_t beyond = kReverse ? -1 : R;
        const int64_t at = int64_t{run_in_tile()} * R + beyond;
        if (kScanOnly == 2 && threadIdx.x % 32 == 31 && at >= 0 && at < kTileLen) {
          pre.next = to_acc<float>(__ldcs(mine + beyond));
        }
      }
    }
    return pre;
  }

  // The thread's run of input `a`, read in a staggered order
  // (staggered_rotation: runs 64 or 32 bytes apart would otherwise meet in
  // two or four of the eight bank groups).
  __device__ static void load_run(const unsigned char* stage, int a, uint4 (&raw)[kVectors]) {
    const uint4* mine = reinterpret_cast<const uint4*>(stage + stage_part(a) * kTileBytes) +
                        run_in_tile() * kVectors;
    const int rot = staggered_rotation<kVectors>();
#pragma unroll
    for (int q = 0; q < kVectors; ++q) raw[q] = mine[(q + rot) & (kVectors - 1)];
    rotate_vectors(raw, (kVectors - rot) & (kVectors - 1));
  }
  // Writes `raw` (the thread's run, in memory order) over its run of input
  // `a` in the stage, staggered as load_run reads. `raw` is left rotated.
  __device__ static void store_run(unsigned char* stage, int a, uint4 (&raw)[kVectors]) {
    uint4* mine = reinterpret_cast<uint4*>(stage + stage_part(a) * kTileBytes) +
                  run_in_tile() * kVectors;
    const int rot = staggered_rotation<kVectors>();
    rotate_vectors(raw, rot);
#pragma unroll
    for (int q = 0; q < kVectors; ++q) mine[(q + rot) & (kVectors - 1)] = raw[q];
  }

  // A whole tile's dx, the thread's run `out` in memory order: over the
  // thread's own dy vectors (read already), then out a vector a thread, or
  // with kBulkStores by thread 0's bulk copy of the stage's dy part. Ends
  // with the stage free for the copy engine once the caller's loop has
  // passed its barrier (and, with kBulkStores, thread 0 has waited for its
  // copy to read the stage).
  __device__ static void store_dx(const StagedPlace& p, unsigned char* stage,
                                  uint4 (&out)[kVectors], T* dx) {
    T* const dx_tile = dx + p.first;
    store_run(stage, 0, out);
    if constexpr (kBulkStores) {
      store_stage_by_bulk_copy(dx_tile, stage, kTileBytes);
      return;
    }
    __syncthreads();
    const uint4* staged = reinterpret_cast<const uint4*>(stage);
    uint4* dst = reinterpret_cast<uint4*>(dx_tile);
#pragma unroll
    for (int c = 0; c < kVectors; ++c) {
      const int m = c * kScanBlock + threadIdx.x;
      __stwb(dst + m, staged[m]);
    }
    // The copy engine writes this stage next, after the loop's barrier.
    fence_proxy_async_shared();
  }
};

}  // namespace scan
}  // namespace baracuda
