// CUDA engine of the scan family: the functors of scan_ops.h run over one of
// the paths of scan_plan.h. Every path combines in a fixed order that does
// not depend on timing, so results are bit-identical run to run. The only
// atomics are the tile tickets and ready flags of long_rows, strip_tiles and
// column_tiles: they order the work, never a value.
//
// Included only by the parts of the CUDA scans (scan_cuda_parts.h), each of
// which instantiates scan_cuda for one storage type and direction. The
// kernels sit in an unnamed namespace, so every part compiles the ones its
// ops launch and no others.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "common/cuda_launch.cuh"
#include "common/standing_slots.h"
#include "common/tensor_map.h"
#include "common/zeroed_launch.cuh"
#include "scan/scan_block.cuh"
#include "scan/scan_cuda_parts.h"
#include "scan/scan_dispatch.h"
#include "scan/scan_kernels.h"
#include "scan/scan_keyed_rows.cuh"
#include "scan/scan_plan.h"
#include "scan/scan_publish.cuh"
#include "scan/scan_row_groups.cuh"
#include "scan/scan_staged_cumprod_grad.cuh"
#include "scan/scan_staged_extremes.cuh"
#include "scan/scan_staged_logcumsumexp_grad.cuh"
#include "scan/scan_staged_rows.cuh"
#include "scan/scan_staged_swizzled_grad.cuh"
#include "scan/scan_staged_swizzled_runs.cuh"
#include "scan/scan_strip_tiles.cuh"
#include "scan/scan_strips.cuh"
#include "scan/scan_slots_launch.cuh"
#include "scan/scan_tuning.cuh"
#include "scan/scan_warp_rows.cuh"

namespace baracuda {
namespace {

using namespace scan;

// ---------------------------------------------------------------- rows path

template <typename Op>
__global__ void __launch_bounds__(kScanBlock, kRowsBlocksPerSm<Op>)
    rows_kernel(Op op, int64_t outer, int64_t len, bool reverse) {
  using State = StateOf<Op>;
  using Total = TotalOf<Op>;
  const TotalsOf<Op> totals = totals_of(op);
  __shared__ RowShared<Op> shared;
  for (int64_t row = blockIdx.x; row < outer; row += gridDim.x) {
    const Line line{row * len, 1, len, reverse};
    // `carry` (the same in every thread) chains the chunks of the row.
    Total carry = totals.identity();
    if constexpr (kMayGoDirect<Op>) {
      if (whole_runs_fit<kScanItems>(op, line)) {
        // Direct runs hold a thread's 16 bytes in 8 registers: the next
        // chunk's are loaded before this one is scanned, so twice as many
        // bytes are in flight.
        const int64_t lead = int64_t{threadIdx.x} * kScanItems;
        State cur[kScanItems], next[kScanItems];
        load_direct(op, line, lead, cur);
        for (int64_t chunk = 0; chunk < len; chunk += kRowChunk) {
          const bool more = chunk + kRowChunk < len;
          if (more) load_direct(op, line, chunk + kRowChunk + lead, next);
          scan_blocked(op, cur, shared, carry);
          store_direct(op, line, chunk + lead, cur);
          if (more) {
#pragma unroll
            for (int k = 0; k < kScanItems; ++k) cur[k] = next[k];
          }
        }
        continue;
      }
    }
    if constexpr (kMayLoadDirect<Op>) {
      if (chunks_go_direct(op, line)) {
        // A whole run is 16 bytes per input array, 4 registers each: the
        // next chunk's are fetched before this one is scanned. Runs loaded
        // whole ran faster than striped loads, and faster again with the
        // fetch ahead; the backward ops nearly twice as fast.
        const int64_t lead = int64_t{threadIdx.x} * kScanItems;
        WholeRun<Op> next = fetch_whole_run<kScanItems>(op, line, lead);
        for (int64_t chunk = 0; chunk < len; chunk += kRowChunk) {
          const WholeRun<Op> cur = next;
          if (chunk + kRowChunk < len) {
            next = fetch_whole_run<kScanItems>(op, line, chunk + kRowChunk + lead);
          }
          ChunkRegs<Op> r;
          unpack_whole_run(op, line, chunk + lead, cur, r.blocked, r.aux);
          scan_blocked(op, r.blocked, shared, carry);
          store_chunk(op, line, chunk, true, r, shared);
        }
        continue;
      }
    }
    for (int64_t chunk = 0; chunk < len; chunk += kRowChunk) {
      scan_chunk(op, line, chunk, shared, carry);
    }
  }
}

// ---------------------------------------------------------------- long_rows path
// One pass (scan_plan.h): tile `tile` of row `row` covers scan positions
// [tile * len_t, (tile + 1) * len_t), len_t = kLongChunks<Op> chunks, held
// in registers and all loaded before any is scanned. One block scan, of the
// chunks' thread totals side by side, gives the tile's total; the tile's
// prefix is assembled from totals published by tiles with smaller tickets
// (tile_prefix), and then the chunks are scanned and stored.

template <typename Op>
constexpr int64_t kLongTileLen = kLongChunks<Op> * kRowChunk;

// The states of a tile's chunks side by side, scanned component-wise.
template <typename State, int kChunks>
struct ChunkStates {
  State chunk[kChunks];
};

template <typename Op>
using ChunkStatesOf = ChunkStates<TotalOf<Op>, kLongChunks<Op>>;

template <typename Op>
struct ChunkwiseCombine {
  using State = ChunkStatesOf<Op>;
  TotalsOf<Op> totals;
  __device__ State identity() const {
    State r;
#pragma unroll
    for (int c = 0; c < kLongChunks<Op>; ++c) r.chunk[c] = totals.identity();
    return r;
  }
  __device__ State combine(const State& a, const State& b) const {
    State r;
#pragma unroll
    for (int c = 0; c < kLongChunks<Op>; ++c) r.chunk[c] = totals.combine(a.chunk[c], b.chunk[c]);
    return r;
  }
};

template <typename Op>
using TileScanOf = BlockTotalsScan<ChunkwiseCombine<Op>>;

template <typename Op>
union LongRowsShared {
  RowShared<Op> rows;
  typename TileScanOf<Op>::TempStorage tile_scan;
};

// long_rows' slots, and the mark that says a slot's state is out.
template <typename Total>
struct MarkedLongRowsSlots {
  LongRowsSlots<Total> at;
  uint64_t mark;
};

template <typename Op>
__global__ void __launch_bounds__(kScanBlock, kLongRowsBlocksPerSm<Op>)
    long_rows_kernel(Op op, int64_t len, bool reverse, int64_t tiles, int64_t groups,
                     MarkedLongRowsSlots<TotalOf<Op>> slots) {
  using Total = TotalOf<Op>;
  const LongRowsSlots<Total>& ws = slots.at;
  const uint64_t mark = slots.mark;
  constexpr int kChunks = kLongChunks<Op>;
  const TotalsOf<Op> totals = totals_of(op);
  __shared__ LongRowsShared<Op> shared;
  grid_dependency_wait();  // for the slots (launch_on_slots)
  const int64_t ticket = take_ticket_and_rewind(ws.counter);
  const int64_t row = ticket / tiles;
  const int64_t tile = ticket - row * tiles;
  const int64_t first = tile * kLongTileLen<Op>;
  const Line line{row * len, 1, len, reverse};
  const bool direct = chunks_go_direct(op, line);
  ChunkRegs<Op> r[kChunks];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) load_chunk(op, line, first + c * kRowChunk, direct, r[c]);

  ChunkStatesOf<Op> mine, before, chunk_totals;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    arrange_chunk(direct, r[c], shared.rows);
    // Positions past the end hold the identity, so they may be folded in.
    mine.chunk[c] = fold_run(op, r[c].blocked, r[c].memo);
  }
  const ChunkwiseCombine<Op> chunkwise{totals};
  TileScanOf<Op>::exclusive(shared.tile_scan, chunkwise, mine, before, chunk_totals);
  Total tile_total = chunk_totals.chunk[0];
#pragma unroll
  for (int c = 1; c < kChunks; ++c) tile_total = totals.combine(tile_total, chunk_totals.chunk[c]);
  // Its barrier also frees the block scan's shared memory for the stores.
  Total run = tile_prefix(totals, tile_total, ws.tile_totals + row * tiles,
                          ws.group_totals + row * groups, tile, groups, mark);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    scan_thread_run(op, totals.combine(run, before.chunk[c]), r[c].blocked, r[c].memo);
    run = totals.combine(run, chunk_totals.chunk[c]);
    store_chunk(op, line, first + c * kRowChunk, direct, r[c], shared.rows);
  }
}

template <typename Op>
KernelStatus launch_long_rows(const Op& op, const ScanShape& s, bool reverse,
                              const ScanWorkspace& workspace, cudaStream_t stream) {
  using Total = TotalOf<Op>;
  const int64_t tiles = ceil_div(s.len, kLongTileLen<Op>);
  const int64_t groups = ceil_div(tiles, kGroupTiles);
  const unsigned grid = static_cast<unsigned>(s.outer * tiles);
  return launch_on_slots(
      StandingKind::kFlaggedWords, long_rows_slot_bytes<Total>(s.outer, tiles, groups), 0,
      workspace,
      [&](void* words, void*, uint64_t mark) {
        return MarkedLongRowsSlots<Total>{long_rows_slots<Total>(words, s.outer, tiles, groups),
                                          mark};
      },
      long_rows_kernel<Op>, dim3(grid), dim3(kScanBlock), stream, op, s.len, reverse, tiles,
      groups);
}

// The staged tiles an op takes (scan_staged_rows.cuh): one array whole
// (kStagedRowsApply), values and positions (kStagedExtremesApply), cumprod's
// gradient (kStagedCumprodGradApply), logcumsumexp's
// (kStagedLogcumsumexpGradApply), or none.
template <typename Op, bool kReverse>
using StagedTilesOf = std::conditional_t<
    kStagedRowsApply<Op>, StagedPlainTiles<Op, kReverse>,
    std::conditional_t<
        kStagedExtremesApply<Op>, StagedExtremeTiles<Op, kReverse>,
        std::conditional_t<
            kStagedCumprodGradApply<Op>, StagedCumprodGradTiles<Op, kReverse>,
            std::conditional_t<kStagedLogcumsumexpGradApply<Op>,
                               StagedLogcumsumexpGradTiles<Op, kReverse>, void>>>>;

// One staged launch over `rows` rows of tiles_of's tiles. Their tiles are at
// least long_rows' shortest, so the long_rows workspace holds their slots.
template <typename Tiles>
KernelStatus launch_staged_tiles(const Tiles& tiles_of, int64_t rows,
                                 const ScanWorkspace& workspace, cudaStream_t stream,
                                 const TensorMapsOf<Tiles>& maps = TensorMapsOf<Tiles>{}) {
  using Total = typename Tiles::Total;
  constexpr int kSharedBytes = staged_dynamic_shared_bytes<Tiles>();
  constexpr int64_t kBlockBytes = staged_block_shared_bytes<Tiles>(staged_early_reads<Tiles>());
  static_assert(Tiles::kBlocksPerSm * kBlockBytes <= kStagedSharedBytesPerSm,
                "the tiles' shared memory does not let kBlocksPerSm blocks onto an SM");
  const auto kernel = staged_rows_kernel<Tiles>;
  int64_t groups = ceil_div(tiles_of.tiles, kGroupTiles);
  const int64_t slot_bytes = long_rows_slot_bytes<Total>(rows, tiles_of.tiles, groups);
  // The stages and the block's own shared memory pass the 48 KiB a block
  // gets unasked; the blocks an SM holds (Tiles::kBlocksPerSm) need most of
  // its shared memory.
  KernelStatus st = to_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
  if (st.is_ok()) {
    st = to_status(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
  }
  if (!st.is_ok()) return st;
  const int64_t resident = resident_capacity(kernel, kScanBlock, kSharedBytes);
  // The stream's standing slots where it has them (no workspace is
  // allocated); else the workspace, zeroed by a memset rather than
  // launch_behind_zeroing: a cooperative launch does not start early
  // behind a kernel (as fast with either), and a plain one that did
  // (slightly faster) could not promise that every block is resident,
  // which the tiles striped by block index need.
  StandingLease lease;  // held until the launch is queued
  uint64_t mark = kZeroedSlotsMark;
  void* slot_words = nullptr;
  if (lease_standing_slots(stream, StandingKind::kFlaggedWords, slot_bytes, 0, lease)) {
    slot_words = lease.slots;
    mark = lease.mark;
  } else {
    if (!workspace.take(slot_words, st)) return st;
    st = to_status(cudaMemsetAsync(slot_words, 0, static_cast<size_t>(slot_bytes), stream));
    if (!st.is_ok()) return st;
  }
  LongRowsSlots<Total> slots = long_rows_slots<Total>(slot_words, rows, tiles_of.tiles, groups);
  const unsigned grid = static_cast<unsigned>(std::min(rows * tiles_of.tiles, resident));
  Tiles args_tiles = tiles_of;
  TensorMapsOf<Tiles> args_maps = maps;
  void* args[] = {&args_tiles, &rows, &groups, &slots, &mark, &args_maps};
  // Cooperative: a tile may wait for a tile of any block, so every block
  // must be resident at once.
  return to_status(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(grid),
                                               dim3(kScanBlock), args, kSharedBytes, stream));
}

// [rows][len] elements of T as [rows][lines][128] bytes for the tensor copy
// engine, a box being `box_lines` lines of one row, with the 128-byte
// swizzle. Needs `base` 16-byte aligned and the rows whole lines.
template <typename T>
bool encode_swizzled_rows(CUtensorMap* map, const void* base, int64_t len, int64_t rows,
                          int box_lines) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const int64_t row_bytes = len * int64_t{sizeof(T)};
  const cuuint64_t sizes[3] = {static_cast<cuuint64_t>(kSwizzleLineBytes),
                               static_cast<cuuint64_t>(row_bytes / kSwizzleLineBytes),
                               static_cast<cuuint64_t>(rows)};
  const cuuint64_t byte_strides[2] = {static_cast<cuuint64_t>(kSwizzleLineBytes),
                                      static_cast<cuuint64_t>(row_bytes)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(kSwizzleLineBytes),
                             static_cast<cuuint32_t>(box_lines), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(base), sizes,
             byte_strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

// Shared memory the current device lets one block have (opted in).
inline int64_t block_shared_limit() {
  return remembered(current_device(), [] {
    int bytes = 0;
    cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, current_device());
    return int64_t{bytes};
  });
}

// Whether swizzled tiles Forward (of element type T) take the rows of
// [outer, len]: rows of whole 128-byte lines, tiles for at least one block
// an SM, a device that lets a block hold their stages (about 100 KiB:
// compute capability 9.0 parts give a block 227, some others about 100),
// and a driver that describes tensor maps. The caller has checked the rest
// of the staged rows' conditions. Fewer, larger tiles leave SMs idle: with
// fewer tiles than SMs the swizzled tiles ran slower than the unswizzled
// ones, with about two an SM faster.
template <typename T, typename Forward>
bool swizzled_tiles_fit(const ScanShape& s) {
  if (s.len * int64_t{sizeof(T)} % kSwizzleLineBytes != 0) return false;
  if (s.outer * ceil_div(s.len, Forward::kTileLen) < multiprocessors()) return false;
  return block_shared_limit() >= staged_block_shared_bytes<Forward>(staged_early_reads<Forward>()) &&
         tensor_map_encoder() != nullptr;
}

// One launch of swizzled tiles (Forward and Backward: the two scan
// directions), their maps filled by encode_maps.
template <typename Forward, typename Backward, typename Op, typename EncodeMaps>
KernelStatus launch_swizzled_tiles(const Op& op, const ScanShape& s, bool reverse,
                                   const ScanWorkspace& workspace, cudaStream_t stream,
                                   EncodeMaps&& encode_maps) {
  const int64_t tiles = ceil_div(s.len, Forward::kTileLen);
  typename Forward::Maps maps;
  if (!encode_maps(maps)) {
    return KernelStatus::invalid("scan: the driver could not describe the rows' tensor maps");
  }
  return reverse ? launch_staged_tiles(Backward{op, s.len, tiles}, s.outer, workspace, stream, maps)
                 : launch_staged_tiles(Forward{op, s.len, tiles}, s.outer, workspace, stream, maps);
}

// Two-byte logcumsumexp backward's swizzled tiles
// (StagedSwizzledGradTiles under StagedLogcumsumexpGradTiles).
template <typename Op, bool kReverse>
using SwizzledGradTilesOf =
    StagedLogcumsumexpGradTiles<Op, kReverse, StagedSwizzledGradTiles<Op, kReverse, 1>>;

template <typename Op>
constexpr bool kSwizzledRunsApply = kStagedRowsApply<Op> && kStagedRuns<Op>;
template <typename Op>
constexpr bool kSwizzledGradApply =
    kStagedLogcumsumexpGradApply<Op> && sizeof(typename Op::Storage) == 2;

// The run layout's staged tiles (logcumsumexp forward) on swizzled stages,
// StagedSwizzledRunTiles.
template <typename Op>
KernelStatus launch_swizzled_runs(const Op& op, const ScanShape& s, bool reverse,
                                  const ScanWorkspace& workspace, cudaStream_t stream) {
  if constexpr (kSwizzledRunsApply<Op>) {
    using T = typename Op::Storage;
    using Forward = StagedSwizzledRunTiles<Op, false>;
    return launch_swizzled_tiles<Forward, StagedSwizzledRunTiles<Op, true>>(
        op, s, reverse, workspace, stream, [&](SwizzledRowMaps& maps) {
          return encode_swizzled_rows<T>(&maps.src, op.src, s.len, s.outer, Forward::kLines) &&
                 encode_swizzled_rows<T>(&maps.dst, op.dst, s.len, s.outer, Forward::kLines);
        });
  } else {
    (void)op, (void)s, (void)reverse, (void)workspace, (void)stream;
    return KernelStatus::invalid("scan: no swizzled runs for this op");
  }
}

// Two-byte logcumsumexp backward on swizzled stages.
template <typename Op>
KernelStatus launch_swizzled_grad(const Op& op, const ScanShape& s, bool reverse,
                                  const ScanWorkspace& workspace, cudaStream_t stream) {
  if constexpr (kSwizzledGradApply<Op>) {
    using T = typename Op::Storage;
    using Forward = SwizzledGradTilesOf<Op, false>;
    return launch_swizzled_tiles<Forward, SwizzledGradTilesOf<Op, true>>(
        op, s, reverse, workspace, stream, [&](SwizzledGradMaps& maps) {
          // The staged inputs, dy and y, in input order; x is read by the scan.
          return encode_swizzled_rows<T>(&maps.staged[0], op.dy, s.len, s.outer,
                                         Forward::kLines) &&
                 encode_swizzled_rows<T>(&maps.staged[1], op.y, s.len, s.outer,
                                         Forward::kLines) &&
                 encode_swizzled_rows<T>(&maps.dx, op.dx, s.len, s.outer, Forward::kLines);
        });
  } else {
    (void)op, (void)s, (void)reverse, (void)workspace, (void)stream;
    return KernelStatus::invalid("scan: no swizzled gradient tiles for this op");
  }
}

// The staged kernel that takes an op's long rows, or kNone: the op
// (StagedTilesOf), every array and every row starting 16 bytes aligned, the
// kernel compiled for compute capability 9.0 or more (the bulk copy
// engine), and so running on such a device; swizzled stages where those
// fit.
template <typename Op>
ScanKernel staged_rows_choice(const Op& op, const ScanShape& s, bool reverse) {
  if constexpr (!std::is_void<StagedTilesOf<Op, false>>::value) {
    using T = typename Op::Storage;
    // Compiled for an older target (and run from its PTX), the kernel's
    // body is compiled out.
    const bool compiled =
        reverse ? kernel_compiled_for_sm90(staged_rows_kernel<StagedTilesOf<Op, true>>)
                : kernel_compiled_for_sm90(staged_rows_kernel<StagedTilesOf<Op, false>>);
    if (!arrays_aligned16<true>(op, 0) ||
        (s.outer > 1 && s.len * int64_t{sizeof(T)} % 16 != 0) || !compiled) {
      return ScanKernel::kNone;
    }
    if constexpr (kSwizzledRunsApply<Op>) {
      if (swizzled_tiles_fit<T, StagedSwizzledRunTiles<Op, false>>(s)) {
        return ScanKernel::kSwizzledRuns;
      }
    }
    if constexpr (kSwizzledGradApply<Op>) {
      if (swizzled_tiles_fit<T, SwizzledGradTilesOf<Op, false>>(s)) {
        return ScanKernel::kSwizzledLogcumsumexpGrad;
      }
    }
    return kStagedRowsApply<Op>             ? ScanKernel::kStagedRows
           : kStagedExtremesApply<Op>       ? ScanKernel::kStagedExtremes
           : kStagedCumprodGradApply<Op>    ? ScanKernel::kStagedCumprodGrad
                                            : ScanKernel::kStagedLogcumsumexpGrad;
  } else {
    (void)op, (void)s, (void)reverse;
    return ScanKernel::kNone;
  }
}

// The staged long rows on unswizzled stages (StagedTilesOf).
template <typename Op>
KernelStatus launch_staged_rows(const Op& op, const ScanShape& s, bool reverse,
                                const ScanWorkspace& workspace, cudaStream_t stream) {
  if constexpr (!std::is_void<StagedTilesOf<Op, false>>::value) {
    using Forward = StagedTilesOf<Op, false>;
    using Backward = StagedTilesOf<Op, true>;
    const int64_t tiles = ceil_div(s.len, Forward::kTileLen);
    return reverse ? launch_staged_tiles(Backward{op, s.len, tiles}, s.outer, workspace, stream)
                   : launch_staged_tiles(Forward{op, s.len, tiles}, s.outer, workspace, stream);
  } else {
    (void)op, (void)s, (void)reverse, (void)workspace, (void)stream;
    return KernelStatus::invalid("scan: no staged rows for this op");
  }
}

// A block per row of [outer, len].
template <typename Op>
KernelStatus launch_rows(const Op& op, const ScanShape& s, bool reverse, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(std::min(s.outer, kMaxBlocks));
  rows_kernel<<<grid, kScanBlock, 0, stream>>>(op, s.outer, s.len, reverse);
  return launch_status();
}

// ---------------------------------------------------------------- columns path
// Thread c owns column c = o * inner + i (consecutive threads, consecutive
// addresses) and walks segment blockIdx.y of its axis. Workspace: one state
// per (segment, column), segment-major.

struct ColumnSpan {
  int64_t base;     // offset of (o, 0, i)
  int64_t p_begin;  // scan positions of this thread's segment
  int64_t p_end;
};

__device__ inline bool column_span(const ScanShape& s, int64_t seg_len, ColumnSpan& span,
                                   int64_t& column) {
  column = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= s.outer * s.inner) return false;
  const int64_t o = column / s.inner;
  const int64_t i = column - o * s.inner;
  span.base = o * s.len * s.inner + i;
  span.p_begin = int64_t(blockIdx.y) * seg_len;
  span.p_end = span.p_begin + seg_len < s.len ? span.p_begin + seg_len : s.len;
  return true;
}

// Walks one thread's segment in batches of kColumnBatch<Op>: every load of
// a batch is issued before its first store, so each thread keeps several
// loads in flight (the compiler cannot move loads past stores that may
// alias).
template <bool kStore, typename Op>
__device__ StateOf<Op> walk_column(const Op& op, const ScanShape& s, bool reverse,
                                   const ColumnSpan& span, StateOf<Op> carry) {
  const Line line{span.base, s.inner, s.len, reverse};
  for (int64_t p0 = span.p_begin; p0 < span.p_end; p0 += kColumnBatch<Op>) {
    StateOf<Op> items[kColumnBatch<Op>];
    const StateOf<Op> total = load_run(op, line, p0, span.p_end, items);
    carry = kStore ? store_run(op, line, p0, span.p_end, carry, items) : op.combine(carry, total);
  }
  return carry;
}

// One segment of a column: its total into the workspace (`store` false), or
// its scan from the carry the workspace holds (none: the identity). One
// kernel for both passes, as they share the walk.
template <typename Op>
__global__ void __launch_bounds__(kColumnBlock)
    column_segment_kernel(Op op, ScanShape s, bool reverse, int64_t seg_len, StateOf<Op>* ws,
                          bool store) {
  ColumnSpan span;
  int64_t column;
  if (!column_span(s, seg_len, span, column)) return;
  StateOf<Op>* slot = ws ? ws + int64_t(blockIdx.y) * s.outer * s.inner + column : nullptr;
  if (!store) {
    *slot = walk_column<false>(op, s, reverse, span, op.identity());
    return;
  }
  walk_column<true>(op, s, reverse, span, slot ? *slot : op.identity());
}

template <typename Op>
__global__ void __launch_bounds__(kColumnBlock)
    column_prefix_kernel(Op op, int64_t columns, int64_t segments, StateOf<Op>* ws) {
  const int64_t column = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= columns) return;
  // A batch of totals is loaded before any of it is overwritten, so a
  // column's walk over its segments costs segments / kPrefixBatch round
  // trips to memory, not one a segment.
  constexpr int kPrefixBatch = 16;
  StateOf<Op> run = op.identity();
  for (int64_t seg0 = 0; seg0 < segments; seg0 += kPrefixBatch) {
    StateOf<Op> totals[kPrefixBatch];
#pragma unroll
    for (int k = 0; k < kPrefixBatch; ++k) {
      if (seg0 + k < segments) totals[k] = ws[(seg0 + k) * columns + column];
    }
#pragma unroll
    for (int k = 0; k < kPrefixBatch; ++k) {
      if (seg0 + k < segments) {
        ws[(seg0 + k) * columns + column] = run;
        run = op.combine(run, totals[k]);
      }
    }
  }
}

// Reduce, scan the segments' totals, rescan (scan_plan.h); one pass where
// the axis is one segment.
template <typename Op>
KernelStatus launch_columns(const Op& op, const ScanShape& s, const ScanPlan& plan, bool reverse,
                            const ScanWorkspace& workspace, cudaStream_t stream) {
  using State = StateOf<Op>;
  const int64_t columns = s.outer * s.inner;
  const int64_t seg_len = ceil_div(s.len, plan.segments);
  const dim3 grid(static_cast<unsigned>(ceil_div(columns, kColumnBlock)),
                  static_cast<unsigned>(plan.segments));
  if (plan.segments == 1) {
    column_segment_kernel<<<grid, kColumnBlock, 0, stream>>>(op, s, reverse, seg_len,
                                                             static_cast<State*>(nullptr), true);
    return launch_status();
  }
  KernelStatus st = KernelStatus::ok();
  void* words = nullptr;
  if (!workspace.take(words, st)) return st;
  State* ws = static_cast<State*>(words);
  column_segment_kernel<<<grid, kColumnBlock, 0, stream>>>(op, s, reverse, seg_len, ws, false);
  st = launch_status();
  if (!st.is_ok()) return st;
  column_prefix_kernel<<<grid.x, kColumnBlock, 0, stream>>>(op, columns, plan.segments, ws);
  st = launch_status();
  if (!st.is_ok()) return st;
  column_segment_kernel<<<grid, kColumnBlock, 0, stream>>>(op, s, reverse, seg_len, ws, true);
  return launch_status();
}

// ---------------------------------------------------------------- column_tiles path
// Tile (t, b): axis positions [t * kColumnTileRows, (t + 1) * kColumnTileRows)
// of columns [b * kColumnBlock, (b + 1) * kColumnBlock); ticket t * blocks + b,
// so a tile waits only for smaller tickets. Totals are per column (slot
// t * columns + c), flags per tile (t * blocks + b). A tile's prefix, per
// column, is the in-order fold of the earlier groups' totals and of the
// earlier tiles of its group: the association depends on t only.
//
// kPrefixBatch: how many of those totals a thread reads at a time, eight
// below kFewTileColumns columns and one above (scan_tuning.cuh).

template <typename Op, int kPrefixBatch>
__global__ void __launch_bounds__(kColumnBlock)
    column_tiles_kernel(Op op, ScanShape s, bool reverse, int64_t tiles, int64_t groups,
                        int64_t blocks, TileSlots<StateOf<Op>> ws) {
  using State = StateOf<Op>;
  static_assert(kMaxColumnGroups + kGroupTiles <= kColumnBlock, "one waiting thread per flag");
  grid_dependency_wait();  // for the slots (launch_on_slots)
  const int64_t ticket = take_ticket_and_rewind(ws.counter);
  const int64_t tile = ticket / blocks;
  const int64_t block = ticket - tile * blocks;
  const int64_t columns = s.outer * s.inner;
  const int64_t column = block * kColumnBlock + threadIdx.x;
  const bool active = column < columns;
  const int64_t o = active ? column / s.inner : 0;
  const Line line{o * s.len * s.inner + (column - o * s.inner), s.inner, s.len, reverse};
  const int64_t p_begin = tile * kColumnTileRows;
  const int64_t p_end = p_begin + kColumnTileRows < s.len ? p_begin + kColumnTileRows : s.len;

  State items[kColumnTileRows];
  State total = op.identity();
  if (active) total = load_run(op, line, p_begin, p_end, items);
  publish_block(ws.tile_totals + tile * columns + column, active, total,
                ws.tile_flags + tile * blocks + block, ws.mark);

  const int64_t group = tile / kGroupTiles;
  const int64_t group_first = group * kGroupTiles;
  // The last tile of a group that later tiles depend on publishes its totals.
  if (tile - group_first == kGroupTiles - 1 && group + 1 < groups) {
    wait_all(ws.tile_flags + group_first * blocks + block, blocks, kGroupTiles, 0, ws.mark);
    __syncthreads();
    State g = op.identity();
    if (active) {
      g = fold_volatile<kPrefixBatch>(op, g, ws.tile_totals + group_first * columns + column,
                                      columns, kGroupTiles);
    }
    publish_block(ws.group_totals + group * columns + column, active, g,
                  ws.group_flags + group * blocks + block, ws.mark);
  }

  wait_all(ws.group_flags + block, blocks, group, 0, ws.mark);
  wait_all(ws.tile_flags + group_first * blocks + block, blocks, tile - group_first,
           kMaxColumnGroups, ws.mark);
  __syncthreads();
  if (!active) return;
  State prefix =
      fold_volatile<kPrefixBatch>(op, op.identity(), ws.group_totals + column, columns, group);
  prefix = fold_volatile<kPrefixBatch>(op, prefix, ws.tile_totals + group_first * columns + column,
                                       columns, tile - group_first);
  store_run(op, line, p_begin, p_end, prefix, items);
}

// ---------------------------------------------------------------- launch

// Whether an op's states carry 64-bit positions: only for axes longer than
// INT32_MAX (scan_dispatch.h), which plan_scan sends to the general
// long_rows or columns path; only those are compiled for them.
template <typename State>
struct WidePositions : std::false_type {};
template <typename Acc>
struct WidePositions<ValueIndex<Acc, int64_t>> : std::true_type {};
template <typename Acc>
struct WidePositions<KeyedSum<Acc, int64_t>> : std::true_type {};

// The kernel that scans `op` over `s` (plan_scan's path, refined by the
// op, its arrays' alignment, the compiled targets and the device): the one
// place that chooses, for launch() and for scan_path()'s report.
template <typename Op>
ScanKernel choose_kernel(const Op& op, const ScanShape& s, const ScanPlan& plan, bool reverse) {
  if constexpr (WidePositions<StateOf<Op>>::value) {
    (void)op, (void)s, (void)reverse;
    return plan.path == ScanPath::kLongRows ? ScanKernel::kLongRows
           : plan.path == ScanPath::kColumns ? ScanKernel::kColumns
                                             : ScanKernel::kNone;
  } else {
    switch (plan.path) {
      case ScanPath::kEmpty: return ScanKernel::kNone;
      case ScanPath::kRowGroups:
        return s.len >= kWarpChunk && warp_rows_fit(op, s) ? ScanKernel::kWarpRows
                                                           : ScanKernel::kRowGroups;
      case ScanPath::kRows:
        return warp_rows_fit(op, s) ? ScanKernel::kWarpRows : ScanKernel::kRows;
      case ScanPath::kLongRows: {
        const ScanKernel staged = staged_rows_choice(op, s, reverse);
        if (staged != ScanKernel::kNone) return staged;
        return keyed_rows_fit(op, s) ? ScanKernel::kKeyedRows : ScanKernel::kLongRows;
      }
      case ScanPath::kColumnStrips:
        return staged_strips_fit(with_late_runs(op), s) ? ScanKernel::kStagedStrips
                                                        : ScanKernel::kColumnStrips;
      case ScanPath::kStripTiles:
        return long_strip_tiles_fit<Op>(s, plan) ? ScanKernel::kLongStripTiles
                                                 : ScanKernel::kStripTiles;
      case ScanPath::kColumnTiles: return ScanKernel::kColumnTiles;
      case ScanPath::kColumns: return ScanKernel::kColumns;
    }
    return ScanKernel::kNone;
  }
}

template <typename Op>
KernelStatus launch_column_tiles(const Op& op, const ScanShape& s, const ScanPlan& plan,
                                 bool reverse, const ScanWorkspace& workspace,
                                 cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(plan.tiles * plan.column_blocks);
  const auto tiles_kernel = s.outer * s.inner < kFewTileColumns ? column_tiles_kernel<Op, 8>
                                                                : column_tiles_kernel<Op, 1>;
  return launch_ticketed_tiles<StateOf<Op>>(tiles_kernel, dim3(grid), dim3(kColumnBlock),
                                            workspace, plan.tile_ws, stream, op, s, reverse,
                                            plan.tiles, plan.groups, plan.column_blocks);
}

template <typename Op>
KernelStatus launch(const Op& op, const ScanShape& s, bool reverse,
                    const ScanWorkspace& workspace, cudaStream_t stream) {
  static_assert(sizeof(StateOf<Op>) <= kWorkspaceSlotBytes,
                "scan state larger than a workspace slot");
  const ScanPlan plan = plan_scan(s);
  const ScanKernel kernel = choose_kernel(op, s, plan, reverse);
  if (plan.path == ScanPath::kEmpty) return KernelStatus::ok();
  if constexpr (WidePositions<StateOf<Op>>::value) {
    if (kernel == ScanKernel::kLongRows) return launch_long_rows(op, s, reverse, workspace, stream);
    if (kernel == ScanKernel::kColumns) {
      return launch_columns(op, s, plan, reverse, workspace, stream);
    }
    return KernelStatus::invalid("scan: 64-bit positions on a path not compiled for them");
  } else {
    switch (kernel) {
      case ScanKernel::kNone: return KernelStatus::ok();
      case ScanKernel::kRowGroups: return launch_row_groups(op, s, reverse, stream);
      case ScanKernel::kWarpRows: return launch_warp_rows(op, s, reverse, stream);
      case ScanKernel::kRows: return launch_rows(op, s, reverse, stream);
      case ScanKernel::kLongRows: return launch_long_rows(op, s, reverse, workspace, stream);
      case ScanKernel::kStagedRows:
      case ScanKernel::kStagedExtremes:
      case ScanKernel::kStagedCumprodGrad:
      case ScanKernel::kStagedLogcumsumexpGrad:
        return launch_staged_rows(op, s, reverse, workspace, stream);
      case ScanKernel::kSwizzledRuns:
        return launch_swizzled_runs(op, s, reverse, workspace, stream);
      case ScanKernel::kSwizzledLogcumsumexpGrad:
        return launch_swizzled_grad(op, s, reverse, workspace, stream);
      case ScanKernel::kKeyedRows: return launch_keyed_rows(op, s, reverse, workspace, stream);
      case ScanKernel::kColumnStrips:
        return launch_column_strips(with_late_runs(op), s, plan.strips_per_outer, reverse,
                                    stream);
      case ScanKernel::kStagedStrips:
        return launch_staged_strips(with_late_runs(op), s, reverse, stream);
      case ScanKernel::kStripTiles:
      case ScanKernel::kLongStripTiles:
        return launch_strip_tiles(op, s, plan, kernel == ScanKernel::kLongStripTiles, reverse,
                                  workspace, stream);
      case ScanKernel::kColumnTiles:
        return launch_column_tiles(op, s, plan, reverse, workspace, stream);
      case ScanKernel::kColumns: return launch_columns(op, s, plan, reverse, workspace, stream);
    }
    return KernelStatus::invalid("scan: unknown kernel");
  }
}

}  // namespace

namespace scan {

template <typename T, typename Args>
KernelStatus scan_cuda(const Args& args, void* stream) {
  return scan_for<T, AccumulatorOf<T, float>>(args, [&](const auto& op, bool reverse) {
    return launch(op, args.shape, reverse, args.workspace, static_cast<cudaStream_t>(stream));
  });
}

template <typename T, typename Args>
ScanKernel scan_kernel_cuda(const Args& args) {
  ScanKernel kernel = ScanKernel::kNone;
  scan_for<T, AccumulatorOf<T, float>>(args, [&](const auto& op, bool reverse) {
    kernel = choose_kernel(op, args.shape, plan_scan(args.shape), reverse);
    return KernelStatus::ok();
  });
  return kernel;
}

}  // namespace scan
}  // namespace baracuda
