// The strip_tiles path of the CUDA scan engine (scan_plan.h): the strips'
// step (scan_strips.cuh) as a tile of its own. A block takes one tile of
// one strip -- kStripWidth columns of one outer index (a lane per column),
// kWarps * kStripTileRows positions of the axis (a warp per
// kStripTileRows: a strip step's kStripRows, or twice as many in long
// tiles) -- folds it, publishes its per-column totals, folds the earlier
// tiles' totals of its strip into its carry and scans its tile from there,
// as the strips' walk would at that step. For shapes with too few strips to fill
// the GPU with a block each, where column_tiles would chain tiles of 16
// positions a thread per column. Included by scan_launch.cuh alone. No torch
// headers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/hopper.cuh"
#include "scan/scan_block.cuh"
#include "scan/scan_plan.h"
#include "scan/scan_publish.cuh"
#include "scan/scan_strips.cuh"
#include "scan/scan_slots_launch.cuh"
#include "scan/scan_tuning.cuh"

namespace baracuda {
namespace scan {

// Positions of a tile.
template <typename Op, bool kLong>
constexpr int64_t kStripTileLen = int64_t{kStripBlock / 32} * kStripTileRows<Op, kLong>;

static_assert(kStripTileMinLen == (kStripBlock / 32) * 4,
              "the plan sizes the workspace for steps of at least four positions a warp");
static_assert(kMaxStripTiles <= kStripBlock, "a thread waits for each earlier tile");

// Tiles take tickets tile-major (every strip's tile 0, then every strip's
// tile 1, ...), so a tile waits only for smaller tickets: blocks already
// running, whatever order the hardware starts them in. Tile t of strip b
// publishes its totals at slots (t * strips + b) * kStripWidth + lane,
// behind flag t * strips + b. A tile's carry is the in-order fold of the
// earlier tiles' totals of its strip, read eight at a time: the same
// association whatever the timing, so bit-identical run to run.
template <typename Op, bool kLong>
__global__ void __launch_bounds__(kStripBlock, kStripTileBlocksPerSm<Op, kLong>)
    strip_tiles_kernel(Op op, ScanShape s, bool reverse, int64_t strips_per_outer,
                       TileSlots<TotalOf<Op>> ws) {
  using State = StateOf<Op>;
  using Total = TotalOf<Op>;
  using Aux = AuxOf<Op>;
  constexpr int K = kStripTileRows<Op, kLong>;
  static_assert(K >= 4, "the plan's workspace holds steps of four positions a warp or more");
  static_assert(sizeof(Total) <= kWorkspaceSlotBytes, "a total larger than a workspace slot");
  constexpr int kWarps = kStripBlock / 32;
  __shared__ Total totals[kWarps][kStripWidth];
  // Where only the last warp folds every total (kFoldEarlierWarpsOnly) it
  // leaves the next step's carry here; a tile has no next step.
  __shared__ Total next_carry[kStripWidth];
  grid_dependency_wait();  // for the slots (launch_on_slots)
  const int64_t strips = s.outer * strips_per_outer;
  const int64_t ticket = take_ticket_and_rewind(ws.counter);
  const int64_t tile = ticket / strips;
  const int64_t strip = ticket - tile * strips;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int64_t o = strip / strips_per_outer;
  const int64_t column = (strip - o * strips_per_outer) * kStripWidth + lane;
  // Lanes past the last column load and store nothing but keep step with
  // the barriers.
  const int64_t p_end = column < s.inner ? s.len : 0;
  const Line line{o * s.len * s.inner + column, s.inner, s.len, reverse};
  const int64_t first = tile * kStripTileLen<Op, kLong> + int64_t{warp} * K;

  State cur[K];
  Aux cur_aux[K];
  load_run(op, line, first, p_end, cur, cur_aux);
  RunMemoOf<Op> memo;
  totals[warp][lane] = fold_run(op, cur, memo);
  __syncthreads();
  const TotalsOf<Op> joins = totals_of(op);
  Total tile_total = joins.identity();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) tile_total = joins.combine(tile_total, totals[w][lane]);
  const int64_t slot = tile * strips + strip;
  publish_block(ws.tile_totals + slot * kStripWidth + lane, warp == 0, tile_total,
                ws.tile_flags + slot, ws.mark);

  wait_all(ws.tile_flags + strip, strips, tile, 0, ws.mark);
  __syncthreads();
  Total carry = fold_volatile<8>(joins, joins.identity(), ws.tile_totals + strip * kStripWidth + lane,
                                 strips * kStripWidth, tile);
  finish_strip_step(op, line, first, p_end, cur, cur_aux, memo, totals, lane, carry,
                    next_carry[lane]);
}

// Whether an op's strip tiles are long: where the op takes them and there
// are at least three for every two SMs; strip steps elsewhere. Long tiles
// ran faster at about two an SM, slower at one an SM or fewer.
template <typename Op>
bool long_strip_tiles_fit(const ScanShape& s, const ScanPlan& plan) {
  if constexpr (kLongStripTiles<Op>) {
    const int64_t long_tiles = s.outer * plan.strips_per_outer *
                               ceil_div(s.len, kStripTileLen<Op, true>);
    return 2 * long_tiles >= 3 * multiprocessors();
  } else {
    (void)s, (void)plan;
    return false;
  }
}

// The tiles of every strip along the axis, ceil(len / kStripTileLen), no
// more than the plan's workspace holds.
template <typename Op, bool kLong>
KernelStatus launch_strip_tiles_of(const Op& op, const ScanShape& s, const ScanPlan& plan,
                                   bool reverse, const ScanWorkspace& workspace,
                                   cudaStream_t stream) {
  const int64_t tiles = ceil_div(s.len, kStripTileLen<Op, kLong>);
  const int64_t strips = s.outer * plan.strips_per_outer;
  if (tiles > plan.tiles) return KernelStatus::invalid("scan: strip_tiles beyond its workspace");
  return launch_ticketed_tiles<TotalOf<Op>>(
      strip_tiles_kernel<Op, kLong>, dim3(static_cast<unsigned>(tiles * strips)),
      dim3(kStripBlock), workspace, plan.tile_ws, stream, op, s, reverse, plan.strips_per_outer);
}

template <typename Op>
KernelStatus launch_strip_tiles(const Op& op, const ScanShape& s, const ScanPlan& plan,
                                bool long_tiles, bool reverse, const ScanWorkspace& workspace,
                                cudaStream_t stream) {
  if constexpr (kLongStripTiles<Op>) {
    if (long_tiles) return launch_strip_tiles_of<Op, true>(op, s, plan, reverse, workspace, stream);
  }
  return launch_strip_tiles_of<Op, false>(op, s, plan, reverse, workspace, stream);
}

}  // namespace scan
}  // namespace baracuda
