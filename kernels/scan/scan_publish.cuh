// Cross-block hand-off of the ticketed scan paths (long_rows, strip_tiles,
// column_tiles): tickets that order the tiles, and states published behind
// ready flags and read back from L2 -- the tile paths a block's worth of
// states behind one flag, long_rows one state at a time in flagged words.
// No torch headers.
#pragma once

#include <cub/warp/warp_scan.cuh>

#include <cstdint>

#include "common/cp_async.cuh"
#include "scan/scan_block.cuh"
#include "scan/scan_plan.h"

namespace baracuda {
namespace scan {

template <typename State>
struct TileSlots {
  unsigned long long* counter;
  unsigned int* tile_flags;   // the launch's mark once the tile's totals are out
  unsigned int* group_flags;
  State* tile_totals;
  State* group_totals;
  unsigned int mark;          // 1 where the flags were zeroed ahead of the launch
};

// The slots of a workspace laid out as TileWorkspace says: the counter and
// flags at `marked`, the states at `states`; flags that read `mark` are out.
template <typename State>
TileSlots<State> tile_slots(void* marked, void* states, const TileWorkspace& w,
                            unsigned int mark) {
  char* base = static_cast<char*>(marked);
  TileSlots<State> t;
  t.counter = reinterpret_cast<unsigned long long*>(base);
  t.tile_flags = reinterpret_cast<unsigned int*>(base + 16);
  t.group_flags = t.tile_flags + w.tile_flags;
  t.tile_totals = static_cast<State*>(states);
  t.group_totals =
      reinterpret_cast<State*>(static_cast<char*>(states) + w.tile_slots * kWorkspaceSlotBytes);
  t.mark = mark;
  return t;
}

// The block's place in line. Tickets, not blockIdx, order the tiles: a block
// waits only for smaller tickets, which belong to blocks already running, so
// the waits cannot deadlock whatever order the hardware starts blocks in.
// The counter is zero again when the launch ends, as standing slots need
// (nothing zeroes it ahead of the next launch): the grid's last ticket is
// taken after every other, so its block sets it back.
__device__ inline int64_t take_ticket_and_rewind(unsigned long long* counter) {
  __shared__ unsigned long long ticket;
  if (threadIdx.x == 0) {
    ticket = atomicAdd(counter, 1ull);
    if (ticket == gridDim.x - 1ull) atomicExch(counter, 0ull);
  }
  __syncthreads();
  return static_cast<int64_t>(ticket);
}

// Reader side: spin on the flag, then read the state from L2 (volatile
// loads; L1 is not coherent across SMs and may hold a stale line).
__device__ inline void wait_ready(const unsigned int* flag, unsigned int mark) {
  const volatile unsigned int* f = flag;
  while (*f != mark) {
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
// same property of its 16-byte tile descriptors.)
// The flag is a 64-bit ready mark (the word's first two 32-bit halves): a
// word is out when it holds its own launch's mark. Zeroed words and mark 1
// serve a launch whose slots are zeroed ahead of it; slots that stay from
// launch to launch (standing_slots.h) are zeroed once, and each launch takes
// a mark no launch on them has used, so whatever an earlier launch left
// there reads as "not yet".

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

// The ready mark of a launch whose slots were zeroed ahead of it; a stream's
// standing slots take it only for their very first launch, freshly zeroed.
constexpr uint64_t kZeroedSlotsMark = 1;

// Whether a word whose mark reads (hi, lo) is out under `mark`. Zeroed slots
// hold no mark but 1, so under that mark the low half alone decides (with
// the mark a constant, the test compiles to what it was before marks).
__device__ inline bool marked_ready(unsigned int lo, unsigned int hi, uint64_t mark) {
  return mark == kZeroedSlotsMark ? lo != 0u : (uint64_t{hi} << 32 | lo) == mark;
}


template <typename State>
__device__ void publish_flagged(FlaggedState<State>* slot, const State& value, uint64_t mark) {
  StateWords<State> v;
  v.state = value;
  const unsigned int mark_lo = static_cast<unsigned int>(mark);
  const unsigned int mark_hi = static_cast<unsigned int>(mark >> 32);
#pragma unroll
  for (int w = 0; w < FlaggedState<State>::kWords; ++w) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(slot->words + w),
                 "r"(mark_lo), "r"(mark_hi), "r"(v.u[2 * w]), "r"(v.u[2 * w + 1])
                 : "memory");
  }
}

// The state in `out` from a slot's words; true if it is out.
template <typename State>
__device__ bool unpack_flagged(const uint4 (&words)[FlaggedState<State>::kWords], State& out,
                               uint64_t mark) {
  StateWords<State> v;
  bool ready = true;
#pragma unroll
  for (int w = 0; w < FlaggedState<State>::kWords; ++w) {
    const unsigned int lo = words[w].x, hi = words[w].y;
    v.u[2 * w] = words[w].z;
    v.u[2 * w + 1] = words[w].w;
    ready &= marked_ready(lo, hi, mark);
  }
  out = v.state;
  return ready;
}

// A slot's words as they are now, by one volatile vector load each.
template <typename State>
__device__ void load_flagged_words(const FlaggedState<State>* slot, FlaggedState<State>& words) {
#pragma unroll
  for (int w = 0; w < FlaggedState<State>::kWords; ++w) {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(words.words[w].x), "=r"(words.words[w].y), "=r"(words.words[w].z),
                   "=r"(words.words[w].w)
                 : "l"(slot->words + w)
                 : "memory");
  }
}

// One attempt: true, with the state in `out`, if it is out.
template <typename State>
__device__ bool try_read_flagged(const FlaggedState<State>* slot, State& out, uint64_t mark) {
  FlaggedState<State> words;
  load_flagged_words(slot, words);
  return unpack_flagged(words.words, out, mark);
}

// A read of a flagged state put in flight now and looked at later, so that
// the round trip to L2 runs under whatever the thread does before it looks.
// issue_flagged_read copies the slot's words into `own`, the thread's copy
// in shared memory, by cp.async (no register held meanwhile); a copy in
// registers is load_flagged_words' (no shared memory, four registers held
// a word). take_flagged_read takes such a copy, or if the state was not
// out yet when it was made, reads the slot again until it is;
// wait_flagged_read first waits for the cp.async copy.
template <typename State>
__device__ void issue_flagged_read(FlaggedState<State>* own, const FlaggedState<State>* slot) {
#pragma unroll
  for (int w = 0; w < FlaggedState<State>::kWords; ++w) cp_async16(own->words + w, slot->words + w);
  cp_async_commit();
}

template <typename State>
__device__ State take_flagged_read(const FlaggedState<State>& copy,
                                   const FlaggedState<State>* slot, uint64_t mark) {
  State out;
  if (unpack_flagged(copy.words, out, mark)) return out;
  while (!try_read_flagged(slot, out, mark)) {
  }
  return out;
}

template <typename State>
__device__ State wait_flagged_read(const FlaggedState<State>* own,
                                   const FlaggedState<State>* slot, uint64_t mark) {
  cp_async_wait<0>();  // the copy issue_flagged_read committed
  return take_flagged_read(*own, slot, mark);
}

// Where long_rows keeps its ticket counter and published totals (the layout
// of scan_plan.h).
template <typename State>
struct LongRowsSlots {
  static_assert(sizeof(FlaggedState<State>) <= kFlaggedSlotBytes, "state too large to publish");
  unsigned long long* counter;
  FlaggedState<State>* tile_totals;   // [rows][tiles]
  FlaggedState<State>* group_totals;  // [rows][groups]
  int64_t bytes;                      // all of it: zeros and marks alone
};

template <typename State>
constexpr int64_t long_rows_slot_bytes(int64_t rows, int64_t tiles, int64_t groups) {
  return kLongRowsCounterBytes + rows * (tiles + groups) * int64_t(sizeof(FlaggedState<State>));
}

template <typename State>
LongRowsSlots<State> long_rows_slots(void* workspace, int64_t rows, int64_t tiles, int64_t groups) {
  char* base = static_cast<char*>(workspace);
  LongRowsSlots<State> t;
  t.counter = reinterpret_cast<unsigned long long*>(base);
  t.tile_totals = reinterpret_cast<FlaggedState<State>*>(base + kLongRowsCounterBytes);
  t.group_totals = t.tile_totals + rows * tiles;
  t.bytes = long_rows_slot_bytes<State>(rows, tiles, groups);
  return t;
}

// Folds published states [begin, end) in order, kBatch loads in flight at a
// time (the spin of one does not hold back the loads of the others).
// fold_published_onto folds them onto `acc`.
template <typename Op, int kBatch = 2>
__device__ StateOf<Op> fold_published_onto(const Op& op, StateOf<Op> acc,
                                           const FlaggedState<StateOf<Op>>* slots, int64_t begin,
                                           int64_t end, uint64_t mark) {
  using State = StateOf<Op>;
  for (int64_t k0 = begin; k0 < end; k0 += kBatch) {
    State v[kBatch];
    bool ready[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) ready[j] = k0 + j >= end;
    bool all;
    do {
      all = true;
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (!ready[j]) ready[j] = try_read_flagged(slots + k0 + j, v[j], mark);
        all &= ready[j];
      }
    } while (!all);
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (k0 + j < end) acc = op.combine(acc, v[j]);
    }
  }
  return acc;
}

template <typename Op, int kBatch = 2>
__device__ StateOf<Op> fold_published(const Op& op, const FlaggedState<StateOf<Op>>* slots,
                                      int64_t begin, int64_t end, uint64_t mark) {
  return fold_published_onto<Op, kBatch>(op, op.identity(), slots, begin, end, mark);
}

// The in-order fold of one value per lane of a warp, in every lane. Scaled
// sums go by reference where they can: five joins cost an exp and a dozen
// branches each (with join_prefix_folds' below, measured faster on long
// rows, logcumsumexp forward and backward).
template <typename Op>
__device__ StateOf<Op> fold_warp(const Op& op, const StateOf<Op>& v) {
  if constexpr (kScansByReference<StateOf<Op>>) {
    StateOf<Op> incl = v;
    warp_inclusive<32, true>(op, incl);
    return shuffle_index<32>(incl, 31);
  }
  using WarpScan = cub::WarpScan<StateOf<Op>>;
  __shared__ typename WarpScan::TempStorage tmp[kScanBlock / 32];
  StateOf<Op> before, total;
  WarpScan(tmp[threadIdx.x / 32]).ExclusiveScan(v, before, op.identity(), CombineFn<Op>{op}, total);
  return total;
}

// The in-order fold of the first `count` tiles of a group (count < 32),
// warp 0 only: a lane a tile, every lane waiting for its tile's total.
template <typename Op>
__device__ StateOf<Op> fold_group_tiles(const Op& op, const FlaggedState<StateOf<Op>>* group_tiles,
                                        int64_t count, uint64_t mark) {
  static_assert(kGroupTiles == 32, "warp 0 reads a group's tiles, a lane each");
  const int lane = threadIdx.x % 32;
  StateOf<Op> v = op.identity();
  if (lane < count) {
    while (!try_read_flagged(group_tiles + lane, v, mark)) {
    }
  }
  return fold_warp(op, v);
}

// A thread's slots [begin, end).
struct SlotRange {
  int64_t begin, end;
};
// Of the totals of groups [0, group), those of a thread of warps 1 and up:
// each lane a fixed run of them.
__device__ inline SlotRange earlier_groups_of_thread(int64_t group) {
  constexpr int kReaders = (kScanBlock / 32 - 1) * 32;
  const int64_t per = (group + kReaders - 1) / kReaders;
  const int64_t begin = int64_t(threadIdx.x - 32) * per;
  return {begin, begin + per < group ? begin + per : group};
}

// The in-order fold of the totals of groups [0, group), warps 1 and up: each
// lane its run of them, then the warp's lanes in order.
template <typename Op>
__device__ StateOf<Op> fold_earlier_groups(const Op& op,
                                           const FlaggedState<StateOf<Op>>* row_groups,
                                           int64_t group, uint64_t mark) {
  const SlotRange r = earlier_groups_of_thread(group);
  return fold_published(op, row_groups, r.begin, r.end, mark);
}

// Joins each warp's fold (lane 0's) behind one barrier, in warp order from
// warp kFirst around to warp kFirst - 1.
template <int kFirst, typename Op>
__device__ StateOf<Op> join_warp_folds(const Op& op, const StateOf<Op>& v) {
  using State = StateOf<Op>;
  constexpr int kWarps = kScanBlock / 32;
  __shared__ State warp_folds[kWarps];
  if (threadIdx.x % 32 == 0) warp_folds[threadIdx.x / 32] = v;
  __syncthreads();
  if constexpr (kScansByReference<State>) {
    // Each logical warp of eight lanes scans the folds in that order.
    State w = warp_folds[(threadIdx.x % kWarps + kFirst) % kWarps];
    warp_inclusive<kWarps, true>(op, w);
    return shuffle_index<32>(w, kWarps - 1);
  }
  State prefix = kFirst == 0 ? warp_folds[0] : op.identity();
#pragma unroll
  for (int j = kFirst == 0 ? 1 : 0; j < kWarps; ++j) {
    prefix = op.combine(prefix, warp_folds[(j + kFirst) % kWarps]);
  }
  return prefix;
}

// The join of `lead` and every thread's `v` (a scaled sum each), as one
// plain sum against lead's exponent: each thread weighs its v by one exp,
// each warp adds its weights by five xor shuffles, and the eight warp sums
// meet behind one barrier, which also tells every thread whether every
// term was safe to add so. They are where lead's exponent is finite and
// its sum in [0, 2^64], and every v is empty or has a finite exponent at
// most 20 above lead's and a sum in [0, 2^64]: no weight overflows. The
// result, (lead.m, lead.s + the weights), stands where that sum is at
// least 1 (as a total's is): a weight that flushed to 0 was below 2^-62 of
// it. Otherwise, and where a term was not safe (NaN fails every test), it
// returns false, in every thread, and the caller joins. Which way a block
// goes depends on the data alone, and the order of the sum is fixed, so
// results stay bit-reproducible. Against a warp's fold by reference, the
// eight warps' fold and a join with the lead, it spends one exp a thread
// and no chain of joins (finish_stride_prefix).
__device__ inline bool join_folds_on_reference(const ScaledSum<float>& lead,
                                               const ScaledSum<float>& v,
                                               ScaledSum<float>& joined) {
  constexpr unsigned kAll = 0xffffffffu;
  constexpr float kMaxSum = 18446744073709551616.f;  // 2^64
  constexpr float kMaxAbove = 20.f;
  constexpr int kWarps = kScanBlock / 32;
  __shared__ float warp_sums[kWarps];
  const bool empty = v.m == -INFINITY && v.s == 0.f;
  // NaN fails every comparison, so a NaN anywhere sends the block to the joins.
  const bool safe = is_finite(lead.m) && lead.s >= 0.f && lead.s <= kMaxSum &&
                    (empty || (is_finite(v.m) && v.m <= lead.m + kMaxAbove && v.s >= 0.f &&
                               v.s <= kMaxSum));
  float sum = safe && !empty ? v.s * exp_nonpositive(v.m - lead.m) : 0.f;
#pragma unroll
  for (int d = 16; d >= 1; d /= 2) sum += __shfl_xor_sync(kAll, sum, d);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  if (!__syncthreads_and(safe)) return false;
  float total = lead.s;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
  if (!(total >= 1.f)) return false;
  joined = {lead.m, total};
  return true;
}

// The earlier groups' folds (warps 1 and up, in warp order), then the
// group's earlier tiles' (warp 0).
template <typename Op>
__device__ StateOf<Op> join_prefix_folds(const Op& op, const StateOf<Op>& v) {
  return join_warp_folds<1>(op, v);
}

// Everything before tile `tile` of a row of long_rows, from the published
// totals, in one round of reads: warp 0 publishes the tile's total and reads
// the earlier tiles of its group, a lane each (and when the tile closes a
// group that later tiles depend on, publishes the group's total); the other
// warps read the earlier groups' totals, each lane a fixed run of them. The
// warps' folds meet in shared memory behind one barrier and are joined in
// warp order. The association depends on the tile's position alone.
template <typename Op>
__device__ StateOf<Op> tile_prefix(const Op& op, const StateOf<Op>& tile_total,
                                   FlaggedState<StateOf<Op>>* row_tiles,
                                   FlaggedState<StateOf<Op>>* row_groups, int64_t tile,
                                   int64_t groups, uint64_t mark) {
  using State = StateOf<Op>;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t group = tile / kGroupTiles;
  const int64_t group_first = group * kGroupTiles;
  State v;
  if (warp == 0) {
    if (lane == 0) publish_flagged(row_tiles + tile, tile_total, mark);
    const int64_t earlier = tile - group_first;
    v = fold_group_tiles(op, row_tiles + group_first, earlier, mark);
    if (earlier == kGroupTiles - 1 && group + 1 < groups && lane == 0) {
      publish_flagged(row_groups + group, op.combine(v, tile_total), mark);
    }
  } else {
    v = fold_warp(op, fold_earlier_groups(op, row_groups, group, mark));
  }
  return join_prefix_folds(op, v);
}

// ---------------------------------------------------------------- column_tiles

// Folds the states slots[k * stride], k in [0, n), into `acc` in order,
// kBatch reads in flight at a time where kBatch > 1: each read is a round
// trip to L2, and one after another a column_tiles tile's prefix (up to 31
// tile totals and 64 group totals) costs as many round trips as it folds.
// Four at a time for 16-byte states, which the tile holds beside its own.
template <int kBatch, typename Op>
__device__ StateOf<Op> fold_volatile(const Op& op, StateOf<Op> acc, const StateOf<Op>* slots,
                                     int64_t stride, int64_t n) {
  constexpr int B = kBatch <= 1 ? 1 : sizeof(StateOf<Op>) <= 8 ? kBatch : kBatch / 2;
  for (int64_t k0 = 0; k0 < n; k0 += B) {
    StateOf<Op> v[B];
#pragma unroll
    for (int j = 0; j < B; ++j) {
      if (k0 + j < n) v[j] = read_volatile(slots + (k0 + j) * stride);
    }
#pragma unroll
    for (int j = 0; j < B; ++j) {
      if (k0 + j < n) acc = op.combine(acc, v[j]);
    }
  }
  return acc;
}

// Threads [first, first + n) each wait for one flag to read `mark`; then the
// whole block may read what those flags guard.
__device__ inline void wait_all(const unsigned int* flags, int64_t stride, int64_t n, int first,
                                unsigned int mark) {
  const int64_t k = int64_t(threadIdx.x) - first;
  if (k >= 0 && k < n) wait_ready(flags + k * stride, mark);
}

// Every thread's state is written; then one flag says so, with `mark`.
template <typename State>
__device__ void publish_block(State* slot, bool active, const State& value, unsigned int* flag,
                              unsigned int mark) {
  if (active) *slot = value;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) atomicExch(flag, mark);
}

}  // namespace scan
}  // namespace baracuda
