// Rows of at most kRowGroupMaxLen elements (scan_plan.h), a group of lanes
// each: a group of G lanes (a power of two, 2 to 32) holds kRowGroupItems
// consecutive elements a lane, so a row that fits is one load, one scan
// across the group by shuffles, one store -- no barrier, and no lane idles
// for want of elements beyond rounding to a power of two. Longer rows (up to
// kRowGroupMaxLen) are walked by a whole warp in chunks, carrying the
// prefix. A block per row (the rows kernel) would leave all but len / 8 of
// its 256 threads idle on such rows, and a thread per row makes every load
// instruction touch 32 rows. Generic over the ops; how a lane's elements
// move depends on the op (GroupIo). Included by scan_launch.cuh alone. No torch
// headers.
#pragma once

#include <cub/util_ptx.cuh>
#include <cub/warp/warp_exchange.cuh>

#include <algorithm>
#include <cstdint>

#include "common/cuda_launch.cuh"
#include "scan/scan_block.cuh"
#include "scan/scan_plan.h"
#include "scan/scan_tuning.cuh"

namespace baracuda {
namespace scan {

// How a lane's run moves. Where its row lies so that runs are 16-byte
// vectors (whole_runs_fit) and the run ends before the row does:
// - kDirect (PlainIo ops): one vector in, one out (load_direct,
//   store_direct);
// - kWhole (kWholeRunIo ops): a vector per input in, one out
//   (fetch_whole_run, store_whole_run);
// - kWholeInExchangeOut (ops that read one array: cummax / cummin forward):
//   a vector in, and the outputs, an int64 index among them, through a warp
//   exchange, stored striped.
// - kIndexedGrad (kGradWithIndices ops of two-byte types: cummax / cummin
//   backward): the gradient in and out as vectors; the int64 indices loaded
//   striped, eight bytes a lane and instruction, and brought to their lanes
//   through a warp exchange, by every lane (the exchange needs them all).
// Elsewhere these go element by element (load_run, store_inclusive_run),
// where every load instruction of a warp asks L2 again for the sectors its
// lanes' runs span and every store writes part of each sector it touches.
// kExchange (the other ops: four- and eight-byte cummax / cummin backward)
// loads the states striped, element by element, and stores them so, through
// a warp exchange both ways, whatever the alignment. Measured on cummax
// backward: for float32 kExchange beat element by element and matched or
// beat kIndexedGrad; for bfloat16 it ran slower than element by element
// (striped two-byte accesses are 64 bytes a warp instruction), and
// kIndexedGrad fastest.
enum class GroupIo { kDirect, kWhole, kWholeInExchangeOut, kIndexedGrad, kExchange };

template <typename Op, typename = void>
struct HasGradWithIndices : std::false_type {};
template <typename Op>
struct HasGradWithIndices<Op, std::enable_if_t<Op::kGradWithIndices>> : std::true_type {};

template <typename Op>
constexpr GroupIo kGroupIo = HasPlainIo<Op>::value           ? GroupIo::kDirect
                             : HasWholeRunIo<Op>::value      ? GroupIo::kWhole
                             : ReadsOneArray<Op>::value      ? GroupIo::kWholeInExchangeOut
                             : HasGradWithIndices<Op>::value && sizeof(typename Op::Storage) == 2
                                 ? GroupIo::kIndexedGrad
                                 : GroupIo::kExchange;

// Shared memory of a row_groups block: a warp exchange per warp for the ops
// that use one (of states out, or of indices in), nothing otherwise.
template <typename Op, typename Item>
struct WarpExchangeShared {
  using Exchange = cub::WarpExchange<Item, kRowGroupItems<Op>>;
  typename Exchange::TempStorage exchange[kRowGroupBlock / 32];
};
template <typename Op, GroupIo = kGroupIo<Op>>
struct GroupShared {};
template <typename Op>
struct GroupShared<Op, GroupIo::kWholeInExchangeOut> : WarpExchangeShared<Op, StateOf<Op>> {};
template <typename Op>
struct GroupShared<Op, GroupIo::kExchange> : WarpExchangeShared<Op, StateOf<Op>> {};
template <typename Op>
struct GroupShared<Op, GroupIo::kIndexedGrad> : WarpExchangeShared<Op, int64_t> {};

// Whether a line's runs move as vectors: unit stride and, at the
// direction's anchor, every array the vectors touch 16-byte aligned (for
// kIndexedGrad the gradient in and out; the indices go striped).
template <GroupIo kIo, int kItems, typename Op>
__device__ bool group_vectors_fit(const Op& op, const Line& line) {
  if constexpr (kIo == GroupIo::kIndexedGrad) {
    const int64_t anchor = line.reverse ? line.base + line.len : line.base;
    return line.stride == 1 && reinterpret_cast<uintptr_t>(op.dy + anchor) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(op.dx + anchor) % 16 == 0;
  } else if constexpr (kIo == GroupIo::kExchange) {
    return false;
  } else {
    return whole_runs_fit<kItems>(op, line);
  }
}

// A lane's whole run in as vectors (kIndexedGrad: its indices, in scan
// order, from the exchange), and its inclusive states out (cummax / cummin
// forward store through the exchange instead).
template <GroupIo kIo, int kItems, typename Op>
__device__ void load_group_vectors(const Op& op, const Line& line, int64_t first,
                                   const int64_t (&indices)[kItems], StateOf<Op> (&items)[kItems],
                                   AuxOf<Op> (&aux)[kItems]) {
  if constexpr (kIo == GroupIo::kDirect) {
    load_direct(op, line, first, items);
  } else if constexpr (kIo == GroupIo::kWhole || kIo == GroupIo::kWholeInExchangeOut) {
    unpack_whole_run(op, line, first, fetch_whole_run<kItems>(op, line, first), items, aux);
  } else if constexpr (kIo == GroupIo::kIndexedGrad) {
    using T = typename Op::Storage;
    T dy[kItems];
    const uint4 u = *reinterpret_cast<const uint4*>(op.dy + whole_run_at<kItems>(line, first));
    memcpy(dy, &u, sizeof(u));
    if (line.reverse) reverse_run(dy);
    Op view = op;
    view.dy = dy;
    view.indices = indices;
    LineWalk w = LineWalk::from<kItems>(line, first, line.len);
#pragma unroll
    for (int k = 0; k < kItems; ++k, w.advance()) items[k] = view.load(k, w.l);
  }
}

template <GroupIo kIo, int kItems, typename Op>
__device__ void store_group_vectors(const Op& op, const Line& line, int64_t first,
                                    const StateOf<Op> (&incl)[kItems],
                                    const AuxOf<Op> (&aux)[kItems]) {
  if constexpr (kIo == GroupIo::kDirect) {
    store_direct(op, line, first, incl);
  } else if constexpr (kIo == GroupIo::kWhole || kIo == GroupIo::kIndexedGrad) {
    store_whole_run(op, line, first, incl, aux);
  }
}

// Where element e of a warp's chunk lies: the warp's lanes hold the chunk
// blocked (lane e / kItems), its groups one row each, so e is position
// chunk + e % kChunk of row first_row + e / kChunk. Calls f(k, offset, axis
// position) for the elements a lane holds striped (e = k * 32 + lane), those
// of rows and positions that exist.
template <int kItems, int64_t kChunk, typename F>
__device__ void for_each_striped(int64_t first_row, int64_t outer, int64_t chunk, int64_t len,
                                 bool reverse, F&& f) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int64_t e = int64_t{k} * 32 + lane;
    const int64_t r = first_row + e / kChunk;
    const int64_t p = chunk + e % kChunk;
    if (r < outer && p < len) {
      const int64_t l = reverse ? len - 1 - p : p;
      f(k, r * len + l, l);
    }
  }
}

// Rows first_row, first_row + 1, ... of a warp go to its groups in order; a
// warp's groups stay in the loop together (the shuffles and the exchange
// need every lane), those past the last row loading and storing nothing.
// Each lane folds its run (fold_run: an op's own run scan where it has
// one), the group scans the runs' totals by shuffles, and the lane scans
// its run from its prefix (scan_thread_run), as a rows block does.
template <typename Op, int kGroup>
__global__ void __launch_bounds__(kRowGroupBlock)
    row_groups_kernel(Op op, int64_t outer, int64_t len, bool reverse) {
  using State = StateOf<Op>;
  using Total = TotalOf<Op>;
  constexpr GroupIo kIo = kGroupIo<Op>;
  constexpr int64_t kRowsPerWarp = 32 / kGroup;
  constexpr int kItems = kRowGroupItems<Op>;
  constexpr int64_t kChunk = int64_t{kGroup} * kItems;
  const TotalsOf<Op> totals = totals_of(op);
  __shared__ GroupShared<Op> shared;
  const int slot = threadIdx.x % kGroup;
  const int64_t group_in_warp = (threadIdx.x % 32) / kGroup;
  const int64_t warp = (int64_t{blockIdx.x} * kRowGroupBlock + threadIdx.x) / 32;
  const int64_t warps = int64_t{gridDim.x} * (kRowGroupBlock / 32);
  const auto exchange = [&]() {
    if constexpr (kIo != GroupIo::kDirect && kIo != GroupIo::kWhole) {
      return typename GroupShared<Op>::Exchange(shared.exchange[threadIdx.x / 32]);
    }
  };
  for (int64_t first_row = warp * kRowsPerWarp; first_row < outer;
       first_row += warps * kRowsPerWarp) {
    const int64_t row = first_row + group_in_warp;
    const bool active = row < outer;
    const Line line{active ? row * len : 0, 1, len, reverse};
    const int64_t p_end = active ? len : 0;
    const bool whole_rows = active && group_vectors_fit<kIo, kItems>(op, line);
    Total carry = totals.identity();
    for (int64_t chunk = 0; chunk < len; chunk += kChunk) {
      const int64_t first = chunk + int64_t{slot} * kItems;
      const bool whole = whole_rows && first + kItems <= len;
      State items[kItems];
      AuxOf<Op> aux[kItems];
      int64_t indices[kItems] = {};
      if constexpr (kIo == GroupIo::kIndexedGrad) {
        for_each_striped<kItems, kChunk>(first_row, outer, chunk, len, reverse,
                                         [&](int k, int64_t off, int64_t) {
                                           indices[k] = op.indices[off];
                                         });
        exchange().StripedToBlocked(indices, indices);
        __syncwarp();
      }
      if constexpr (kIo == GroupIo::kExchange) {
#pragma unroll
        for (int k = 0; k < kItems; ++k) items[k] = op.identity();
        for_each_striped<kItems, kChunk>(first_row, outer, chunk, len, reverse,
                                         [&](int k, int64_t off, int64_t l) {
                                           items[k] = op.load(off, l);
                                         });
        exchange().StripedToBlocked(items, items);
        __syncwarp();
      } else if (whole) {
        load_group_vectors<kIo>(op, line, first, indices, items, aux);
      } else {
        load_run(op, line, first, p_end, items);
      }
      // Positions past the row's end hold the identity, so they may be
      // folded in.
      RunMemoOf<Op> memo;
      Total incl = fold_run(op, items, memo);
      warp_inclusive_by_joins<kGroup>(totals, incl);
      Total before = shuffle_up<kGroup>(incl, 1);
      if (slot == 0) before = totals.identity();
      scan_thread_run(op, totals.combine(carry, before), items, memo);
      carry = totals.combine(carry, shuffle_index<kGroup>(incl, kGroup - 1));
      if constexpr (kIo == GroupIo::kWholeInExchangeOut || kIo == GroupIo::kExchange) {
        exchange().BlockedToStriped(items, items);
        for_each_striped<kItems, kChunk>(first_row, outer, chunk, len, reverse,
                                         [&](int k, int64_t off, int64_t l) {
                                           op.store(off, l, items[k]);
                                         });
        // The next chunk's exchange reuses the warp's shared memory.
        __syncwarp();
      } else if (whole) {
        store_group_vectors<kIo>(op, line, first, items, aux);
      } else {
        store_inclusive_run(op, line, first, p_end, items);
      }
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
