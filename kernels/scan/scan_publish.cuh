// Cross-block hand-off of the ticketed scan paths (long_rows, column_tiles):
// tickets that order the tiles, and states published behind ready flags and
// read back from L2 -- column_tiles a block's worth of states behind one
// flag, long_rows one state at a time in flagged words. No torch headers.
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

// ---------------------------------------------------------------- flagged words (long_rows)
// A state published as 16-byte words, each a ready flag and 8 bytes of the
// state, written by one vector store and read by one vector load. A 16-byte
// aligned access is served whole by L2, so a reader that sees a word's flag
// sees that word's bytes: no fence on either side, and a reader learns that
// a state is out and what it is in one round trip, where a separate flag
// costs a fence and a second one. (CUB's decoupled look-back relies on the
// same property of its 16-byte tile descriptors.) The words start zeroed:
// flag 0 is "not yet".

template <typename State>
struct FlaggedState {
  static constexpr int kWords = (int(sizeof(State)) + 7) / 8;
  uint4 words[kWords];
};

template <typename State>
union StateWords {
  State state;
  unsigned int u[2 * FlaggedState<State>::kWords];
};

template <typename State>
__device__ void publish_flagged(FlaggedState<State>* slot, const State& value) {
  StateWords<State> v;
  v.state = value;
#pragma unroll
  for (int w = 0; w < FlaggedState<State>::kWords; ++w) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(slot->words + w),
                 "r"(1u), "r"(0u), "r"(v.u[2 * w]), "r"(v.u[2 * w + 1])
                 : "memory");
  }
}

// Spins until the state is out; returns it.
template <typename State>
__device__ State read_flagged(const FlaggedState<State>* slot) {
  StateWords<State> v;
  bool ready;
  do {
    ready = true;
#pragma unroll
    for (int w = 0; w < FlaggedState<State>::kWords; ++w) {
      unsigned int flag, pad;
      asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(flag), "=r"(pad), "=r"(v.u[2 * w]), "=r"(v.u[2 * w + 1])
                   : "l"(slot->words + w)
                   : "memory");
      ready &= flag != 0u;
    }
  } while (!ready);
  return v.state;
}

// Where long_rows keeps its ticket counter and published totals (the layout
// of scan_plan.h).
template <typename State>
struct LongRowsSlots {
  static_assert(sizeof(FlaggedState<State>) <= kFlaggedSlotBytes, "state too large to publish");
  unsigned long long* counter;
  FlaggedState<State>* tile_totals;   // [rows][tiles]
  FlaggedState<State>* group_totals;  // [rows][groups]
  int64_t bytes;                      // all of it, zeroed before the launch
};

template <typename State>
LongRowsSlots<State> long_rows_slots(void* workspace, int64_t rows, int64_t tiles, int64_t groups) {
  char* base = static_cast<char*>(workspace);
  LongRowsSlots<State> t;
  t.counter = reinterpret_cast<unsigned long long*>(base);
  t.tile_totals = reinterpret_cast<FlaggedState<State>*>(base + kLongRowsCounterBytes);
  t.group_totals = t.tile_totals + rows * tiles;
  t.bytes = kLongRowsCounterBytes + rows * (tiles + groups) * int64_t(sizeof(FlaggedState<State>));
  return t;
}

// In-order reduction of n published states: thread j folds a fixed run of
// them, then a block scan joins the runs. The association depends on n only.
template <typename Op>
__device__ StateOf<Op> reduce_published(const Op& op, const FlaggedState<StateOf<Op>>* slots,
                                        int64_t n, typename BlockScanOf<Op>::TempStorage& tmp) {
  using State = StateOf<Op>;
  const int64_t per = (n + kScanBlock - 1) / kScanBlock;
  const int64_t begin = int64_t(threadIdx.x) * per;
  const int64_t end = begin + per < n ? begin + per : n;
  State acc = op.identity();
  for (int64_t k = begin; k < end; ++k) acc = op.combine(acc, read_flagged(slots + k));
  State before, total;
  BlockScanOf<Op>(tmp).ExclusiveScan(acc, before, op.identity(), CombineFn<Op>{op}, total);
  __syncthreads();
  return total;
}

// ---------------------------------------------------------------- column_tiles

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
