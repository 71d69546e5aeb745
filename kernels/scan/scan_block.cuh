// Block-level building blocks of the CUDA scan engine (scan.cu): the combine
// as a cub scan operator, runs of consecutive elements of one line of the
// axis, and the striped-load / blocked-scan / striped-store chunk that the
// rows and long_rows paths share. No torch headers.
#pragma once

#include <cub/block/block_exchange.cuh>
#include <cub/block/block_scan.cuh>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/acc_convert.h"

#include "scan/scan_plan.h"

namespace baracuda {
namespace scan {

template <typename Op>
using StateOf = typename Op::State;

// The Aux of an op (scan_ops.h), or nothing.
struct NoAux {};
template <typename Op, typename = void>
struct AuxTrait {
  using type = NoAux;
  static constexpr bool kHas = false;
};
template <typename Op>
struct AuxTrait<Op, std::void_t<typename Op::Aux>> {
  using type = typename Op::Aux;
  static constexpr bool kHas = true;
};
template <typename Op>
using AuxOf = typename AuxTrait<Op>::type;

// Whether an op's store reads the exclusive state (cumprod backward does);
// for the others the rows engine hands the identity in its place and skips
// one combine per element, which the costly combines (log-add-exp) feel.
template <typename Op, typename = void>
struct StoreReadsExclusive : std::false_type {};
template <typename Op>
struct StoreReadsExclusive<Op, std::enable_if_t<Op::kStoreReadsExclusive>> : std::true_type {};

// Whether an op scans a thread's run itself (kRunScan: run_total(items) and
// scan_run(prefix, items), scan_ops.h) rather than by one combine per element.
template <typename Op, typename = void>
struct HasRunScan : std::false_type {};
template <typename Op>
struct HasRunScan<Op, std::enable_if_t<Op::kRunScan>> : std::true_type {};

// The join of a thread's run of items.
template <typename Op, int N>
__device__ StateOf<Op> fold_run(const Op& op, const StateOf<Op> (&items)[N]) {
  if constexpr (HasRunScan<Op>::value) {
    return op.run_total(items);
  } else {
    StateOf<Op> total = op.identity();
#pragma unroll
    for (int k = 0; k < N; ++k) total = op.combine(total, items[k]);
    return total;
  }
}

// Whether an op is PlainIo (scan_ops.h): one storage array in, one out.
template <typename Op, typename = void>
struct HasPlainIo : std::false_type {};
template <typename Op>
struct HasPlainIo<Op, std::enable_if_t<Op::kPlainIo>> : std::true_type {};

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
// before any store of the caller. Returns their total. Given `aux` (an array
// of kItems), an op with an Aux reads those too.
template <int kItems, typename Op>
__device__ StateOf<Op> load_run(const Op& op, const Line& line, int64_t first, int64_t p_end,
                                StateOf<Op> (&items)[kItems], AuxOf<Op>* aux = nullptr) {
  StateOf<Op> total = op.identity();
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int64_t p = first + k;
    items[k] = op.identity();
    if (p < p_end) {
      const int64_t l = line.position(p);
      items[k] = op.load(line.base + l * line.stride, l);
      if constexpr (AuxTrait<Op>::kHas) {
        if (aux != nullptr) aux[k] = op.aux(line.base + l * line.stride, l);
      }
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

// Direct runs of a PlainIo op: thread t's kItems consecutive scan positions
// are one 16-byte vector, read and written in the blocked order the scan
// wants, with no exchange through shared memory; a warp's vectors are 512
// contiguous bytes. (Runs of two vectors per thread measured 3x slower than
// the exchange: each instruction then writes half of every sector it
// touches.) Runs start kItems apart from the row's first element (forward)
// or one past its last (reverse, where the run is reversed in registers), so
// one alignment test per row covers them all.
template <int kItems, typename Op>
constexpr bool kDirectRuns = kItems * sizeof(typename Op::Storage) == 16;

template <int kItems, typename Op>
__device__ bool direct_runs_fit(const Op& op, const Line& line) {
  static_assert(kDirectRuns<kItems, Op>, "a direct run is one 16-byte vector");
  const int64_t anchor = line.reverse ? line.base + line.len : line.base;
  return line.stride == 1 && reinterpret_cast<uintptr_t>(op.src + anchor) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(op.dst + anchor) % 16 == 0;
}

// Loads the run of scan positions [first, first + kItems) into items, in
// scan order; positions at or past the end hold the identity.
template <int kItems, typename Op>
__device__ void load_direct(const Op& op, const Line& line, int64_t first,
                            StateOf<Op> (&items)[kItems]) {
  using T = typename Op::Storage;
  if (first + kItems <= line.len) {
    const int64_t lowest = line.reverse ? line.len - first - kItems : first;
    const uint4 u = *reinterpret_cast<const uint4*>(op.src + line.base + lowest);
    T raw[kItems];
    memcpy(raw, &u, sizeof(u));
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      items[k] = to_acc<StateOf<Op>>(raw[line.reverse ? kItems - 1 - k : k]);
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int64_t p = first + k;
    items[k] = op.identity();
    if (p < line.len) {
      const int64_t l = line.position(p);
      items[k] = op.load(line.base + l, l);
    }
  }
}

// Stores the inclusive states of the run load_direct read.
template <int kItems, typename Op>
__device__ void store_direct(const Op& op, const Line& line, int64_t first,
                             const StateOf<Op> (&incl)[kItems]) {
  using T = typename Op::Storage;
  if (first + kItems <= line.len) {
    const int64_t lowest = line.reverse ? line.len - first - kItems : first;
    T raw[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      raw[line.reverse ? kItems - 1 - k : k] = from_acc<T>(incl[k]);
    }
    uint4 u;
    memcpy(&u, raw, sizeof(u));
    *reinterpret_cast<uint4*>(op.dst + line.base + lowest) = u;
    return;
  }
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int64_t p = first + k;
    if (p < line.len) {
      const int64_t l = line.position(p);
      op.store(line.base + l, l, op.identity(), incl[k]);
    }
  }
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

// The block-wide part of a chunk scan: thread t holds kScanItems
// consecutive elements (blocked). A block scan of the per-thread totals
// gives each thread its prefix; `prefix_of(total)` is called by every thread
// with the chunk's total and returns the state of everything before the
// chunk. Leaves in `blocked` everything up to each element (or before it,
// for a store that reads the exclusive state). Returns the chunk's total.
template <typename Op, typename PrefixOf>
__device__ StateOf<Op> scan_blocked(const Op& op, StateOf<Op> (&blocked)[kScanItems],
                                    RowShared<Op>& shared, PrefixOf&& prefix_of) {
  using State = StateOf<Op>;
  constexpr bool kExclusive = StoreReadsExclusive<Op>::value;
  // Positions past the end hold the identity, so they may be folded in.
  const State total = fold_run(op, blocked);
  State before, chunk_total;
  BlockScanOf<Op>(shared.scan).ExclusiveScan(total, before, op.identity(), CombineFn<Op>{op},
                                             chunk_total);
  __syncthreads();
  State run = op.combine(prefix_of(chunk_total), before);
  if constexpr (HasRunScan<Op>::value) {
    static_assert(!kExclusive, "a run scan gives inclusive states");
    op.scan_run(run, blocked);
  } else {
#pragma unroll
    for (int k = 0; k < kScanItems; ++k) {
      const State next = op.combine(run, blocked[k]);
      blocked[k] = kExclusive ? run : next;
      run = next;
    }
  }
  return chunk_total;
}

// Whether scan_chunk may move an op's runs directly (kDirectRuns).
template <typename Op>
constexpr bool kMayGoDirect = HasPlainIo<Op>::value && kDirectRuns<kScanItems, Op>;

// One block scans kRowChunk elements of a row (inner == 1) from scan
// position `chunk` (scan_blocked; prefix_of as there). Memory is read and
// written striped (element k * kScanBlock + t by thread t: every warp access
// is one contiguous run), the scan runs blocked, the two arrangements being
// exchanged through shared memory -- except for PlainIo ops on aligned rows
// whose runs are one 16-byte vector (kDirectRuns): those move directly.
// Returns the chunk's total.
template <typename Op, typename PrefixOf>
__device__ StateOf<Op> scan_chunk(const Op& op, const Line& line, int64_t chunk,
                                  RowShared<Op>& shared, PrefixOf&& prefix_of) {
  using State = StateOf<Op>;
  constexpr bool kExclusive = StoreReadsExclusive<Op>::value;
  static_assert(!(kExclusive && kMayGoDirect<Op>), "direct runs store incl alone");
  State blocked[kScanItems];
  if constexpr (kMayGoDirect<Op>) {
    // The same for every thread of the block.
    if (direct_runs_fit<kScanItems>(op, line)) {
      const int64_t first = chunk + int64_t{threadIdx.x} * kScanItems;
      load_direct(op, line, first, blocked);
      const State chunk_total = scan_blocked(op, blocked, shared, prefix_of);
      store_direct(op, line, first, blocked);
      return chunk_total;
    }
  }
  State striped[kScanItems];
  // What the stores read besides the states comes in with the states: the
  // stores are striped as the loads are, so no exchange is needed.
  AuxOf<Op> aux[kScanItems];
#pragma unroll
  for (int k = 0; k < kScanItems; ++k) {
    const int64_t p = chunk + int64_t(k) * kScanBlock + threadIdx.x;
    striped[k] = op.identity();
    if (p < line.len) {
      const int64_t l = line.position(p);
      striped[k] = op.load(line.base + l, l);
      if constexpr (AuxTrait<Op>::kHas) aux[k] = op.aux(line.base + l, l);
    }
  }
  RowExchangeOf<Op>(shared.exchange).StripedToBlocked(striped, blocked);
  __syncthreads();
  const State chunk_total = scan_blocked(op, blocked, shared, prefix_of);
  RowExchangeOf<Op>(shared.exchange).BlockedToStriped(blocked, blocked);
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kScanItems; ++k) {
    const int64_t p = chunk + int64_t(k) * kScanBlock + threadIdx.x;
    if (p < line.len) {
      const int64_t l = line.position(p);
      const State excl = kExclusive ? blocked[k] : op.identity();
      const State incl = kExclusive ? op.combine(blocked[k], striped[k]) : blocked[k];
      if constexpr (AuxTrait<Op>::kHas) {
        op.store_with(line.base + l, l, excl, incl, aux[k]);
      } else {
        op.store(line.base + l, l, excl, incl);
      }
    }
  }
  return chunk_total;
}

}  // namespace scan
}  // namespace baracuda
