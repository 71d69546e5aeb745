// Staged extremes: the staged long rows (scan_staged_rows.cuh) for cummax
// and cummin forward (ExtremeForward, scan_ops.h) on float32 and two-byte
// elements. Same loop and conditions as the staged long rows (rows starting
// 16 bytes aligned, compute capability 9.0 and up); only the tiles differ.
// Included by scan_launch.cuh. No torch headers.
//
// The forward reads one array and writes two, the values and their int64
// positions: three bytes of every four it moves are written (float32), five
// of every six (two-byte). The copy engine stages x a tile at a time
// (kExtremeTileLen elements). Thread t takes a run of kExtremeRunLen
// consecutive elements in scan order, folds it to a (value, position)
// state, and the block's runs are joined; once the tile's prefix is known
// the run is read again and scanned. Inside a run the lead is a value and
// its place in the run, not a State with a whole position. The outputs
// leave through the warp's own part of shared memory, so that each warp
// store is 512 contiguous bytes rather than a thread's 16 bytes at every 64
// or 128: the values through the warp's part of the stage, then the
// positions, in two turns of that part (float32) or at once through a part
// of their own (two-byte). Only barriers of the warp stand between a
// warp's turns. A row's last tile in memory, where it is short, is read and
// written element by element, straight from memory.
//
// Each step measured faster on cummax forward: these tiles over the
// long_rows kernel, the lead kept as a value and a place over States all
// through the run, the prefix's reads sent out before the next tile's fold
// (kPrefixReads), and two-byte positions in a part of their own over four
// turns of the stage's part. Three blocks per SM (80 registers, up to 40
// bytes of spill); at four (64 registers) the scan spilled more and ran far
// slower, and two were slower too. float64 keeps the long_rows kernel.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/hopper.cuh"
#include "scan/scan_block.cuh"
#include "scan/scan_plan.h"
#include "scan/scan_staged_rows.cuh"

namespace baracuda {
namespace scan {

template <typename Op>
struct IsExtremeForward : std::false_type {};
template <typename T, typename Acc, typename Pos, bool kMax>
struct IsExtremeForward<ExtremeForward<T, Acc, Pos, kMax>> : std::true_type {
  static constexpr bool kIsMax = kMax;
};

// float32 and two-byte elements; float64 keeps the long_rows kernel.
template <typename Op>
constexpr bool kStagedExtremesApply =
    IsExtremeForward<Op>::value && sizeof(typename Op::Storage) <= 4;

// Elements a thread scans per tile, whatever their size: a tile is 4096
// elements, 16 KiB of float32 or 8 KiB of two-byte x.
constexpr int kExtremeRunLen = 16;
constexpr int64_t kExtremeTileLen = int64_t{kScanBlock} * kExtremeRunLen;

// A slot of 16 bytes in a warp's part of the stage for vector j of the
// warp's run r (runs of `kPerRun` vectors, in memory order): within a run
// the vectors are turned by a few bits of r, so that the eight threads of a
// quarter warp, each writing its run's j-th vector, meet eight different
// 16-byte bank groups; read back in memory order, eight consecutive
// vectors are one run's or two runs' whole, in eight groups too.
template <int kPerRun>
__device__ int swizzled_slot(int r, int j) {
  static_assert(kPerRun == 2 || kPerRun == 4 || kPerRun == 8, "runs of 2, 4 or 8 vectors");
  return r * kPerRun + (j ^ ((r * kPerRun / 8) % kPerRun));
}

template <typename Op, bool kReverse>
struct StagedExtremeTiles {
  using T = typename Op::Storage;
  using State = StateOf<Op>;
  using Acc = decltype(State::value);
  using Pos = decltype(State::index);
  using Totals = TotalsOf<Op>;
  using Total = TotalOf<Op>;
  static constexpr int R = kExtremeRunLen;
  static constexpr int kElems = 16 / int{sizeof(T)};  // a vector's
  static constexpr int kVectors = R / kElems;         // a run's vectors of x (and of y)
  static constexpr int kIndexVectors = R / 2;         // and of positions
  static constexpr int64_t kTileLen = kExtremeTileLen;
  static constexpr int kStageBytes = static_cast<int>(kTileLen * int64_t{sizeof(T)});
  // A warp's part of the stage: its 32 runs of x, in 16-byte vectors.
  static constexpr int kWarpVectors = 32 * kVectors;
  // Where the warp's positions go out: two-byte x leaves a part a quarter
  // of their size, so they take a part of their own, 4 KiB a warp, and go
  // out in one turn; float32 x leaves half their size, and they take its
  // part in two turns. Runs whose positions fill the part at once, and the
  // turns they take:
  static constexpr bool kOwnIndexPart = sizeof(T) == 2;
  static constexpr int kIndexPartVectors = kOwnIndexPart ? 32 * kIndexVectors : kWarpVectors;
  static constexpr int kIndexRunsPerTurn = kIndexPartVectors / kIndexVectors;
  static constexpr int kIndexTurns = 32 / kIndexRunsPerTurn;
  static constexpr int kBlocksPerSm = 3;  // see the measurements above
  static constexpr int kStages = kStagedStages;
  static constexpr PrefixReads kPrefixReads = PrefixReads::kEarlyShared;  // see above
  // kStride rather than kGroups: faster for float32, slower for two-byte
  // elements.
  static constexpr LookBack kLookBack = sizeof(T) == 4 ? LookBack::kStride : LookBack::kGroups;
  static constexpr bool kPrefetches = false;
  static constexpr bool kDeferredRequests = false;
  static constexpr bool kEarlyReadsAfterData = false;
  static constexpr bool kJoinOnOwnPrefix = false;
  static constexpr bool kBulkStores = false;
  static_assert(kTileLen >= ::baracuda::kTileLen, "the workspace holds a slot per tile");
  static_assert(sizeof(Total) == sizeof(State), "the tiles publish the op's own states");

  struct Fold {
    Total before;  // everything in the tile before the thread's run
  };

  Op op;
  int64_t len, tiles;

  __device__ Totals totals() const { return totals_of(op); }
  __device__ StagedPlace place(int64_t g) const {
    return place_staged_tile<kTileLen, kReverse>(g, len, tiles);
  }
  __device__ void request(const StagedPlace& p, unsigned char* stage, uint64_t* full) const {
    const uint32_t bytes = static_cast<uint32_t>(p.valid * int64_t{sizeof(T)}) & ~15u;
    mbarrier_arrive_expect_tx(full, bytes);
    if (bytes > 0) bulk_copy_to_shared(stage, op.x + p.first, bytes, full);
  }

  // The thread's run in memory: run `r` of its warp's 32, whose first is the
  // tile's run `warp_first`. Scan order walks the tile backwards in memory
  // when reversed, so thread t takes the run 255 - t there.
  __device__ static int warp_first() {
    const int warp = threadIdx.x / 32;
    return kReverse ? kScanBlock - 32 * (warp + 1) : 32 * warp;
  }
  __device__ static int run_in_warp() {
    const int lane = threadIdx.x % 32;
    return kReverse ? 31 - lane : lane;
  }
  // Element s of a run in scan order, in memory.
  __device__ static int memory_of(int s) { return kReverse ? R - 1 - s : s; }

  // Inside a run the lead is a value and its place in the run, where a
  // State would carry and compare whole positions; it changes hands as
  // ExtremeCombine's does: a NaN always takes it and, once it is NaN, only
  // a NaN does; otherwise a later element takes it on a tie.
  static constexpr bool kMax = IsExtremeForward<Op>::kIsMax;
  __device__ static bool takes_lead(Acc v, Acc lead) {
    return (kMax ? v >= lead : v <= lead) || is_nan(v);
  }
  // A lead every element takes, NaN or not: the run's first takes it.
  __device__ static Acc no_lead() { return kMax ? neg_inf<Acc>() : -neg_inf<Acc>(); }

  // The thread's run of a whole tile from its stage, in memory order, as
  // the stage holds it: kept packed, it takes half the registers for
  // two-byte elements, and the values written back are x's own.
  __device__ static void load_run(const unsigned char* stage, uint4 (&raw)[kVectors]) {
    const uint4* mine =
        reinterpret_cast<const uint4*>(stage) + (warp_first() + run_in_warp()) * kVectors;
#pragma unroll
    for (int v = 0; v < kVectors; ++v) raw[v] = mine[v];
  }
  __device__ static Acc element(const uint4 (&raw)[kVectors], int e) {
    return run_element<T, Acc>(raw, e);
  }
  __device__ static void set_element(uint4 (&raw)[kVectors], int e, Acc value) {
    set_run_element<T>(raw, e, value);
  }

  // The row position of the run's first element in memory.
  __device__ int64_t run_position(const StagedPlace& p) const {
    return p.first - p.row * len + int64_t{warp_first() + run_in_warp()} * R;
  }

  // The thread's run of a short tile (a row's last in memory), element by
  // element in scan order straight from memory: f(offset, row position) for
  // each element inside the row.
  template <typename F>
  __device__ void for_each_short(const StagedPlace& p, int64_t at, F&& f) const {
    const int64_t in_tile = at - (p.first - p.row * len);
#pragma unroll
    for (int s = 0; s < R; ++s) {
      const int e = memory_of(s);
      if (in_tile + e < p.valid) f(p.first + in_tile + e, at + e);
    }
  }

  __device__ Total fold(const StagedPlace& p, unsigned char* stage, Fold& f) const {
    __shared__ typename BlockTotalsScan<Totals>::TempStorage scratch;
    const int64_t at = run_position(p);
    State mine = op.identity();
    if (p.valid == kTileLen) {
      uint4 raw[kVectors];
      load_run(stage, raw);
      Acc lead = no_lead();
      int lead_at = 0;
#pragma unroll
      for (int s = 0; s < R; ++s) {
        const int e = memory_of(s);
        const Acc v = element(raw, e);
        const bool take = takes_lead(v, lead);
        lead = take ? v : lead;
        lead_at = take ? e : lead_at;
      }
      mine = State{lead, static_cast<Pos>(at + lead_at)};
    } else {
      for_each_short(p, at,
                     [&](int64_t off, int64_t l) { mine = op.combine(mine, op.load(off, l)); });
    }
    return join_staged_runs(scratch, totals(), mine, f.before);
  }

  // An element's position is either one in the run (the last element so
  // far, in scan order, that took the lead) or the one everything before
  // the run ends with; so a thread keeps a byte per element, that lead's
  // place in the run plus one or 0, rather than 16 positions.
  __device__ void scan(const StagedPlace& p, unsigned char* stage, const Fold& f,
                       const Total& carry) const {
    const int64_t at = run_position(p);
    const State start = totals().combine(carry, f.before);
    State run = start;
    if (p.valid != kTileLen) {
      for_each_short(p, at, [&](int64_t off, int64_t l) {
        run = op.combine(run, op.load(off, l));
        op.store(off, l, run);
      });
      return;
    }
    uint4 raw[kVectors];
    load_run(stage, raw);
    // With nothing before the run, its first element takes the lead.
    Acc lead = start.index < 0 ? no_lead() : start.value;
    uint32_t leads[R / 4] = {};
    uint32_t lead_at = 0;
#pragma unroll
    for (int s = 0; s < R; ++s) {
      const int e = memory_of(s);
      const Acc v = element(raw, e);
      const bool take = takes_lead(v, lead);
      lead = take ? v : lead;
      lead_at = take ? uint32_t(e + 1) : lead_at;
      set_element(raw, e, lead);
      leads[e / 4] |= lead_at << (8 * (e % 4));
    }
    store_warp_outputs(p, stage, raw, leads, start.index);
  }

  // The warp's values, then its positions, out through its part of the
  // stage, each thread writing its run's vectors to their swizzled slots
  // and every warp store then covering 512 contiguous bytes.
  __device__ void store_warp_outputs(const StagedPlace& p, unsigned char* stage,
                                     const uint4 (&y)[kVectors], const uint32_t (&leads)[R / 4],
                                     Pos before_run) const {
    const int lane = threadIdx.x % 32;
    const int r = run_in_warp();
    const int64_t warp_at = p.first + int64_t{warp_first()} * R;  // the warp's first element
    const int64_t run_at = run_position(p);
    uint4* part = reinterpret_cast<uint4*>(stage) + warp_first() * kVectors;
    __syncwarp();  // every thread of the warp has read its x
#pragma unroll
    for (int v = 0; v < kVectors; ++v) part[swizzled_slot<kVectors>(r, v)] = y[v];
    __syncwarp();
    uint4* y_out = reinterpret_cast<uint4*>(op.y + warp_at);
#pragma unroll
    for (int c = 0; c < kVectors; ++c) {
      const int n = c * 32 + lane;
      y_out[n] = part[swizzled_slot<kVectors>(n / kVectors, n % kVectors)];
    }
    const auto position = [&](int e) -> int64_t {
      const uint32_t lead = (leads[e / 4] >> (8 * (e % 4))) & 0xffu;
      return lead == 0 ? int64_t{before_run} : run_at + int64_t(lead) - 1;
    };
    uint4* index_part = part;
    if constexpr (kOwnIndexPart) {
      __shared__ uint4 index_parts[kScanBlock / 32][kIndexPartVectors];
      index_part = index_parts[threadIdx.x / 32];
    }
    uint4* index_out = reinterpret_cast<uint4*>(op.indices + warp_at);
#pragma unroll
    for (int turn = 0; turn < kIndexTurns; ++turn) {
      __syncwarp();  // the part is read out
      if (r / kIndexRunsPerTurn == turn) {
        const int rr = r % kIndexRunsPerTurn;
#pragma unroll
        for (int v = 0; v < kIndexVectors; ++v) {
          const int64_t pair[2] = {position(2 * v), position(2 * v + 1)};
          uint4 u;
          memcpy(&u, pair, 16);
          index_part[swizzled_slot<kIndexVectors>(rr, v)] = u;
        }
      }
      __syncwarp();
#pragma unroll
      for (int c = 0; c < kIndexPartVectors / 32; ++c) {
        const int n = c * 32 + lane;
        index_out[turn * kIndexPartVectors + n] =
            index_part[swizzled_slot<kIndexVectors>(n / kIndexVectors, n % kIndexVectors)];
      }
    }
    // The copy engine writes this stage next, after the loop's barrier.
    fence_proxy_async_shared();
  }
};

}  // namespace scan
}  // namespace baracuda
