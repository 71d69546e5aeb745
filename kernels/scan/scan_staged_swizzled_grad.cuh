// Swizzled gradient tiles: the tiles base of the staged gradient (as
// StagedGradTiles, scan_staged_grad_tiles.cuh) for two-byte logcumsumexp
// backward on rows of whole 128-byte lines with at least a tile for every
// SM (launch_swizzled_grad, scan_launch.cuh), its stages laid out as the
// tensor copy engine writes them with the 128-byte swizzle
// (scan_staged_swizzled_runs.cuh says why). Included by scan_launch.cuh. No
// torch headers.
//
// A thread's run is half a line of each input, 32 elements, in tiles of
// 8192: twice StagedGradTiles' 16, so that what a tile costs besides its
// elements (the join of the block's runs, the look-back, the barriers) is
// spread over twice the elements. The two inputs the fold reads are staged,
// 16 KiB each, three stages, two blocks an SM; the third, read only by the
// scan, each thread reads from memory before the wait for its prefix
// (prefetch). dx goes over dy's part of the stage and out by one tensor
// store. A row's last tile in memory, where short, is read and written
// element by element, straight from memory, as StagedGradTiles does.
//
// H100, bfloat16 logcumsumexp backward, [1, 16M], launcher timer, three
// runs each, against StagedGradTiles in the same machine start (73.3-74.1
// us in all three starts): these tiles on kStride 62.6-62.7 (kGroups
// 65.0-65.6); with kDeferredRequests 61.5-62.0; with the runs' finiteness
// kept from fold to scan (StagedLogcumsumexpGradTiles::kMemo) 60.4-61.4
// (evict-first loads alone: 61.9-62.0, against 61.7-62.5 without); with
// two-byte joins by the bare power and dx packed two at a time 59.4-60.8.
// The copy of the same bytes took 48.4-49.6.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/hopper.cuh"
#include "scan/scan_block.cuh"
#include "scan/scan_plan.h"
#include "scan/scan_staged_grad_tiles.cuh"
#include "scan/scan_staged_rows.cuh"
#include "scan/scan_staged_swizzled_runs.cuh"

namespace baracuda {
namespace scan {

constexpr int kSwizzledGradRunLen = 32;

// The arrays of a swizzled gradient launch, each as
// [rows][len * sizeof(T) / 128][128] bytes (encode_swizzled_rows,
// scan_launch.cuh):
// the two staged inputs in input order, and dx.
struct SwizzledGradMaps {
  CUtensorMap staged[2];
  CUtensorMap dx;
};

// kScanOnly: the input (1 x, 2 y) that only the scan reads, not the fold.
template <typename Op, bool kReverse, int kScanOnly>
struct StagedSwizzledGradTiles : GradRuns<Op, kReverse, kSwizzledGradRunLen> {
  using T = typename Op::Storage;
  using Runs = GradRuns<Op, kReverse, kSwizzledGradRunLen>;
  using Runs::input;
  using Runs::len;
  using Runs::whole;
  static_assert(sizeof(T) == 2, "two-byte elements: a run is half a line");
  static constexpr int R = kSwizzledGradRunLen;
  using Runs::kTileBytes;
  using Runs::kTileLen;
  using Runs::kVectors;
  using Address = SwizzledRunAddress<kVectors, kReverse>;
  static constexpr int kArrays = 2;  // staged: the inputs but kScanOnly
  static constexpr int kStageBytes = kArrays * kTileBytes;
  static constexpr int kStageAlign = kSwizzleStageAlign;
  static constexpr int kLines = kTileBytes / kSwizzleLineBytes;  // a tile's, of each input
  static constexpr int kBlocksPerSm = 2;
  static constexpr int kStages = 3;
  static constexpr PrefixReads kPrefixReads = PrefixReads::kEarlyShared;
  static constexpr bool kPrefetches = true;
  static constexpr bool kBulkStores = true;
  // The stage a tile was scanned in is asked for again after the next
  // tile's fold rather than right after the scan: thread 0 waits there
  // for its tensor store to have read the stage, and the whole block
  // waited on it at the next barrier (61.5-62.0 us against 62.6-62.7,
  // above). Of the other tiles types with bulk stores only two-byte
  // StagedSwizzledRunTiles defer too: with the deferral, float32
  // logcumsumexp forward took 59.6-59.7 against 57.7-59.0.
  static constexpr bool kDeferredRequests = true;
  static constexpr bool kEarlyReadsAfterData = false;
  static constexpr bool kJoinOnOwnPrefix = false;
  using Maps = SwizzledGradMaps;
  static_assert(kStageBytes % kStageAlign == 0, "every stage starts on a swizzle pattern");

  using Runs::Runs;

  __device__ static constexpr int stage_part(int a) { return a > kScanOnly ? a - 1 : a; }
  // The tile's first line in its row, the box's second coordinate.
  __device__ int first_line(const StagedPlace& p) const {
    return static_cast<int>((p.first - p.row * len) * int64_t{sizeof(T)} / kSwizzleLineBytes);
  }

  // Thread 0: asks the copy engine for the tile's staged inputs (nothing
  // for a short tile, read from memory), their L2 lines marked to go first
  // as the forward's swizzled tiles' are: they are read once.
  __device__ void request(const StagedPlace& p, unsigned char* stage, uint64_t* full,
                          const Maps& maps) const {
    if (!whole(p)) {
      mbarrier_arrive_expect_tx(full, 0);
      return;
    }
    mbarrier_arrive_expect_tx(full, kStageBytes);
#pragma unroll
    for (int part = 0; part < kArrays; ++part) {
      tma_load_3d<L2Lines::kEvictFirst>(stage + part * kTileBytes, &maps.staged[part], 0,
                                        first_line(p), static_cast<int>(p.row), full);
    }
  }

  // The thread's run of the input its scan alone reads, from memory, for a
  // whole tile (a short one reads element by element).
  struct Prefetched {
    uint4 raw[kVectors];
  };
  __device__ Prefetched prefetch(const StagedPlace& p) const {
    Prefetched pre{};
    if (whole(p)) Runs::read_run(input(kScanOnly) + p.first, pre.raw);
    return pre;
  }

  // The thread's run of staged input `a`, in memory order.
  __device__ static void load_run(const unsigned char* stage, int a, uint4 (&raw)[kVectors]) {
    const unsigned char* part = stage + stage_part(a) * kTileBytes;
    const Address at = Address::of_thread();
#pragma unroll
    for (int j = 0; j < kVectors; ++j) {
      raw[kReverse ? kVectors - 1 - j : j] = *reinterpret_cast<const uint4*>(at.vector(part, j));
    }
  }

  // A whole tile's dx, the thread's run `out` in memory order: over the
  // thread's own dy vectors (read already), then out by thread 0's tensor
  // store. Ends with the stage free for the copy engine once the caller's
  // loop has passed its barrier and thread 0 has waited for the store to
  // read the stage. (The dx pointer StagedGradTiles::store_dx takes is
  // unused: the map names dx.)
  __device__ void store_dx(const StagedPlace& p, unsigned char* stage,
                           const uint4 (&out)[kVectors], T*, const Maps& maps) const {
    const Address at = Address::of_thread();
#pragma unroll
    for (int j = 0; j < kVectors; ++j) {
      *reinterpret_cast<uint4*>(at.vector(stage, j)) = out[kReverse ? kVectors - 1 - j : j];
    }
    fence_proxy_async_shared();  // the threads' writes, before the copy engine reads them
    __syncthreads();
    if (threadIdx.x == 0) {
      tma_store_3d(&maps.dx, 0, first_line(p), static_cast<int>(p.row), stage);
    }
  }
};

}  // namespace scan
}  // namespace baracuda
