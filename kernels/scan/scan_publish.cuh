// Cross-block hand-off of the ticketed scan paths (long_rows, column_tiles):
// tickets that order the tiles, and states published behind ready flags and
// read back from L2. No torch headers.
#pragma once

#include <cstdint>

#include "scan/scan_block.cuh"
#include "scan/scan_plan.h"

namespace baracuda {
namespace scan {

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

}  // namespace scan
}  // namespace baracuda
