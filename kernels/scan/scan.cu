// CUDA engine of the scan family: the functors of scan_ops.h run over one of
// four paths (scan_plan.h). Every path combines in a fixed order that does
// not depend on timing, so results are bit-identical run to run. The only
// atomics are the tile tickets and ready flags of long_rows and column_tiles:
// they order the work, never a value.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cub/block/block_exchange.cuh>
#include <cub/block/block_scan.cuh>

#include "common/cuda_launch.cuh"
#include "scan/scan_dispatch.h"
#include "scan/scan_kernels.h"
#include "scan/scan_plan.h"

namespace baracuda {
namespace {

template <typename Op>
using StateOf = typename Op::State;

// Warp scans joined by a scan of the warp totals: a fixed, order-preserving
// association (the ops are associative, not commutative) with a short
// critical path, which matters for the costlier combines (log-add-exp).
template <typename Op>
using BlockScanOf = cub::BlockScan<StateOf<Op>, kScanBlock, cub::BLOCK_SCAN_WARP_SCANS>;

template <typename Op>
struct CombineFn {
  Op op;
  __device__ StateOf<Op> operator()(const StateOf<Op>& a, const StateOf<Op>& b) const {
    return op.combine(a, b);
  }
};

// Where a line of the axis lives: element l at base + l * stride.
struct Line {
  int64_t base;
  int64_t stride;
  int64_t len;
  bool reverse;
  __device__ int64_t position(int64_t p) const { return reverse ? len - 1 - p : p; }
};

// A thread's kItems consecutive elements of a line from scan position
// `first`; positions at or past p_end hold the identity. Every load is issued
// before any store of the caller. Returns their total.
template <int kItems, typename Op>
__device__ StateOf<Op> load_run(const Op& op, const Line& line, int64_t first, int64_t p_end,
                                StateOf<Op> (&items)[kItems]) {
  StateOf<Op> total = op.identity();
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int64_t p = first + k;
    items[k] = op.identity();
    if (p < p_end) {
      const int64_t l = line.position(p);
      items[k] = op.load(line.base + l * line.stride, l);
      total = op.combine(total, items[k]);
    }
  }
  return total;
}

// Stores the run loaded by load_run, `run` being everything before it;
// returns everything up to its end.
template <int kItems, typename Op>
__device__ StateOf<Op> store_run(const Op& op, const Line& line, int64_t first, int64_t p_end,
                                 StateOf<Op> run, const StateOf<Op> (&items)[kItems]) {
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int64_t p = first + k;
    if (p < p_end) {
      const int64_t l = line.position(p);
      const StateOf<Op> incl = op.combine(run, items[k]);
      op.store(line.base + l * line.stride, l, run, incl);
      run = incl;
    }
  }
  return run;
}

// Shared memory of a rows block: the block scan and the striped <-> blocked
// exchanges take turns (a __syncthreads separates every use).
template <typename Op>
using RowExchangeOf = cub::BlockExchange<StateOf<Op>, kScanBlock, kScanItems>;

template <typename Op>
union RowShared {
  typename BlockScanOf<Op>::TempStorage scan;
  typename RowExchangeOf<Op>::TempStorage exchange;
};

// One block scans kRowChunk elements of a row (inner == 1) from scan
// position `chunk`. Memory is read and written striped (element
// k * kScanBlock + t by thread t: every warp access is one contiguous run);
// the scan itself runs blocked (thread t owns kScanItems consecutive
// elements, a block scan of the per-thread totals gives its prefix), the two
// arrangements being exchanged through shared memory. `prefix_of(total)` is
// called by every thread with the chunk's total and returns the state of
// everything before the chunk. Returns the chunk's total.
template <typename Op, typename PrefixOf>
__device__ StateOf<Op> scan_chunk(const Op& op, const Line& line, int64_t chunk,
                                  RowShared<Op>& shared, PrefixOf&& prefix_of) {
  using State = StateOf<Op>;
  State striped[kScanItems];
#pragma unroll
  for (int k = 0; k < kScanItems; ++k) {
    const int64_t p = chunk + int64_t(k) * kScanBlock + threadIdx.x;
    striped[k] = op.identity();
    if (p < line.len) striped[k] = op.load(line.base + line.position(p), line.position(p));
  }
  State blocked[kScanItems];
  RowExchangeOf<Op>(shared.exchange).StripedToBlocked(striped, blocked);
  __syncthreads();
  // Positions past the end hold the identity, so they may be folded in.
  State total = op.identity();
#pragma unroll
  for (int k = 0; k < kScanItems; ++k) total = op.combine(total, blocked[k]);
  State before, chunk_total;
  BlockScanOf<Op>(shared.scan).ExclusiveScan(total, before, op.identity(), CombineFn<Op>{op},
                                             chunk_total);
  __syncthreads();
  // Everything before each blocked element, sent back to the striped owner.
  State run = op.combine(prefix_of(chunk_total), before);
#pragma unroll
  for (int k = 0; k < kScanItems; ++k) {
    const State next = op.combine(run, blocked[k]);
    blocked[k] = run;
    run = next;
  }
  RowExchangeOf<Op>(shared.exchange).BlockedToStriped(blocked, blocked);
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kScanItems; ++k) {
    const int64_t p = chunk + int64_t(k) * kScanBlock + threadIdx.x;
    if (p < line.len) {
      const int64_t l = line.position(p);
      op.store(line.base + l, l, blocked[k], op.combine(blocked[k], striped[k]));
    }
  }
  return chunk_total;
}

// ---------------------------------------------------------------- rows path

template <typename Op>
__global__ void __launch_bounds__(kScanBlock)
    rows_kernel(Op op, int64_t outer, int64_t len, bool reverse) {
  using State = StateOf<Op>;
  __shared__ RowShared<Op> shared;
  for (int64_t row = blockIdx.x; row < outer; row += gridDim.x) {
    const Line line{row * len, 1, len, reverse};
    // `carry` (the same in every thread) chains the chunks of the row.
    State carry = op.identity();
    for (int64_t chunk = 0; chunk < len; chunk += kRowChunk) {
      const State total = scan_chunk(op, line, chunk, shared, [&](const State&) { return carry; });
      carry = op.combine(carry, total);
    }
  }
}

// ---------------------------------------------------------------- long_rows path
// One pass (scan_plan.h): tile `tile` of row `row` covers scan positions
// [tile * kTileLen, (tile + 1) * kTileLen) and is held in registers while its
// prefix is assembled from totals published by tiles with smaller tickets.

template <typename State>
struct TileSlots {
  unsigned long long* counter;
  unsigned int* tile_flags;   // 1 once the tile's totals are out
  unsigned int* group_flags;
  State* tile_totals;
  State* group_totals;
};

template <typename State>
TileSlots<State> tile_slots(void* workspace, const TileWorkspace& w) {
  char* base = static_cast<char*>(workspace);
  TileSlots<State> t;
  t.counter = reinterpret_cast<unsigned long long*>(base);
  t.tile_flags = reinterpret_cast<unsigned int*>(base + 16);
  t.group_flags = t.tile_flags + w.tile_flags;
  t.tile_totals = reinterpret_cast<State*>(base + w.zeroed_bytes());
  t.group_totals = reinterpret_cast<State*>(base + w.zeroed_bytes() +
                                            w.tile_slots * kWorkspaceSlotBytes);
  return t;
}

// The block's place in line. Tickets, not blockIdx, order the tiles: a block
// waits only for smaller tickets, which belong to blocks already running, so
// the waits cannot deadlock whatever order the hardware starts blocks in.
__device__ inline int64_t take_ticket(unsigned long long* counter) {
  __shared__ unsigned long long ticket;
  if (threadIdx.x == 0) ticket = atomicAdd(counter, 1ull);
  __syncthreads();
  return static_cast<int64_t>(ticket);
}

// Writer side: the state first, then (after a fence) its flag.
template <typename State>
__device__ void publish(State* slot, unsigned int* flag, const State& value) {
  *slot = value;
  __threadfence();
  atomicExch(flag, 1u);
}

// Reader side: spin on the flag, then read the state from L2 (volatile
// loads; L1 is not coherent across SMs and may hold a stale line).
__device__ inline void wait_ready(const unsigned int* flag) {
  const volatile unsigned int* f = flag;
  while (*f == 0u) {
  }
  __threadfence();
}

template <typename State>
__device__ State read_volatile(const State* slot) {
  static_assert(sizeof(State) % 4 == 0, "scan states are made of 4-byte words");
  union {
    State state;
    unsigned int words[sizeof(State) / 4];
  } u;
  const volatile unsigned int* src = reinterpret_cast<const volatile unsigned int*>(slot);
#pragma unroll
  for (int i = 0; i < int(sizeof(State) / 4); ++i) u.words[i] = src[i];
  return u.state;
}

template <typename State>
__device__ State read_published(const State* slot, const unsigned int* flag) {
  wait_ready(flag);
  return read_volatile(slot);
}

// In-order reduction of n published states: thread j folds a fixed run of
// them, then a block scan joins the runs. The association depends on n only.
template <typename Op>
__device__ StateOf<Op> reduce_published(const Op& op, const StateOf<Op>* slots,
                                        const unsigned int* flags, int64_t n,
                                        typename BlockScanOf<Op>::TempStorage& tmp) {
  using State = StateOf<Op>;
  const int64_t per = (n + kScanBlock - 1) / kScanBlock;
  const int64_t begin = int64_t(threadIdx.x) * per;
  const int64_t end = begin + per < n ? begin + per : n;
  State acc = op.identity();
  for (int64_t k = begin; k < end; ++k) acc = op.combine(acc, read_published(slots + k, flags + k));
  State before, total;
  BlockScanOf<Op>(tmp).ExclusiveScan(acc, before, op.identity(), CombineFn<Op>{op}, total);
  __syncthreads();
  return total;
}

template <typename Op>
__global__ void __launch_bounds__(kScanBlock)
    long_rows_kernel(Op op, int64_t len, bool reverse, int64_t tiles, int64_t groups,
                     TileSlots<StateOf<Op>> ws) {
  using State = StateOf<Op>;
  __shared__ RowShared<Op> shared;
  const int64_t ticket = take_ticket(ws.counter);
  const int64_t row = ticket / tiles;
  const int64_t tile = ticket - row * tiles;
  const Line line{row * len, 1, len, reverse};
  State* row_tiles = ws.tile_totals + row * tiles;
  unsigned int* row_tile_flags = ws.tile_flags + row * tiles;
  const int64_t group = tile / kGroupTiles;
  const int64_t group_first = group * kGroupTiles;

  scan_chunk(op, line, tile * kTileLen, shared, [&](const State& tile_total) {
    if (threadIdx.x == 0) publish(row_tiles + tile, row_tile_flags + tile, tile_total);
    // The last tile of a group that later tiles depend on publishes its total.
    if (tile - group_first == kGroupTiles - 1 && group + 1 < groups) {
      const State g = reduce_published(op, row_tiles + group_first, row_tile_flags + group_first,
                                       kGroupTiles, shared.scan);
      if (threadIdx.x == 0) {
        publish(ws.group_totals + row * groups + group, ws.group_flags + row * groups + group, g);
      }
    }
    const State from_groups = reduce_published(op, ws.group_totals + row * groups,
                                               ws.group_flags + row * groups, group, shared.scan);
    const State from_tiles = reduce_published(
        op, row_tiles + group_first, row_tile_flags + group_first, tile - group_first, shared.scan);
    return op.combine(from_groups, from_tiles);
  });
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

// Walks one thread's segment in batches of kColumnBatch: every load of a
// batch is issued before its first store, so each thread keeps several loads
// in flight (the compiler cannot move loads past stores that may alias).
constexpr int kColumnBatch = 8;

template <bool kStore, typename Op>
__device__ StateOf<Op> walk_column(const Op& op, const ScanShape& s, bool reverse,
                                   const ColumnSpan& span, StateOf<Op> carry) {
  const Line line{span.base, s.inner, s.len, reverse};
  for (int64_t p0 = span.p_begin; p0 < span.p_end; p0 += kColumnBatch) {
    StateOf<Op> items[kColumnBatch];
    const StateOf<Op> total = load_run(op, line, p0, span.p_end, items);
    carry = kStore ? store_run(op, line, p0, span.p_end, carry, items) : op.combine(carry, total);
  }
  return carry;
}

template <typename Op>
__global__ void __launch_bounds__(kColumnBlock)
    column_total_kernel(Op op, ScanShape s, bool reverse, int64_t seg_len, StateOf<Op>* ws) {
  ColumnSpan span;
  int64_t column;
  if (!column_span(s, seg_len, span, column)) return;
  ws[int64_t(blockIdx.y) * s.outer * s.inner + column] =
      walk_column<false>(op, s, reverse, span, op.identity());
}

template <typename Op>
__global__ void __launch_bounds__(kColumnBlock)
    column_prefix_kernel(Op op, int64_t columns, int64_t segments, StateOf<Op>* ws) {
  const int64_t column = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= columns) return;
  StateOf<Op> run = op.identity();
  for (int64_t seg = 0; seg < segments; ++seg) {
    const StateOf<Op> t = ws[seg * columns + column];
    ws[seg * columns + column] = run;
    run = op.combine(run, t);
  }
}

template <typename Op>
__global__ void __launch_bounds__(kColumnBlock)
    column_scan_kernel(Op op, ScanShape s, bool reverse, int64_t seg_len, const StateOf<Op>* ws) {
  ColumnSpan span;
  int64_t column;
  if (!column_span(s, seg_len, span, column)) return;
  const StateOf<Op> carry =
      ws ? ws[int64_t(blockIdx.y) * s.outer * s.inner + column] : op.identity();
  walk_column<true>(op, s, reverse, span, carry);
}

// ---------------------------------------------------------------- column_tiles path
// Tile (t, b): axis positions [t * kColumnTileRows, (t + 1) * kColumnTileRows)
// of columns [b * kColumnBlock, (b + 1) * kColumnBlock); ticket t * blocks + b,
// so a tile waits only for smaller tickets. Totals are per column (slot
// t * columns + c), flags per tile (t * blocks + b). A tile's prefix, per
// column, is the in-order fold of the earlier groups' totals and of the
// earlier tiles of its group: the association depends on t only.

// Threads [first, first + n) each wait for one flag; then the whole block may
// read what those flags guard.
__device__ inline void wait_all(const unsigned int* flags, int64_t stride, int64_t n, int first) {
  const int64_t k = int64_t(threadIdx.x) - first;
  if (k >= 0 && k < n) wait_ready(flags + k * stride);
}

// Every thread's state is written; then one flag says so.
template <typename State>
__device__ void publish_block(State* slot, bool active, const State& value, unsigned int* flag) {
  if (active) *slot = value;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) atomicExch(flag, 1u);
}

template <typename Op>
__global__ void __launch_bounds__(kColumnBlock)
    column_tiles_kernel(Op op, ScanShape s, bool reverse, int64_t tiles, int64_t groups,
                        int64_t blocks, TileSlots<StateOf<Op>> ws) {
  using State = StateOf<Op>;
  static_assert(kMaxColumnGroups + kGroupTiles <= kColumnBlock, "one waiting thread per flag");
  const int64_t ticket = take_ticket(ws.counter);
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
                ws.tile_flags + tile * blocks + block);

  const int64_t group = tile / kGroupTiles;
  const int64_t group_first = group * kGroupTiles;
  // The last tile of a group that later tiles depend on publishes its totals.
  if (tile - group_first == kGroupTiles - 1 && group + 1 < groups) {
    wait_all(ws.tile_flags + group_first * blocks + block, blocks, kGroupTiles, 0);
    __syncthreads();
    State g = op.identity();
    if (active) {
      for (int64_t t = group_first; t <= tile; ++t) {
        g = op.combine(g, read_volatile(ws.tile_totals + t * columns + column));
      }
    }
    publish_block(ws.group_totals + group * columns + column, active, g,
                  ws.group_flags + group * blocks + block);
  }

  wait_all(ws.group_flags + block, blocks, group, 0);
  wait_all(ws.tile_flags + group_first * blocks + block, blocks, tile - group_first,
           kMaxColumnGroups);
  __syncthreads();
  if (!active) return;
  State prefix = op.identity();
  for (int64_t g = 0; g < group; ++g) {
    prefix = op.combine(prefix, read_volatile(ws.group_totals + g * columns + column));
  }
  for (int64_t t = group_first; t < tile; ++t) {
    prefix = op.combine(prefix, read_volatile(ws.tile_totals + t * columns + column));
  }
  store_run(op, line, p_begin, p_end, prefix, items);
}

// ---------------------------------------------------------------- launch

constexpr int64_t kMaxRowBlocks = int64_t(1) << 30;

template <typename Op>
KernelStatus launch(const Op& op, const ScanShape& s, bool reverse, void* workspace,
                    cudaStream_t stream) {
  using State = StateOf<Op>;
  static_assert(sizeof(State) <= kWorkspaceSlotBytes, "scan state larger than a workspace slot");
  const ScanPlan plan = plan_scan(s);
  State* ws = static_cast<State*>(workspace);
  if (plan.workspace_bytes > 0 && ws == nullptr) {
    return KernelStatus::invalid("scan: this shape needs a workspace");
  }
  switch (plan.path) {
    case ScanPath::kEmpty: return KernelStatus::ok();
    case ScanPath::kRows: {
      const unsigned grid = static_cast<unsigned>(std::min(s.outer, kMaxRowBlocks));
      rows_kernel<<<grid, kScanBlock, 0, stream>>>(op, s.outer, s.len, reverse);
      return launch_status();
    }
    case ScanPath::kLongRows: {
      const TileWorkspace& w = plan.tile_ws;
      const KernelStatus st =
          to_status(cudaMemsetAsync(workspace, 0, static_cast<size_t>(w.zeroed_bytes()), stream));
      if (!st.is_ok()) return st;
      const unsigned grid = static_cast<unsigned>(s.outer * plan.tiles);
      long_rows_kernel<<<grid, kScanBlock, 0, stream>>>(op, s.len, reverse, plan.tiles,
                                                        plan.groups, tile_slots<State>(workspace, w));
      return launch_status();
    }
    case ScanPath::kColumnTiles: {
      const TileWorkspace& w = plan.tile_ws;
      const KernelStatus st =
          to_status(cudaMemsetAsync(workspace, 0, static_cast<size_t>(w.zeroed_bytes()), stream));
      if (!st.is_ok()) return st;
      const unsigned grid = static_cast<unsigned>(plan.tiles * plan.column_blocks);
      column_tiles_kernel<<<grid, kColumnBlock, 0, stream>>>(
          op, s, reverse, plan.tiles, plan.groups, plan.column_blocks, tile_slots<State>(workspace, w));
      return launch_status();
    }
    case ScanPath::kColumns: {
      const int64_t columns = s.outer * s.inner;
      const int64_t seg_len = ceil_div(s.len, plan.segments);
      const dim3 grid(static_cast<unsigned>(ceil_div(columns, kColumnBlock)),
                      static_cast<unsigned>(plan.segments));
      if (plan.segments == 1) {
        column_scan_kernel<<<grid, kColumnBlock, 0, stream>>>(op, s, reverse, seg_len, nullptr);
        return launch_status();
      }
      column_total_kernel<<<grid, kColumnBlock, 0, stream>>>(op, s, reverse, seg_len, ws);
      KernelStatus st = launch_status();
      if (!st.is_ok()) return st;
      column_prefix_kernel<<<grid.x, kColumnBlock, 0, stream>>>(op, columns, plan.segments, ws);
      st = launch_status();
      if (!st.is_ok()) return st;
      column_scan_kernel<<<grid, kColumnBlock, 0, stream>>>(op, s, reverse, seg_len, ws);
      return launch_status();
    }
  }
  return KernelStatus::invalid("scan: unknown path");
}

template <typename Args>
KernelStatus run_device(const Args& a, void* stream) {
  return scan::dispatch_scan<__half, __nv_bfloat16, float>(a, [&](const auto& op, bool reverse) {
    return launch(op, a.shape, reverse, a.workspace, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace

KernelStatus scan_forward_cuda(const ScanForwardArgs& args, void* stream) {
  return run_device(args, stream);
}
KernelStatus scan_backward_cuda(const ScanBackwardArgs& args, void* stream) {
  return run_device(args, stream);
}

}  // namespace baracuda
