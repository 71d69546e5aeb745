// Rows of at most kRowGroupMaxLen elements (scan_plan.h), a group of lanes
// each: a group of G lanes (a power of two, 2 to 32) holds kRowGroupItems
// consecutive elements a lane, so a row that fits is one load, one scan
// across the group by shuffles, one store -- no shared memory, no barrier,
// and no lane idles for want of elements beyond rounding to a power of two.
// Longer rows (up to kRowGroupMaxLen) are walked by a whole warp in chunks,
// carrying the prefix. A block per row (the rows kernel) would
// leave all but len / 8 of its 256 threads idle on such rows, and a thread
// per row makes every load instruction touch 32 rows. Generic over the ops:
// the per-thread runs of the columns path (load_run / store_run). Included
// by scan.cu alone. No torch headers.
#pragma once

#include <cub/util_ptx.cuh>

#include <algorithm>
#include <cstdint>

#include "common/cuda_launch.cuh"
#include "scan/scan_block.cuh"
#include "scan/scan_plan.h"

namespace baracuda {
namespace scan {

constexpr int kRowGroupBlock = 128;

// Consecutive elements a lane holds: 16 bytes of the input (8 two-byte, 4
// four-byte, 2 eight-byte). A lane's loads are one element each, and every
// load instruction of a warp asks L2 again for the sectors its lanes' runs
// span, so longer runs ask for the same bytes more often: on H100, 8 float32
// elements a lane took a [1048576, 16] cumsum 155 us, where 8 bfloat16 (16
// bytes, the same count of elements) took 43.
template <typename Op>
constexpr int kRowGroupItems =
    std::max(2, std::min(kScanItems, int(16 / sizeof(typename Op::Storage))));

// Rows first_row, first_row + 1, ... of a warp go to its groups in order; a
// warp's groups stay in the loop together (the shuffles need every lane),
// those past the last row loading and storing nothing.
template <typename Op, int kGroup>
__global__ void __launch_bounds__(kRowGroupBlock)
    row_groups_kernel(Op op, int64_t outer, int64_t len, bool reverse) {
  using State = StateOf<Op>;
  constexpr unsigned kAll = 0xffffffffu;
  constexpr int64_t kRowsPerWarp = 32 / kGroup;
  constexpr int kItems = kRowGroupItems<Op>;
  constexpr int64_t kChunk = int64_t{kGroup} * kItems;
  const int slot = threadIdx.x % kGroup;
  const int64_t group_in_warp = (threadIdx.x % 32) / kGroup;
  const int64_t warp = (int64_t{blockIdx.x} * kRowGroupBlock + threadIdx.x) / 32;
  const int64_t warps = int64_t{gridDim.x} * (kRowGroupBlock / 32);
  for (int64_t first_row = warp * kRowsPerWarp; first_row < outer;
       first_row += warps * kRowsPerWarp) {
    const int64_t row = first_row + group_in_warp;
    const bool active = row < outer;
    const Line line{active ? row * len : 0, 1, len, reverse};
    const int64_t p_end = active ? len : 0;
    State carry = op.identity();
    for (int64_t chunk = 0; chunk < len; chunk += kChunk) {
      const int64_t first = chunk + int64_t{slot} * kItems;
      State items[kItems];
      State incl = load_run(op, line, first, p_end, items);
      warp_inclusive_by_joins<kGroup>(op, incl);
      State before = cub::ShuffleUp<kGroup>(incl, 1, 0, kAll);
      if (slot == 0) before = op.identity();
      store_run(op, line, first, p_end, op.combine(carry, before), items);
      carry = op.combine(carry, cub::ShuffleIndex<kGroup>(incl, kGroup - 1, kAll));
    }
  }
}

template <typename Op, int kGroup>
KernelStatus launch_row_groups_of(const Op& op, const ScanShape& s, bool reverse,
                                  cudaStream_t stream) {
  const int64_t rows_per_block = kRowGroupBlock / kGroup;
  const int64_t blocks = std::min(ceil_div(s.outer, rows_per_block), kMaxBlocks);
  row_groups_kernel<Op, kGroup>
      <<<static_cast<unsigned>(blocks), kRowGroupBlock, 0, stream>>>(op, s.outer, s.len, reverse);
  return launch_status();
}

// The smallest group whose lanes hold a row (two lanes at least; a warp,
// walking the row in chunks, for longer rows).
template <typename Op>
KernelStatus launch_row_groups(const Op& op, const ScanShape& s, bool reverse,
                               cudaStream_t stream) {
  const int64_t lanes = ceil_div(s.len, int64_t{kRowGroupItems<Op>});
  if (lanes <= 2) return launch_row_groups_of<Op, 2>(op, s, reverse, stream);
  if (lanes <= 4) return launch_row_groups_of<Op, 4>(op, s, reverse, stream);
  if (lanes <= 8) return launch_row_groups_of<Op, 8>(op, s, reverse, stream);
  if (lanes <= 16) return launch_row_groups_of<Op, 16>(op, s, reverse, stream);
  return launch_row_groups_of<Op, 32>(op, s, reverse, stream);
}

}  // namespace scan
}  // namespace baracuda
