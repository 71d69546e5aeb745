// Keyed long rows: cummax / cummin backward (ExtremeBackward, scan_ops.h) on
// the long_rows path (scan_plan.h), with no tile ever waiting for another.
// Included by scan_launch.cuh. No torch headers.
//
// The backward's keyed sum needs what comes before a tile in only one
// place. Its outputs are nonzero only where the key (the position the
// forward returned) is the element's own position, the last element of its
// run in the backward's scan order, and the only run of a tile that can
// start before the tile is its leading one. So a tile is scanned alone, from
// the identity, and all of its gradient written; it records its total and,
// where its leading run ends inside it, that run's sum there. A second
// kernel, one block per row, scans the tiles' totals in order (a fixed
// association, so bit-identical run to run) and rewrites that one element of
// each tile whose leading run goes on from the tiles before: the tile's own
// sum joined after the carry, rounded once.
//
// The long_rows kernel spent a good part of its time in its look-back;
// these kernels measured faster, more so with the keys through shared
// memory and the fix-up's first 16 records kept in registers. A fix-up
// reading its records as four 4-byte loads each, every load 256 bytes from
// the next thread's, made one long row slower than several shorter ones;
// 16-byte records, read in one load each as now, close most of that gap.
// (A fix-up whose warps each scanned chunks of 32 records loaded coalesced
// measured slower on several rows: not kept.)
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/cuda_launch.cuh"
#include "common/hopper.cuh"
#include "common/zeroed_launch.cuh"
#include "scan/scan_block.cuh"
#include "scan/scan_kernels.h"
#include "scan/scan_ops.h"
#include "scan/scan_plan.h"
#include "scan/scan_tuning.cuh"

namespace baracuda {
namespace scan {

template <typename Op>
struct IsExtremeBackward : std::false_type {};
template <typename T, typename Acc, typename Pos>
struct IsExtremeBackward<ExtremeBackward<T, Acc, Pos>> : std::true_type {};

constexpr int64_t kKeyedTileLen = int64_t{kScanBlock} * kKeyedRunLen;

// What a tile leaves for the second kernel; 16-byte aligned, so that the
// fix-up reads each in one load rather than four of 4 bytes.
template <typename Acc, typename Pos>
struct alignas(16) KeyedTileRecord {
  KeyedSum<Acc, Pos> total;  // the tile's keyed sum, in scan order
  Pos fix_at;  // where its leading run ends, if inside the tile; else -1
  Acc local;   // the leading run's sum there, within the tile
};

template <typename Op>
using KeyedRecordOf = KeyedTileRecord<decltype(StateOf<Op>::sum), decltype(StateOf<Op>::key)>;

// The long_rows workspace holds a flagged slot per kTileLen elements.
static_assert(kKeyedTileLen >= kTileLen, "a record per tile fits the long_rows workspace");

// Tile `tile` of every row covers memory positions [tile * kKeyedTileLen,
// ...) of its row; thread t holds scan positions [t * R, t * R + R) of the
// tile (R = kKeyedRunLen), which lie in memory consecutively either way.
template <typename Op, bool kReverse>
struct KeyedTile {
  using T = typename Op::Storage;
  using State = StateOf<Op>;
  using Acc = decltype(State::sum);
  using Pos = decltype(State::key);
  static constexpr int R = kKeyedRunLen;
  static constexpr int kPerVector = 16 / int{sizeof(T)};

  int64_t base;   // the row's first element
  int64_t first;  // the tile's first memory position along the row
  int64_t valid;  // its positions inside the row
  int64_t run;    // the thread's first memory position along the row

  __device__ KeyedTile(int64_t len, int64_t tiles, int64_t g) {
    const int64_t row = static_cast<uint32_t>(g) / static_cast<uint32_t>(tiles);
    const int64_t tile = g - row * tiles;
    base = row * len;
    first = tile * kKeyedTileLen;
    valid = len - first < kKeyedTileLen ? len - first : kKeyedTileLen;
    const int t = threadIdx.x;
    run = first + (kReverse ? kKeyedTileLen - int64_t{t + 1} * R : int64_t{t} * R);
  }
  // Element s of the thread's run in scan order, in memory.
  __device__ static int memory_of(int s) { return kReverse ? R - 1 - s : s; }
  __device__ bool whole() const { return valid == kKeyedTileLen; }
  // The tile's first element in scan order.
  __device__ int64_t lead() const { return kReverse ? first + valid - 1 : first; }

  // The warp's keys pass through shared memory (`stage`, kKeyedTileLen / 2
  // vectors a block): read straight, each thread's 128 bytes at 128 bytes
  // from the next thread's, every load touched 32 cache lines, and the L1
  // pipe ran nearly saturated. Read coalesced, written to shared memory
  // each thread's run together with its vectors' order rotated by the run
  // (no bank conflicts either way), read back by run.
  __device__ void load_keys(const Op& op, uint4* stage, int64_t (&keys)[R]) const {
    constexpr int V = R / 2;  // a run's vectors of keys
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    // The warp's runs in memory, the lowest first.
    const int64_t lowest = first + (kReverse ? kKeyedTileLen - int64_t{warp + 1} * 32 * R
                                             : int64_t{warp} * 32 * R);
    const uint4* src = reinterpret_cast<const uint4*>(op.indices + base + lowest);
    uint4* mine = stage + warp * 32 * V;
    const auto slot = [](int runs_before, int j) { return runs_before * V + (j ^ (runs_before % V)); };
    uint4 u[V];
#pragma unroll
    for (int v = 0; v < V; ++v) u[v] = src[v * 32 + lane];
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int n = v * 32 + lane;
      mine[slot(n / V, n % V)] = u[v];
    }
    __syncwarp();
    const int own = kReverse ? 31 - lane : lane;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const uint4 w = mine[slot(own, j)];
      memcpy(keys + 2 * j, &w, 16);
    }
  }

  __device__ void load(const Op& op, uint4* stage, State (&x)[R]) const {
    if (whole()) {
      int64_t keys[R];
      T dy[R];
      const uint4* d = reinterpret_cast<const uint4*>(op.dy + base + run);
      load_keys(op, stage, keys);
#pragma unroll
      for (int v = 0; v < R / kPerVector; ++v) {
        const uint4 u = d[v];
        memcpy(dy + v * kPerVector, &u, 16);
      }
#pragma unroll
      for (int s = 0; s < R; ++s) {
        x[s] = {static_cast<Pos>(keys[memory_of(s)]), to_acc<Acc>(dy[memory_of(s)])};
      }
      return;
    }
#pragma unroll
    for (int s = 0; s < R; ++s) {
      const int64_t m = run + memory_of(s);
      x[s] = m < first + valid ? op.load(base + m, m) : op.identity();
    }
  }

  // out[e] is memory element e of the thread's run.
  __device__ void store(const Op& op, const Acc (&out)[R]) const {
    T raw[R];
#pragma unroll
    for (int e = 0; e < R; ++e) raw[e] = from_acc<T>(out[e]);
    if (whole()) {
      uint4* d = reinterpret_cast<uint4*>(op.dx + base + run);
#pragma unroll
      for (int v = 0; v < R / kPerVector; ++v) {
        uint4 u;
        memcpy(&u, raw + v * kPerVector, 16);
        d[v] = u;
      }
      return;
    }
#pragma unroll
    for (int e = 0; e < R; ++e) {
      if (run + e < first + valid) op.dx[base + run + e] = raw[e];
    }
  }
};

// Block g scans tile g of the rows' tiles (row-major, memory order) from the
// identity, writes its gradient and its record.
template <typename Op, bool kReverse>
__global__ void __launch_bounds__(kScanBlock)
    keyed_tiles_kernel(Op op, int64_t len, int64_t tiles, KeyedRecordOf<Op>* records) {
  using Tile = KeyedTile<Op, kReverse>;
  using State = StateOf<Op>;
  using Acc = typename Tile::Acc;
  using Pos = typename Tile::Pos;
  constexpr int R = kKeyedRunLen;
  __shared__ typename BlockTotalsScan<Op>::TempStorage scratch;
  __shared__ uint4 key_stage[kKeyedTileLen / 2];
  const int64_t g = blockIdx.x;
  const Tile tile(len, tiles, g);
  State x[R];
  tile.load(op, key_stage, x);
  // Every thread reads the leading key itself (one broadcast load) rather
  // than wait for thread 0 to share it.
  const int64_t lead_key = op.indices[tile.base + tile.lead()];
  const bool lead_inside = lead_key >= tile.first && lead_key < tile.first + tile.valid;

  State mine = op.identity();
#pragma unroll
  for (int s = 0; s < R; ++s) mine = op.combine(mine, x[s]);
  State before, total;
  BlockTotalsScan<Op>::exclusive(scratch, op, mine, before, total);

  KeyedRecordOf<Op>& record = records[g];
  Acc out[R];
  State run = before;
#pragma unroll
  for (int s = 0; s < R; ++s) {
    run = op.combine(run, x[s]);
    const int64_t m = tile.run + Tile::memory_of(s);
    const bool own = run.key == m;
    out[Tile::memory_of(s)] = own ? run.sum : Acc(0);
    if (own && m == lead_key) record.local = run.sum;
  }
  tile.store(op, out);
  if (threadIdx.x == 0) {
    record.total = total;
    record.fix_at = lead_inside ? static_cast<Pos>(lead_key) : Pos(-1);
  }
  grid_dependents_launch();
}

// Block `row` scans its row's tile totals in scan order, thread t a
// contiguous share of them, and rewrites each tile's leading-run end where
// the carry into the tile has that run's key.
template <typename Op, bool kReverse>
__global__ void __launch_bounds__(kScanBlock)
    keyed_fixup_kernel(Op op, int64_t len, int64_t tiles, const KeyedRecordOf<Op>* records) {
  using State = StateOf<Op>;
  using T = typename Op::Storage;
  __shared__ typename BlockTotalsScan<Op>::TempStorage scratch;
  grid_dependency_wait();  // for keyed_tiles_kernel's records and gradient
  const int64_t row = blockIdx.x;
  const KeyedRecordOf<Op>* rec = records + row * tiles;
  const int64_t share = (tiles + kScanBlock - 1) / kScanBlock;
  const int64_t i0 = threadIdx.x * share;
  const int64_t i1 = i0 + share < tiles ? i0 + share : tiles;
  // Tile i in scan order.
  const auto at = [&](int64_t i) -> const KeyedRecordOf<Op>& {
    return rec[kReverse ? tiles - 1 - i : i];
  };
  // The records are read kFixupBatch at a time, the first batch kept for
  // the second walk: one after another, each is a round trip to L2.
  KeyedRecordOf<Op> kept[kFixupBatch];
#pragma unroll
  for (int b = 0; b < kFixupBatch; ++b) {
    if (i0 + b < i1) kept[b] = at(i0 + b);
  }
  State mine = op.identity();
#pragma unroll
  for (int b = 0; b < kFixupBatch; ++b) {
    if (i0 + b < i1) mine = op.combine(mine, kept[b].total);
  }
  for (int64_t i = i0 + kFixupBatch; i < i1; i += kFixupBatch) {
    State t[kFixupBatch];
#pragma unroll
    for (int b = 0; b < kFixupBatch; ++b) t[b] = i + b < i1 ? at(i + b).total : op.identity();
#pragma unroll
    for (int b = 0; b < kFixupBatch; ++b) mine = op.combine(mine, t[b]);
  }
  State carry, unused;
  BlockTotalsScan<Op>::exclusive(scratch, op, mine, carry, unused);
  const auto fix = [&](const KeyedRecordOf<Op>& r) {
    if (r.fix_at >= 0 && carry.key == r.fix_at) {
      op.dx[row * len + r.fix_at] = from_acc<T>(carry.sum + r.local);
    }
    carry = op.combine(carry, r.total);
  };
#pragma unroll
  for (int b = 0; b < kFixupBatch; ++b) {
    if (i0 + b < i1) fix(kept[b]);
  }
  for (int64_t i = i0 + kFixupBatch; i < i1; i += kFixupBatch) {
    KeyedRecordOf<Op> r[kFixupBatch];
#pragma unroll
    for (int b = 0; b < kFixupBatch; ++b) {
      if (i + b < i1) r[b] = at(i + b);
    }
#pragma unroll
    for (int b = 0; b < kFixupBatch; ++b) {
      if (i + b < i1) fix(r[b]);
    }
  }
}

// Whether the keyed long rows take an op's rows: cummax / cummin backward,
// dy, indices and dx 16-byte aligned and every row starting so (a row of a
// multiple of 8 elements spans whole vectors of keys and of any float type).
template <typename Op>
bool keyed_rows_fit(const Op& op, const ScanShape& s) {
  if constexpr (IsExtremeBackward<Op>::value) {
    return arrays_aligned16<true>(op, 0) && (s.outer == 1 || s.len % 8 == 0);
  } else {
    (void)op, (void)s;
    return false;
  }
}

template <typename Op>
KernelStatus launch_keyed_rows(const Op& op, const ScanShape& s, bool reverse,
                               const ScanWorkspace& workspace, cudaStream_t stream) {
  if constexpr (IsExtremeBackward<Op>::value) {
    static_assert(sizeof(KeyedRecordOf<Op>) <= kFlaggedSlotBytes,
                  "a record fits the long_rows slot of a tile of kTileLen");
    const int64_t tiles = ceil_div(s.len, kKeyedTileLen);
    KernelStatus st = KernelStatus::ok();
    void* words = nullptr;
    if (!workspace.take(words, st)) return st;
    auto* records = static_cast<KeyedRecordOf<Op>*>(words);
    const auto launch_both = [&](auto tiles_kernel, auto fixup_kernel) {
      const unsigned grid = static_cast<unsigned>(s.outer * tiles);
      tiles_kernel<<<grid, kScanBlock, 0, stream>>>(op, s.len, tiles, records);
      KernelStatus launched = launch_status();
      if (!launched.is_ok()) return launched;
      // Programmatic: the fix-up is resident by the time the tiles finish.
      const bool programmatic =
          kernel_compiled_for_sm90(tiles_kernel) && kernel_compiled_for_sm90(fixup_kernel);
      return launch_kernel(fixup_kernel, dim3(static_cast<unsigned>(s.outer)), dim3(kScanBlock),
                           0, stream, programmatic, op, s.len, tiles,
                           static_cast<const KeyedRecordOf<Op>*>(records));
    };
    return reverse ? launch_both(keyed_tiles_kernel<Op, true>, keyed_fixup_kernel<Op, true>)
                   : launch_both(keyed_tiles_kernel<Op, false>, keyed_fixup_kernel<Op, false>);
  } else {
    (void)op, (void)s, (void)reverse, (void)workspace, (void)stream;
    return KernelStatus::invalid("scan: no keyed rows for this op");
  }
}

}  // namespace scan
}  // namespace baracuda
