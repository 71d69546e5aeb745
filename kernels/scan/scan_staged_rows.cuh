// Staged long rows: the long_rows path (scan_plan.h) for the scans with
// one array in and one out and a floating-point state -- cumsum, cumprod,
// cumsum's backward, and logcumsumexp forward on float32 and two-byte
// elements -- on rows that start 16 bytes aligned, on GPUs with the bulk
// copy engine (compute capability 9.0 and up). Included by scan_launch.cuh. No
// torch headers.
//
// A long_rows block issues its loads at its start and none after, so memory
// idles while it waits for its prefix, scans and stores. Here persistent
// blocks, all resident at once (a cooperative launch), walk the tiles of
// every row striped by block index -- block b takes tiles b, b + G, b + 2G,
// ... of the rows' tiles in scan order -- and keep kStagedStages tiles a
// block in shared memory or on their way (after the first few, each
// requested from the bulk copy engine as soon as its stage frees). A block
// folds its next tile and publishes that tile's total before it waits for
// the prefix of the tile it scans: no tile's total ever waits for a prefix,
// and a tile waits only for tiles with smaller indices, every one of them
// owned by a resident block.
// The prefix is folded from the published totals in an order fixed by the
// tile's position (and for some tiles the grid's size: LookBack below), so
// results are bit-identical run to run.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/hopper.cuh"
#include "scan/scan_block.cuh"
#include "scan/scan_plan.h"
#include "scan/scan_publish.cuh"

namespace baracuda {
namespace scan {

template <typename Op>
constexpr bool kStagedRowsApply =
    HasPlainIo<Op>::value && std::is_floating_point<StateOf<Op>>::value &&
    (!HasRunScan<Op>::value || sizeof(StateOf<Op>) == 4);

// How a block holds a tile. Ops whose joins are cheap (cumsum, cumprod,
// cumsum's backward) take the vector layout: thread t's chunks are the
// block's vectors c * kScanBlock + t, each scanned across the warp. Ops with
// a run scan (logcumsumexp forward), whose joins cost an exp or more, take
// the run layout: thread t holds the tile's vectors t * kStagedVectors ...
// side by side, one run in scan order, folded and scanned as one
// (fold_run, scan_thread_run), so that the block joins only the threads'
// totals.
template <typename Op>
constexpr bool kStagedRuns = HasRunScan<Op>::value;

// A thread holds kStagedVectors 16-byte vectors of a tile: a tile is 16 KiB,
// whatever the element (4096 float32, 8192 bfloat16), at least the kTileLen
// elements the plan sizes long_rows' workspace for. Three stages: the tile
// scanned, the next one folded ahead, one on its way. Measured on H100 with
// a cumsum-only form of this kernel ([1, 16M], benchmarks/RESULTS.md):
// vectors 2 / 4 / 8 took float32 61.2 / 57.1 / 56.4 us.
constexpr int kStagedVectors = 4;
constexpr int kStagedStages = 3;
constexpr int kStagedTileVectors = kScanBlock * kStagedVectors;
constexpr int kStagedTileBytes = kStagedTileVectors * 16;

template <typename T>
constexpr int64_t kStagedTileLen = kStagedTileBytes / int64_t{sizeof(T)};

// One tile of one row, in memory order.
template <typename T>
struct StagedTile {
  uint4* stage;        // its staged vectors
  const T* src;        // its first element in memory
  T* dst;
  int64_t valid;   // its elements inside the row (kStagedTileLen<T> but for a row's last)
  int64_t staged;  // of those, the ones the stage holds (whole vectors)
};

// Where tile g (of all rows' tiles, in scan order) lies.
struct StagedPlace {
  int64_t row, tile;    // tile `tile` of row `row`, in scan order
  int64_t first;        // its first element in memory, from the arrays' start
  int64_t valid;        // its elements inside the row
};

// Element e of elements of T held raw in registers, as an Acc. A bfloat16
// is the high half of its float: the even element of a 32-bit word shifts
// up and the odd one is masked, one instruction each, where copying an odd
// one out of its word and widening it takes two. Every position is a
// constant once the callers' loops unroll.
template <typename T, typename Acc>
__device__ inline Acc raw_element(const unsigned char* bytes, int e) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value && std::is_same<Acc, float>::value) {
    uint32_t word;
    memcpy(&word, bytes + (e / 2) * 4, 4);
    return __uint_as_float(e % 2 == 0 ? word << 16 : word & 0xffff0000u);
  } else {
    T t;
    memcpy(&t, bytes + e * sizeof(T), sizeof(T));
    return to_acc<Acc>(t);
  }
}

// Two values as two-byte elements T, first one first in memory, in one word:
// one conversion for the pair, where from_acc takes one for each and a
// permute to join them.
template <typename T>
__device__ inline uint32_t pack_two(float first, float second) {
  static_assert(sizeof(T) == 2, "two-byte elements");
  uint32_t word;
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(first, second);
    memcpy(&word, &pair, 4);
  } else {
    const __half2 pair = __floats2half2_rn(first, second);
    memcpy(&word, &pair, 4);
  }
  return word;
}

// Tiles of kTileLen elements are laid from each row's start in memory, so
// only a row's last tile in memory (the first in scan order, reversed) may
// be short. Every tile index fits 32 bits (a tile holds at least 2048
// elements), and a 32-bit division costs a fraction of a 64-bit one.
template <int64_t kTileLen, bool kReverse>
__device__ StagedPlace place_staged_tile(int64_t g, int64_t len, int64_t tiles) {
  StagedPlace p;
  p.row = static_cast<uint32_t>(g) / static_cast<uint32_t>(tiles);
  p.tile = g - p.row * tiles;
  const int64_t in_memory = kReverse ? tiles - 1 - p.tile : p.tile;
  p.first = p.row * len + in_memory * kTileLen;
  const int64_t rest = len - in_memory * kTileLen;
  p.valid = rest < kTileLen ? rest : kTileLen;
  return p;
}

template <typename T, bool kReverse>
struct StagedTiling {
  const T* src;
  T* dst;
  int64_t len, tiles;
  __device__ StagedPlace place(int64_t g) const {
    return place_staged_tile<kStagedTileLen<T>, kReverse>(g, len, tiles);
  }
  // Thread 0: asks the copy engine for the tile's whole vectors into `stage`.
  template <L2Lines kLines>
  __device__ void request(const StagedPlace& p, unsigned char* stage, uint64_t* full) const {
    const uint32_t bytes = static_cast<uint32_t>(p.valid * int64_t{sizeof(T)}) & ~15u;
    mbarrier_arrive_expect_tx(full, bytes);
    if (bytes > 0) bulk_copy_to_shared<kLines>(stage, src + p.first, bytes, full);
  }
  __device__ StagedTile<T> view(const StagedPlace& p, unsigned char* stage) const {
    constexpr int64_t kPerVector = 16 / int64_t{sizeof(T)};
    return {reinterpret_cast<uint4*>(stage), src + p.first, dst + p.first, p.valid,
            p.valid / kPerVector * kPerVector};
  }
};

// The elements of the vector a thread meets q-th in a tile's scan order,
// in scan order. A row's last tile (kWhole false) reads what the stage
// lacks from memory, and positions past the row as the identity.
template <typename Op, bool kReverse, bool kWhole>
struct StagedVector {
  using T = typename Op::Storage;
  using Acc = StateOf<Op>;
  static constexpr int kElems = 16 / sizeof(T);
  static __device__ int memory_vector(int q) { return kReverse ? kStagedTileVectors - 1 - q : q; }
  static __device__ int memory_element(int e) { return kReverse ? kElems - 1 - e : e; }

  static __device__ void load(const Op& op, const StagedTile<T>& t, int q, Acc (&v)[kElems]) {
    const int m = memory_vector(q);
    if constexpr (kWhole) {
      unpack(t.stage[m], v);
    } else {
      const T* staged = reinterpret_cast<const T*>(t.stage);
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        const int64_t p = int64_t(m) * kElems + memory_element(e);
        v[e] = p < t.staged ? to_acc<Acc>(staged[p])
               : p < t.valid ? to_acc<Acc>(t.src[p])
                             : op.identity();
      }
    }
  }

  static __device__ void store(const StagedTile<T>& t, int q, const Acc (&v)[kElems]) {
    const int m = memory_vector(q);
    T raw[kElems];
#pragma unroll
    for (int e = 0; e < kElems; ++e) raw[memory_element(e)] = from_acc<T>(v[e]);
    if constexpr (kWhole) {
      uint4 u;
      memcpy(&u, raw, 16);
      reinterpret_cast<uint4*>(t.dst)[m] = u;
    } else {
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        const int64_t p = int64_t(m) * kElems + e;
        if (p < t.valid) t.dst[p] = raw[e];
      }
    }
  }

  // A staged vector's elements in scan order, and back.
  // bfloat16 by words (raw_element); other types copied out whole, which
  // float64 states need to stay within 80 registers unspilled.
  static __device__ void unpack(const uint4& u, Acc (&v)[kElems]) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        v[e] = raw_element<T, Acc>(reinterpret_cast<const unsigned char*>(&u), memory_element(e));
      }
    } else {
      T raw[kElems];
      memcpy(raw, &u, 16);
#pragma unroll
      for (int e = 0; e < kElems; ++e) v[e] = to_acc<Acc>(raw[memory_element(e)]);
    }
  }
  static __device__ uint4 pack(const Acc (&v)[kElems]) {
    if constexpr (sizeof(T) == 2 && std::is_same<Acc, float>::value) {
      uint32_t w[kElems / 2];
#pragma unroll
      for (int i = 0; i < kElems / 2; ++i) {
        w[i] = pack_two<T>(v[memory_element(2 * i)], v[memory_element(2 * i + 1)]);
      }
      return make_uint4(w[0], w[1], w[2], w[3]);
    }
    T raw[kElems];
#pragma unroll
    for (int e = 0; e < kElems; ++e) raw[memory_element(e)] = from_acc<T>(v[e]);
    uint4 u;
    memcpy(&u, raw, 16);
    return u;
  }
};

// b where take_b, else a, word by word: selects, where indexing registers by
// a value that differs across a warp would put them in local memory.
__device__ inline uint4 pick_vector(bool take_b, const uint4& a, const uint4& b) {
  return make_uint4(take_b ? b.x : a.x, take_b ? b.y : a.y, take_b ? b.z : a.z,
                    take_b ? b.w : a.w);
}

// r[j] becomes r[(j + by) % 4], by selects (`by` may differ across a warp).
__device__ inline void rotate_four(uint4 (&r)[4], int by) {
  const bool one = by & 1, two = by & 2;
  const uint4 b0 = pick_vector(one, r[0], r[1]), b1 = pick_vector(one, r[1], r[2]),
              b2 = pick_vector(one, r[2], r[3]), b3 = pick_vector(one, r[3], r[0]);
  r[0] = pick_vector(two, b0, b2);
  r[1] = pick_vector(two, b1, b3);
  r[2] = pick_vector(two, b2, b0);
  r[3] = pick_vector(two, b3, b1);
}

// The same for runs of N = 1, 2 or 4 vectors.
template <int N>
__device__ inline void rotate_vectors(uint4 (&r)[N], int by) {
  static_assert(N == 1 || N == 2 || N == 4, "a run of one, two or four vectors");
  if constexpr (N == 4) {
    rotate_four(r, by);
  } else if constexpr (N == 2) {
    const bool swap = by & 1;
    const uint4 a = r[0], b = r[1];
    r[0] = pick_vector(swap, a, b);
    r[1] = pick_vector(swap, b, a);
  }
}

// Element e of a run held as N raw 16-byte vectors of T, as an Acc; and
// element e set from one.
template <typename T, typename Acc, int N>
__device__ inline Acc run_element(const uint4 (&raw)[N], int e) {
  return raw_element<T, Acc>(reinterpret_cast<const unsigned char*>(raw), e);
}
template <typename T, typename Acc, int N>
__device__ inline void set_run_element(uint4 (&raw)[N], int e, Acc value) {
  const T t = from_acc<T>(value);
  memcpy(reinterpret_cast<unsigned char*>(raw) + e * sizeof(T), &t, sizeof(T));
}

// Where a thread whose run is N consecutive vectors of a stage (runs of
// consecutive threads side by side) starts reading them: walking vector
// (q + rotation) % N at step q, the eight threads of a quarter warp fall in
// eight different 16-byte bank groups at every step, where in order they
// would meet in 8 / N of them. rotate_vectors(r, N - rotation) then puts
// the vectors in order.
template <int N>
__device__ inline int staggered_rotation() {
  if constexpr (N == 4) return (threadIdx.x >> 1) & 3;
  if constexpr (N == 2) return (threadIdx.x >> 2) & 1;
  return 0;
}

// A scanned tile, written into its stage by the block's threads, out to
// `dst` by one bulk copy, thread 0's (tiles with kBulkStores). Thread 0 must
// let the copy read the stage (bulk_store_wait_read) before the stage is
// asked for again, and finish it (bulk_store_wait_all) before the block
// exits: staged_rows_kernel does both.
__device__ inline void store_stage_by_bulk_copy(void* dst, const void* stage, uint32_t bytes) {
  fence_proxy_async_shared();  // the threads' writes, before the copy engine reads them
  __syncthreads();
  if (threadIdx.x == 0) bulk_store_to_global(dst, stage, bytes);
}

// The run layout's run: kStagedVectors vectors, thread t's in scan order.
//
// Runs start 64 bytes apart, so the eight threads of a quarter warp, each
// reading its j-th vector, meet in two of the eight 16-byte bank groups,
// four to a group (four times the shared memory wavefronts). For
// four-byte elements each thread instead walks its vectors from a
// different one -- step q takes vector (q + rotation) % 4, rotation =
// thread / 2 % 4 -- which puts those eight threads in eight groups at every
// step, and then rotates the vectors into place in registers. Two-byte
// runs, twice as long, spend more per byte on their exps and logs, and the
// rotation's selects cost them more than the conflicts (H100,
// logcumsumexp [1, 16M]: float32 84.6 -> 81.5 us with it, bfloat16 55.8
// -> 58.3 to 59.3).
// A row's short tile in the run layout is first made whole in its stage
// (complete_short_stage), so a run is always read from the stage: read
// element by element from memory, as the vector layout reads a short tile,
// two-byte runs of 32 held more registers than the whole ones and set the
// kernel's count (84 bytes of spill at 80 registers; none without).
template <typename Op, bool kReverse>
struct StagedRun {
  using Vector = StagedVector<Op, kReverse, true>;
  using Acc = StateOf<Op>;
  using T = typename Op::Storage;
  using Part = Acc[Vector::kElems];
  static constexpr int kLen = kStagedVectors * Vector::kElems;
  static constexpr bool kRotate = sizeof(T) == 4;
  static_assert(kStagedVectors == 4, "a thread's run is four vectors");

  static __device__ int vector(int j) { return threadIdx.x * kStagedVectors + j; }
  static __device__ int rotation() { return kRotate ? staggered_rotation<4>() : 0; }
  static __device__ Part& part(Acc (&v)[kLen], int j) {
    return *reinterpret_cast<Part*>(v + j * Vector::kElems);
  }
  static __device__ void rotate(uint4 (&r)[4], int by) {
    if constexpr (kRotate) rotate_four(r, by);
  }

  static __device__ void load(const StagedTile<T>& t, Acc (&v)[kLen]) {
    const int rot = rotation();
    uint4 r[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) r[q] = t.stage[Vector::memory_vector(vector((q + rot) & 3))];
    rotate(r, (4 - rot) & 3);
#pragma unroll
    for (int j = 0; j < 4; ++j) Vector::unpack(r[j], part(v, j));
  }

  // The tile goes back through its stage, then out in the vector layout's
  // order, each warp's stores 512 contiguous bytes: a thread's own run
  // stored directly would leave every 16-byte store a quarter of the 64
  // bytes the thread writes, and half of each sector it touches. A short
  // tile stores its elements inside the row alone. The stage is read until
  // the caller's next barrier.
  // Whole four-byte tiles (kBulkStores) leave the stage by one bulk copy,
  // thread 0's, which the caller lets finish reading the stage before the
  // stage is refilled (H100, [1, 16M], launcher timer, us: float32
  // 69.1-70.0 -> 68.3-68.5; bfloat16 unchanged at 48.0-48.7, so two-byte
  // tiles keep the threads' stores).
  static constexpr bool kBulkStores = sizeof(T) == 4;
  static __device__ void store(const StagedTile<T>& t, Acc (&v)[kLen]) {
    const int rot = rotation();
    uint4 r[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) r[j] = Vector::pack(part(v, j));
    rotate(r, rot);
#pragma unroll
    for (int q = 0; q < 4; ++q) t.stage[Vector::memory_vector(vector((q + rot) & 3))] = r[q];
    if (kBulkStores && t.valid == kStagedTileLen<T>) {
      store_stage_by_bulk_copy(t.dst, t.stage, kStagedTileBytes);
      return;
    }
    __syncthreads();
    uint4* dst = reinterpret_cast<uint4*>(t.dst);
    const T* staged = reinterpret_cast<const T*>(t.stage);
#pragma unroll
    for (int c = 0; c < kStagedVectors; ++c) {
      const int m = c * kScanBlock + threadIdx.x;
      const int64_t first = int64_t{m} * Vector::kElems;
      if (first + Vector::kElems <= t.valid) {
        dst[m] = t.stage[m];
      } else {
        for (int64_t p = first; p < t.valid; ++p) t.dst[p] = staged[p];
      }
    }
    // The copy engine writes this stage next, after the loop's barrier.
    fence_proxy_async_shared();
  }
};

// Makes a row's short tile whole in its stage for the run layout: the
// elements the copy engine left out (the row's last partial vector) read
// from memory, the positions past the row set to the identity (which a
// scan may take anywhere: the identity joined to a state gives the state
// bit for bit, and results past the row are not stored). Ends behind a
// barrier.
template <typename Op>
__device__ void complete_short_stage(const Op& op, const StagedTile<typename Op::Storage>& t) {
  using T = typename Op::Storage;
  T* staged = reinterpret_cast<T*>(t.stage);
  const T identity = from_acc<T>(op.identity());
  for (int64_t p = t.staged + threadIdx.x; p < kStagedTileLen<T>; p += kScanBlock) {
    staged[p] = p < t.valid ? t.src[p] : identity;
  }
  __syncthreads();
}

// What a thread keeps of a folded tile in the vector layout: for each of
// its vectors, everything in the tile before it, and each chunk's total (a
// chunk being the block's q-th vectors, q = c * kScanBlock + thread).
template <typename Acc>
struct StagedVectorFold {
  Acc before[kStagedVectors];
  Acc chunk_total[kStagedVectors];
};

// In the run layout: everything in the tile before the thread's run. (The
// run itself is loaded and folded again for the scan: kept in registers
// across the next tile's fold, float32 runs spilled and took 92.8 us
// rather than 81.4 on [1, 16M], H100.)
template <typename Op>
struct StagedRunFold {
  TotalOf<Op> before;
};

template <typename Op>
using StagedFold =
    std::conditional_t<kStagedRuns<Op>, StagedRunFold<Op>, StagedVectorFold<StateOf<Op>>>;

// Where a block's warps meet while it folds a tile.
template <typename Op>
struct StagedWarpTotals {
  StateOf<Op> of[kScanBlock / 32][kStagedVectors];
};
template <typename Op>
using StagedScratch = std::conditional_t<kStagedRuns<Op>,
                                         typename BlockTotalsScan<TotalsOf<Op>>::TempStorage,
                                         StagedWarpTotals<Op>>;

// Folds a staged tile in the vector layout; returns its total (in every
// thread). The block's warps meet in `warp_totals` between two barriers.
template <typename Op, bool kReverse, bool kWhole>
__device__ StateOf<Op> fold_staged_tile(const Op& op, const StagedTile<typename Op::Storage>& t,
                                        StagedVectorFold<StateOf<Op>>& f,
                                        StagedWarpTotals<Op>& warp_totals) {
  using Acc = StateOf<Op>;
  using Vector = StagedVector<Op, kReverse, kWhole>;
  constexpr int kWarps = kScanBlock / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  Acc excl[kStagedVectors];
#pragma unroll
  for (int c = 0; c < kStagedVectors; ++c) {
    Acc v[Vector::kElems];
    Vector::load(op, t, c * kScanBlock + threadIdx.x, v);
    Acc run = v[0];
#pragma unroll
    for (int e = 1; e < Vector::kElems; ++e) run = op.combine(run, v[e]);
    Acc incl = run;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const Acc up = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl = op.combine(up, incl);
    }
    excl[c] = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl[c] = op.identity();
    if (lane == 31) warp_totals.of[warp][c] = incl;
  }
  __syncthreads();
  Acc tile_total = op.identity();
#pragma unroll
  for (int c = 0; c < kStagedVectors; ++c) {
    Acc before = op.identity(), total = op.identity();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const Acc wt = warp_totals.of[w][c];
      if (w < warp) before = op.combine(before, wt);
      total = op.combine(total, wt);
    }
    f.before[c] = op.combine(before, excl[c]);
    f.chunk_total[c] = total;
    tile_total = op.combine(tile_total, total);
  }
  __syncthreads();  // warp_totals free for the next fold
  return tile_total;
}

// Scans a tile folded in the vector layout from everything before it and
// stores it.
template <typename Op, bool kReverse, bool kWhole>
__device__ void scan_staged_tile(const Op& op, const StagedTile<typename Op::Storage>& t,
                                 const StagedVectorFold<StateOf<Op>>& f, StateOf<Op> carry) {
  using Acc = StateOf<Op>;
  using Vector = StagedVector<Op, kReverse, kWhole>;
#pragma unroll
  for (int c = 0; c < kStagedVectors; ++c) {
    const int q = c * kScanBlock + threadIdx.x;
    Acc v[Vector::kElems];
    Vector::load(op, t, q, v);
    Acc run = op.combine(carry, f.before[c]);
#pragma unroll
    for (int e = 0; e < Vector::kElems; ++e) v[e] = run = op.combine(run, v[e]);
    Vector::store(t, q, v);
    carry = op.combine(carry, f.chunk_total[c]);
  }
}

// A staged tile's runs joined in thread order, the last step of a run
// layout's fold: `before` gets everything in the tile before the thread's
// run; returns the tile's total, in every thread, with `scratch` free again.
template <typename Totals>
__device__ StateOf<Totals> join_staged_runs(typename BlockTotalsScan<Totals>::TempStorage& scratch,
                                            const Totals& totals, const StateOf<Totals>& mine,
                                            StateOf<Totals>& before) {
  StateOf<Totals> tile_total;
  BlockTotalsScan<Totals>::exclusive(scratch, totals, mine, before, tile_total);
  __syncthreads();  // scratch free for the next fold
  return tile_total;
}

// The run layout's fold: the thread's run folded, the block's runs joined.
// A short tile's stage is made whole first, for this fold and its scan.
template <typename Op, bool kReverse>
__device__ TotalOf<Op> fold_staged_runs(const Op& op, const StagedTile<typename Op::Storage>& t,
                                        StagedRunFold<Op>& f, StagedScratch<Op>& scratch) {
  using Run = StagedRun<Op, kReverse>;
  if (t.valid < kStagedTileLen<typename Op::Storage>) complete_short_stage(op, t);
  StateOf<Op> v[Run::kLen];
  Run::load(t, v);
  RunMemoOf<Op> memo;
  return join_staged_runs(scratch, totals_of(op), fold_run(op, v, memo), f.before);
}

// The run layout's scan: the run loaded and folded again (fold_run leaves
// in it what scan_thread_run reads), scanned from `carry` and stored.
template <typename Op, bool kReverse>
__device__ void scan_staged_runs(const Op& op, const StagedTile<typename Op::Storage>& t,
                                 const StagedRunFold<Op>& f, TotalOf<Op> carry) {
  using Run = StagedRun<Op, kReverse>;
  StateOf<Op> v[Run::kLen];
  Run::load(t, v);
  RunMemoOf<Op> memo;
  fold_run(op, v, memo);
  scan_thread_run(op, totals_of(op).combine(carry, f.before), v, memo);
  Run::store(t, v);
}

// Folds a staged tile (into `f`, what its scan needs); returns its total.
template <typename Op, bool kReverse>
__device__ TotalOf<Op> fold_staged(const Op& op, const StagedTile<typename Op::Storage>& t,
                                   StagedFold<Op>& f, StagedScratch<Op>& scratch) {
  if constexpr (kStagedRuns<Op>) {
    return fold_staged_runs<Op, kReverse>(op, t, f, scratch);
  } else {
    const bool whole = t.valid == kStagedTileLen<typename Op::Storage>;
    return whole ? fold_staged_tile<Op, kReverse, true>(op, t, f, scratch)
                 : fold_staged_tile<Op, kReverse, false>(op, t, f, scratch);
  }
}

// Scans a folded tile from `carry`, everything before it, and stores it.
template <typename Op, bool kReverse>
__device__ void scan_staged(const Op& op, const StagedTile<typename Op::Storage>& t,
                            const StagedFold<Op>& f, TotalOf<Op> carry) {
  if constexpr (kStagedRuns<Op>) {
    scan_staged_runs<Op, kReverse>(op, t, f, carry);
  } else {
    if (t.valid == kStagedTileLen<typename Op::Storage>) {
      scan_staged_tile<Op, kReverse, true>(op, t, f, carry);
    } else {
      scan_staged_tile<Op, kReverse, false>(op, t, f, carry);
    }
  }
}

// Publishes tile `tile`'s total (warp 0), and where the tile closes a group
// that later tiles depend on, the group's total in tile_prefix's order, each
// under the launch's ready mark.
template <typename Op>
__device__ void publish_staged_total(const Op& op, const StateOf<Op>& total,
                                     FlaggedState<StateOf<Op>>* row_tiles,
                                     FlaggedState<StateOf<Op>>* row_groups, int64_t tile,
                                     int64_t groups, uint64_t mark) {
  if (threadIdx.x >= 32) return;
  const int64_t group = tile / kGroupTiles;
  const int64_t group_first = group * kGroupTiles;
  if (threadIdx.x == 0) publish_flagged(row_tiles + tile, total, mark);
  if (tile - group_first == kGroupTiles - 1 && group + 1 < groups) {
    const StateOf<Op> v = fold_group_tiles(op, row_tiles + group_first, kGroupTiles - 1, mark);
    if (threadIdx.x == 0) publish_flagged(row_groups + group, op.combine(v, total), mark);
  }
}

// Publishes tile `tile`'s total alone (thread 0), as kStride's tiles do.
// Warp 0 alone goes past the first test, as in publish_staged_total: the
// measured kernels were built this way, and writing it shorter changed
// their code (benchmarks/RESULTS.md, the stride look-back section).
template <typename State>
__device__ void publish_tile_total(const State& total, FlaggedState<State>* row_tiles,
                                   int64_t tile, uint64_t mark) {
  if (threadIdx.x >= 32) return;
  if (threadIdx.x == 0) publish_flagged(row_tiles + tile, total, mark);
}

// Everything before tile `tile` of its row, as tile_prefix folds it.
template <typename Op>
__device__ StateOf<Op> staged_prefix(const Op& op, const FlaggedState<StateOf<Op>>* row_tiles,
                                     const FlaggedState<StateOf<Op>>* row_groups, int64_t tile,
                                     uint64_t mark) {
  const int64_t group = tile / kGroupTiles;
  const int64_t group_first = group * kGroupTiles;
  const StateOf<Op> v =
      threadIdx.x < 32 ? fold_group_tiles(op, row_tiles + group_first, tile - group_first, mark)
                       : fold_warp(op, fold_earlier_groups(op, row_groups, group, mark));
  return join_prefix_folds(op, v);
}

// How a staged round reads its tile's prefix (Tiles::kPrefixReads): in one
// step after the next tile's fold (staged_prefix), or in two, for tiles
// whose fold is long enough to hide a round trip to L2. start_staged_prefix
// puts the thread's first read in flight (warp 0: its lane's earlier tile
// of the group; the other warps: the first of their run of earlier groups)
// before the next tile is folded, into a copy in shared memory by cp.async
// or into registers; finish_staged_prefix takes it, reads the rest and
// joins the warps' folds. The shared copies cost a block 4 KiB, the
// registers four a thread across the fold.
enum class PrefixReads { kAfterFold, kEarlyShared, kEarlyRegisters };

// The slots a thread reads:
template <typename State>
struct StagedPrefixSlots {
  const FlaggedState<State>* slots;
  SlotRange range;  // of `slots`, this thread's
};

template <typename State>
__device__ StagedPrefixSlots<State> staged_prefix_slots(const FlaggedState<State>* row_tiles,
                                                        const FlaggedState<State>* row_groups,
                                                        int64_t tile) {
  const int64_t group = tile / kGroupTiles;
  if (threadIdx.x < 32) {
    const int64_t lane = threadIdx.x;
    const int64_t earlier = tile - group * kGroupTiles;
    return {row_tiles + group * kGroupTiles, {lane, lane < earlier ? lane + 1 : lane}};
  }
  return {row_groups, earlier_groups_of_thread(group)};
}

// `copy`: the thread's own slot of the block's shared copies, or registers.
template <PrefixReads kReads, typename State>
__device__ void start_staged_prefix(FlaggedState<State>& copy,
                                    const FlaggedState<State>* row_tiles,
                                    const FlaggedState<State>* row_groups, int64_t tile) {
  const StagedPrefixSlots<State> mine = staged_prefix_slots(row_tiles, row_groups, tile);
  if (mine.range.begin < mine.range.end) {
    if constexpr (kReads == PrefixReads::kEarlyShared) {
      issue_flagged_read(&copy, mine.slots + mine.range.begin);
    } else {
      load_flagged_words(mine.slots + mine.range.begin, copy);
    }
  }
}

template <PrefixReads kReads, typename Op>
__device__ StateOf<Op> finish_staged_prefix(const Op& op,
                                            const FlaggedState<StateOf<Op>>& copy,
                                            const FlaggedState<StateOf<Op>>* row_tiles,
                                            const FlaggedState<StateOf<Op>>* row_groups,
                                            int64_t tile, uint64_t mark) {
  using State = StateOf<Op>;
  const StagedPrefixSlots<State> mine = staged_prefix_slots(row_tiles, row_groups, tile);
  State v = op.identity();
  if (mine.range.begin < mine.range.end) {
    const FlaggedState<State>* first = mine.slots + mine.range.begin;
    const State got = kReads == PrefixReads::kEarlyShared ? wait_flagged_read(&copy, first, mark)
                                                          : take_flagged_read(copy, first, mark);
    // Warp 0 takes its tile's total as it is, the others fold onto the
    // identity (fold_group_tiles, fold_earlier_groups).
    v = threadIdx.x < 32 ? got : op.combine(v, got);
    v = fold_published_onto(op, v, mine.slots, mine.range.begin + 1, mine.range.end, mark);
  }
  return join_prefix_folds(op, fold_warp(op, v));
}

// How a tiles type finds a tile's prefix among the published totals (its
// kLookBack):
// - kGroups, in tile_prefix's order (above, and scan_publish.cuh): warp 0
//   folds the earlier tiles of the tile's group of 32, the other warps the
//   earlier groups' totals. The block whose tile closes a group publishes
//   the group's total once it has read its 31 peers' totals, which other
//   blocks fold in the same round: that block's fold then takes 4-9 us
//   where the others take 1-2 (H100, [1, 16M], benchmarks/RESULTS.md), and
//   every tile after the group waits for it. The association depends on
//   the tile's position alone.
// - kStride: a block's tiles are `step` (the grid's blocks) apart, so its
//   previous tile's prefix, which it found a round before, and the totals of
//   the `step` tiles from that tile to this one make this tile's prefix.
//   Those totals are read a few a thread (stride_slots_of_thread) and folded
//   in tile order. No tile waits for a closer, and no group total is
//   published; every tile reads `step` totals where kGroups reads about
//   100. The association depends on the tile's position and the grid's
//   size, the same for every launch on one GPU, so results are still
//   bit-identical run to run.
// Which way a tiles type goes was measured (H100, [1, 16M], RESULTS.md):
// kStride where it was faster (the vector layout's tiles, float32 gradient
// and cummax / cummin tiles, and cumprod gradient tiles of every dtype),
// kGroups elsewhere.
enum class LookBack { kGroups, kStride };

// kStride's totals to fold, those of tiles [lo, tile) with lo the block's
// own previous tile (tile - step) or the row's first: thread t's run of
// them, the runs in thread order, none more than one longer than another.
__device__ inline SlotRange stride_slots_of_thread(int64_t tile, int64_t step) {
  const int64_t lo = tile >= step ? tile - step : 0;
  const int64_t count = tile - lo;
  const int64_t q = count / kScanBlock, r = count % kScanBlock, t = threadIdx.x;
  const int64_t begin = lo + t * q + (t < r ? t : r);
  return {begin, begin + q + (t < r ? 1 : 0)};
}

// kStride's slots, those of the tiles' totals, in staged_prefix_slots'
// shape: the measured kernels read them so, and reading the SlotRange
// directly changed their code.
template <typename State>
__device__ StagedPrefixSlots<State> stride_prefix_slots(const FlaggedState<State>* row_tiles,
                                                        int64_t tile, int64_t step) {
  return {row_tiles, stride_slots_of_thread(tile, step)};
}

// Where kStride's early reads go: `first` and, with two early reads,
// `second` -- the thread's own slots of the block's shared copies, or
// registers.
template <typename State>
struct EarlyReads {
  FlaggedState<State>& first;
  FlaggedState<State>& second;
};

// kStride's early reads: the first one or two (kEarly) of the thread's run.
template <PrefixReads kReads, int kEarly, typename State>
__device__ void start_stride_prefix(EarlyReads<State> copies,
                                    const FlaggedState<State>* row_tiles, int64_t tile,
                                    int64_t step) {
  const StagedPrefixSlots<State> mine = stride_prefix_slots(row_tiles, tile, step);
  if (mine.range.begin < mine.range.end) {
    if constexpr (kReads == PrefixReads::kEarlyShared) {
      issue_flagged_read(&copies.first, mine.slots + mine.range.begin);
      if (kEarly == 2 && mine.range.begin + 1 < mine.range.end) {
        issue_flagged_read(&copies.second, mine.slots + mine.range.begin + 1);
      }
    } else {
      load_flagged_words(mine.slots + mine.range.begin, copies.first);
      if (kEarly == 2 && mine.range.begin + 1 < mine.range.end) {
        load_flagged_words(mine.slots + mine.range.begin + 1, copies.second);
      }
    }
  }
}

// kStride's prefix of tile `tile`: the early reads (kEarly of them; none
// with kAfterFold), the rest of the thread's run all in flight at once (at
// most three slots a thread where a grid holds up to 4 x 132 blocks), the
// threads' folds joined in order, after `own_prefix`, the prefix of the
// block's previous tile where that tile is in the row. With
// kJoinOnOwnPrefix, scaled sums are joined first by
// join_folds_on_reference (scan_publish.cuh), against own_prefix's
// exponent, and by the joins only where it declines.
// The shape of this function and of start_stride_prefix is measured, not
// incidental. Written with the early reads' address and count kept from
// the start (one fold of the totals after an `if` on the early reads), the
// thread's slot range was computed once, before the next tile's fold, and
// used after it; in this form it is computed again after the fold. Two-byte
// cumprod gradient tiles, at 80 registers, took 62.7-64.4 us in that form
// and take 57.9-58.6 in this one (H100, [1, 16M], launcher timer, one
// machine start), though this one's SASS spills 40 bytes.
template <PrefixReads kReads, int kEarly, bool kJoinOnOwnPrefix, typename Op>
__device__ StateOf<Op> finish_stride_prefix(const Op& op, EarlyReads<StateOf<Op>> copies,
                                            const FlaggedState<StateOf<Op>>* row_tiles,
                                            int64_t tile, int64_t step,
                                            const StateOf<Op>& own_prefix, uint64_t mark) {
  using State = StateOf<Op>;
  const StagedPrefixSlots<State> mine = stride_prefix_slots(row_tiles, tile, step);
  State v = op.identity();
  if constexpr (kReads == PrefixReads::kAfterFold) {
    v = fold_published_onto<Op, 4>(op, v, mine.slots, mine.range.begin, mine.range.end, mark);
  } else if (mine.range.begin < mine.range.end) {
    const FlaggedState<State>* first = mine.slots + mine.range.begin;
    const State got = kReads == PrefixReads::kEarlyShared
                          ? wait_flagged_read(&copies.first, first, mark)
                          : take_flagged_read(copies.first, first, mark);
    // Warp 0 takes its first total as it is, the others fold it onto the
    // identity (which leaves it bit for bit), as staged_prefix's warps do.
    v = threadIdx.x < 32 ? got : op.combine(v, got);
    int64_t rest = mine.range.begin + 1;
    if constexpr (kEarly == 2) {
      if (rest < mine.range.end) v = op.combine(v, take_flagged_read(copies.second, first + 1, mark));
      ++rest;  // past the end where there was no second slot: nothing left to fold
    }
    v = fold_published_onto<Op, 4>(op, v, mine.slots, rest, mine.range.end, mark);
  }
  if constexpr (kJoinOnOwnPrefix && kScansByReference<State>) {
    State joined;
    // A block's first tile of a row has no earlier tile of its own: its
    // lead is a sum of 0 against own_prefix's exponent (the block's first
    // tile's total, or its tile's prefix in the row before), a reference
    // near the data's values.
    const State lead = tile >= step ? own_prefix : State{own_prefix.m, 0.f};
    if (join_folds_on_reference(lead, v, joined)) return joined;
  }
  const State between = join_warp_folds<0>(op, fold_warp(op, v));
  return tile >= step ? op.combine(own_prefix, between) : between;
}

// The tiles were measured at Tiles::kBlocksPerSm blocks an SM; their shared
// memory must let that many in, or fewer run, silently (two-byte cumprod
// gradient tiles once ran two where they meant three: launch_staged_tiles,
// scan_launch.cuh, asserts it). A block holds its stages, `early` shared
// copies of a prefix read for each thread (with kEarlyShared), the stages'
// barriers and a few hundred bytes of fold scratch (counted as 1 KiB), and the
// driver reserves 1 KiB more; compute capability 9.0 gives an SM 228 KiB.
constexpr int64_t kStagedSharedBytesPerSm = 228 * 1024;
constexpr int64_t kStagedSharedBytesAside = 2 * 1024;  // fold scratch, driver's reserve

// Where a tiles type's stages must start (kStageAlign, where it names one:
// a swizzled stage starts where its pattern does); the dynamic shared
// memory is asked for with that much more, to start the stages there.
template <typename Tiles, typename = void>
struct StageAlignOf {
  static constexpr int value = 128;
};
template <typename Tiles>
struct StageAlignOf<Tiles, std::enable_if_t<(Tiles::kStageAlign > 0)>> {
  static constexpr int value = Tiles::kStageAlign;
};
template <typename Tiles>
constexpr int staged_dynamic_shared_bytes() {
  constexpr int kAlign = StageAlignOf<Tiles>::value;
  return Tiles::kStages * Tiles::kStageBytes + (kAlign > 128 ? kAlign : 0);
}

template <typename Tiles>
constexpr int64_t staged_block_shared_bytes(int early) {
  using Flagged = FlaggedState<typename Tiles::Total>;
  return int64_t{staged_dynamic_shared_bytes<Tiles>()} + int64_t{Tiles::kStages} * 8 +
         (Tiles::kPrefixReads == PrefixReads::kEarlyShared ? int64_t{kScanBlock} * early : 1) *
             int64_t{sizeof(Flagged)} +
         kStagedSharedBytesAside;
}

// How many reads a round puts in flight before the next tile's fold: none
// after the fold; one with kGroups; with kStride two, where in shared memory
// the second copy (4 KiB) still lets Tiles::kBlocksPerSm blocks onto an SM,
// else one.
template <typename Tiles>
constexpr int staged_early_reads() {
  if (Tiles::kPrefixReads == PrefixReads::kAfterFold) return 0;
  if (Tiles::kLookBack == LookBack::kGroups) return 1;
  if (Tiles::kPrefixReads == PrefixReads::kEarlyRegisters) return 2;
  return Tiles::kBlocksPerSm * staged_block_shared_bytes<Tiles>(2) <= kStagedSharedBytesPerSm ? 2
                                                                                              : 1;
}

// Blocks per SM: four, as many as the stages' shared memory allows, where
// the registers of float states fit, float32 runs included (64 registers
// since short tiles are completed in the stage; no spill forward, 12 bytes
// reversed: H100, launcher timer, logcumsumexp [1, 16M] 72.3-73.4 ->
// 68.8-69.7 us, three runs each). float64 states take three, and so do
// two-byte runs of 32 (80 registers; at four they spill 100-116 bytes and
// took 48.8-49.1 -> 51.6-52.0 us). Earlier, logcumsumexp [1, 16M]
// before the rotation above: float32 99.2 / 84.6 / 82.0 us at two / three /
// four blocks (at four with 16 bytes of spill), bfloat16 60.2 / 55.8 /
// 59.4 (then spilling about 100 bytes at three, 250 at four, none at two).
template <typename Op>
constexpr int kStagedBlocksPerSm =
    sizeof(StateOf<Op>) > 4 || (kStagedRuns<Op> && sizeof(typename Op::Storage) < 4) ? 3 : 4;

// The tiles of the ops above: a tile of one array staged whole, folded and
// scanned in the vector or the run layout. A staged kernel's tiles (this
// one, StagedExtremeTiles, scan_staged_extremes.cuh, or the gradient tiles
// of scan_staged_cumprod_grad.cuh and scan_staged_logcumsumexp_grad.cuh)
// say how a tile is placed
// (place), asked of the copy engine (request: thread 0 only), folded into
// what its scan needs (fold, every thread; returns its total) and scanned
// from everything before it and stored (scan); how its prefix is found
// among the published totals (kLookBack); whether the reads of a tile's
// prefix go out before the next tile's fold (kPrefixReads); and whether the
// scan takes part of its input from memory, read by prefetch before the
// wait for the prefix and handed to the scan (kPrefetches); and whether its
// scan stores whole tiles by a bulk copy from the stage, thread 0's, which
// must have read the stage before the stage is asked for again
// (kBulkStores), and whether the stage is asked for again right after its
// scan or only after the next tile's fold (kDeferredRequests); and whether
// a round's early prefix reads go out at its start or only once the next
// tile's data is in (kEarlyReadsAfterData); and whether kStride's prefix
// joins the totals as one sum against a reference exponent where that is
// safe (kJoinOnOwnPrefix: finish_stride_prefix). Tiles copied
// by tensor maps (StagedSwizzledRunTiles, scan_staged_swizzled_runs.cuh;
// StagedSwizzledGradTiles, scan_staged_swizzled_grad.cuh) name them as
// Maps, handed to request and scan, and where their stages must start
// (kStageAlign).
template <typename Op, bool kReverse>
struct StagedPlainTiles {
  using Totals = TotalsOf<Op>;
  using Total = TotalOf<Op>;
  using Fold = StagedFold<Op>;
  static constexpr int64_t kTileLen = kStagedTileLen<typename Op::Storage>;
  static constexpr int kStageBytes = kStagedTileBytes;
  static constexpr int kBlocksPerSm = kStagedBlocksPerSm<Op>;
  static constexpr int kStages = kStagedStages;
  // Only the run layout's fold (logcumsumexp forward) is long enough to
  // hide the prefix's reads. H100, [1, 16M], launcher timer: logcumsumexp
  // forward float32 73.5-73.8 -> 72.2-73.5 us; cumsum forward, where the
  // reads went out early too, float32 55.9 -> 60.0, bfloat16 33.1 -> 35.9.
  static constexpr PrefixReads kPrefixReads =
      kStagedRuns<Op> ? PrefixReads::kEarlyShared : PrefixReads::kAfterFold;
  // The run layout (logcumsumexp forward) joins totals by an exp each, and
  // took longer with kStride's longer folds: H100, [1, 16M], launcher timer,
  // float32 69.2-70.2 -> 76.0-76.2 us, bfloat16 48.4-48.6 -> 49.3-51.3. The
  // vector layout's: float32 cumsum 55.1-55.5 -> 52.8-53.5, bfloat16
  // 31.7-32.2 -> 30.8-31.0.
  static constexpr LookBack kLookBack = kStagedRuns<Op> ? LookBack::kGroups : LookBack::kStride;
  static constexpr bool kPrefetches = false;
  static constexpr bool kBulkStores = kStagedRuns<Op> && StagedRun<Op, kReverse>::kBulkStores;
  static constexpr bool kDeferredRequests = false;
  static constexpr bool kEarlyReadsAfterData = false;
  static constexpr bool kJoinOnOwnPrefix = false;
  // The run layout's tiles (logcumsumexp forward) come in with their L2
  // lines marked to go first: they are read once, and so leave L2 to the
  // published totals and what the scans wrote. H100, [1, 16M], launcher
  // timer, three runs each, in two machine starts: float32 67.8-69.0 ->
  // 66.3-66.7 us and 67.6-68.8 -> 67.0-68.3; bfloat16 47.7-48.9 ->
  // 46.8-47.3 and 48.2-48.6 -> 46.7-47.3 (the first start with every
  // staged tile marked). The other tiles keep the normal lines: marked,
  // float32 cumsum took 52.8-53.3 -> 54.0-54.3 and float32 logcumsumexp
  // backward 103.2-103.7 -> 104.9-105.5.
  static constexpr L2Lines kLoadLines = kStagedRuns<Op> ? L2Lines::kEvictFirst : L2Lines::kNormal;
  Op op;
  int64_t len, tiles;

  __device__ Totals totals() const { return totals_of(op); }
  __device__ StagedTiling<typename Op::Storage, kReverse> tiling() const {
    return {op.src, op.dst, len, tiles};
  }
  __device__ StagedPlace place(int64_t g) const { return tiling().place(g); }
  __device__ void request(const StagedPlace& p, unsigned char* stage, uint64_t* full) const {
    tiling().template request<kLoadLines>(p, stage, full);
  }
  __device__ Total fold(const StagedPlace& p, unsigned char* stage, Fold& f) const {
    __shared__ StagedScratch<Op> scratch;
    return fold_staged<Op, kReverse>(op, tiling().view(p, stage), f, scratch);
  }
  __device__ void scan(const StagedPlace& p, unsigned char* stage, const Fold& f,
                       const Total& prefix) const {
    scan_staged<Op, kReverse>(op, tiling().view(p, stage), f, prefix);
  }
};

// The tensor maps a tiles type's copies name (Tiles::Maps, where it has
// them), a kernel parameter of their own: the copy engine reads a map from
// parameter space only through a __grid_constant__ parameter, and the other
// tiles keep their parameter as it was measured. NoTensorMaps elsewhere.
struct NoTensorMaps {};
template <typename Tiles, typename = void>
struct TensorMapsTrait {
  using type = NoTensorMaps;
};
template <typename Tiles>
struct TensorMapsTrait<Tiles, std::void_t<typename Tiles::Maps>> {
  using type = typename Tiles::Maps;
};
template <typename Tiles>
using TensorMapsOf = typename TensorMapsTrait<Tiles>::type;

// Tiles::request and Tiles::scan, handed the maps where the tiles have them.
template <typename Tiles>
__device__ void request_with_maps(const Tiles& tiles_of, const TensorMapsOf<Tiles>& maps,
                                  const StagedPlace& p, unsigned char* stage, uint64_t* full) {
  if constexpr (std::is_same<TensorMapsOf<Tiles>, NoTensorMaps>::value) {
    tiles_of.request(p, stage, full);
  } else {
    tiles_of.request(p, stage, full, maps);
  }
}
// `pre`: the prefetch, for tiles with kPrefetches.
template <typename Tiles, typename... Prefetched>
__device__ void scan_with_maps(const Tiles& tiles_of, const TensorMapsOf<Tiles>& maps,
                               const StagedPlace& p, unsigned char* stage,
                               const typename Tiles::Fold& f, const typename Tiles::Total& prefix,
                               const Prefetched&... pre) {
  if constexpr (std::is_same<TensorMapsOf<Tiles>, NoTensorMaps>::value) {
    tiles_of.scan(p, stage, f, prefix, pre...);
  } else {
    tiles_of.scan(p, stage, f, prefix, pre..., maps);
  }
}

// Grid: at most one block per tile, every block resident (launched
// cooperatively); dynamic shared memory staged_dynamic_shared_bytes<Tiles>().
// `ws` holds no word with `mark` when the launch starts (scan_publish.cuh).
template <typename Tiles>
__global__ void __launch_bounds__(kScanBlock, Tiles::kBlocksPerSm)
    staged_rows_kernel(Tiles tiles_of, int64_t rows, int64_t groups,
                       LongRowsSlots<typename Tiles::Total> ws, uint64_t mark,
                       const __grid_constant__ TensorMapsOf<Tiles> maps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using Total = typename Tiles::Total;
  const typename Tiles::Totals totals = tiles_of.totals();
  const int64_t tiles = tiles_of.tiles;
  extern __shared__ __align__(128) unsigned char dynamic_shared[];
  unsigned char* const stages = [] {
    constexpr uint32_t kAlign = StageAlignOf<Tiles>::value;
    if constexpr (kAlign > 128) {
      return dynamic_shared + (kAlign - smem_address(dynamic_shared) % kAlign) % kAlign;
    } else {
      return dynamic_shared;
    }
  }();
  __shared__ __align__(8) uint64_t full[Tiles::kStages];
  constexpr PrefixReads kReads = Tiles::kPrefixReads;
  constexpr bool kStride = Tiles::kLookBack == LookBack::kStride;
  constexpr int kEarly = staged_early_reads<Tiles>();
  __shared__ FlaggedState<Total>
      shared_reads[kReads == PrefixReads::kEarlyShared ? kScanBlock * kEarly : 1];
  const int64_t all = rows * tiles;
  const int64_t step = gridDim.x;
  auto stage_of = [&](int slot) { return stages + slot * Tiles::kStageBytes; };
  // A block asks for its first tile alone, and for each of its next
  // kStages - 1 only once the one before it is in. The first round's scans
  // wait for every earlier block's first tile; asked for with every block's
  // second and third at once, the last first tiles came in up to 13 us after
  // the start (median 5), and memory idled behind them. H100, [1, 16M]
  // cumsum: bfloat16 34.4 -> 32.8 us, float32 58.4 -> 55.3-56.6
  // (measured with a block-by-block timeline).
  if (threadIdx.x == 0) {
    for (int s = 0; s < Tiles::kStages; ++s) mbarrier_init(&full[s], 1);
    mbarrier_init_fence();
    request_with_maps(tiles_of, maps, tiles_of.place(blockIdx.x), stage_of(0), &full[0]);
  }
  __syncthreads();
  auto ask_ramp = [&](int k) {  // the block's k-th tile, its (k - 1)-th being in
    const int64_t g = blockIdx.x + k * step;
    if (threadIdx.x == 0 && k < Tiles::kStages && g < all) {
      request_with_maps(tiles_of, maps, tiles_of.place(g), stage_of(k), &full[k]);
    }
  };
  auto publish = [&](const StagedPlace& p, const Total& total) {
    if constexpr (kStride) {
      publish_tile_total(total, ws.tile_totals + p.row * tiles, p.tile, mark);
    } else {
      publish_staged_total(totals, total, ws.tile_totals + p.row * tiles,
                           ws.group_totals + p.row * groups, p.tile, groups, mark);
    }
  };
  typename Tiles::Fold cur, next;
  StagedPlace here = tiles_of.place(blockIdx.x);
  mbarrier_wait(&full[0], 0);
  ask_ramp(1);
  const Total first_total = tiles_of.fold(here, stage_of(0), cur);
  publish(here, first_total);
  // Round i scans tile blockIdx.x + i * step from stage i % Tiles::kStages,
  // whose barrier is then in its (i / Tiles::kStages)-th phase.
  int slot = 0, phase = 0, i = 0;
  // kStride: the block's previous tile's prefix; in the first round, where
  // there is none, the first tile's total, whose exponent is the reference
  // of join_folds_on_reference there.
  Total own_prefix = totals.identity();
  if constexpr (Tiles::kJoinOnOwnPrefix && kScansByReference<Total>) own_prefix = first_total;
  for (int64_t g = blockIdx.x; g < all; g += step, ++i) {
    const auto row_tiles = ws.tile_totals + here.row * tiles;
    const auto row_groups = ws.group_totals + here.row * groups;
    FlaggedState<Total> register_read, register_read2;
    FlaggedState<Total>& early_read =
        kReads == PrefixReads::kEarlyShared ? shared_reads[threadIdx.x] : register_read;
    // kStride's early reads: the second where there is one, else the first
    // again.
    constexpr int kSecond = kEarly == 2 ? 1 : 0;
    const EarlyReads<Total> early =
        kReads == PrefixReads::kEarlyShared
            ? EarlyReads<Total>{shared_reads[threadIdx.x],
                                shared_reads[kSecond * kScanBlock + threadIdx.x]}
            : EarlyReads<Total>{register_read, kSecond == 1 ? register_read2 : register_read};
    auto start_prefix_reads = [&] {
      if constexpr (kStride && kReads != PrefixReads::kAfterFold) {
        start_stride_prefix<kReads, kEarly>(early, row_tiles, here.tile, step);
      } else if constexpr (kReads != PrefixReads::kAfterFold) {
        start_staged_prefix<kReads>(early_read, row_tiles, row_groups, here.tile);
      }
    };
    const bool folds_ahead = g + step < all;
    // With kEarlyReadsAfterData the reads wait for the next tile's data,
    // where there is a next tile to fold: in the first round more of the
    // earlier blocks' first totals are out by then (scan_staged_swizzled_runs.cuh).
    const bool reads_after_data = Tiles::kEarlyReadsAfterData && folds_ahead;
    if (!reads_after_data) start_prefix_reads();
    const int next_slot = slot + 1 == Tiles::kStages ? 0 : slot + 1;
    const int next_phase = next_slot == 0 ? phase ^ 1 : phase;
    StagedPlace there{};
    if (folds_ahead) {
      there = tiles_of.place(g + step);
      mbarrier_wait(&full[next_slot], next_phase);
      if (reads_after_data) start_prefix_reads();
      ask_ramp(i + 2);
      publish(there, tiles_of.fold(there, stage_of(next_slot), next));
    }
    if constexpr (Tiles::kDeferredRequests) {
      // The previous round's stage, asked for again only now: its store has
      // had this fold's time to leave it.
      const int64_t again = g - step + Tiles::kStages * step;
      if (threadIdx.x == 0 && i > 0 && again < all) {
        const int prev_slot = slot == 0 ? Tiles::kStages - 1 : slot - 1;
        bulk_store_wait_read();
        request_with_maps(tiles_of, maps, tiles_of.place(again), stage_of(prev_slot),
                          &full[prev_slot]);
      }
    }
    auto prefix_of_here = [&]() -> Total {
      if constexpr (kStride) {
        return finish_stride_prefix<kReads, kEarly, Tiles::kJoinOnOwnPrefix>(
            totals, early, row_tiles, here.tile, step, own_prefix, mark);
      } else if constexpr (kReads != PrefixReads::kAfterFold) {
        return finish_staged_prefix<kReads>(totals, early_read, row_tiles, row_groups, here.tile,
                                            mark);
      } else {
        return staged_prefix(totals, row_tiles, row_groups, here.tile, mark);
      }
    };
    if constexpr (Tiles::kPrefetches) {
      // The scan's reads from memory go out before the wait for the prefix.
      const typename Tiles::Prefetched pre = tiles_of.prefetch(here);
      const Total prefix = prefix_of_here();
      if constexpr (kStride) own_prefix = prefix;
      scan_with_maps(tiles_of, maps, here, stage_of(slot), cur, prefix, pre);
    } else {
      const Total prefix = prefix_of_here();
      if constexpr (kStride) own_prefix = prefix;
      scan_with_maps(tiles_of, maps, here, stage_of(slot), cur, prefix);
    }
    __syncthreads();  // every thread is done with the stage
    if (!Tiles::kDeferredRequests && threadIdx.x == 0 && g + Tiles::kStages * step < all) {
      if constexpr (Tiles::kBulkStores) bulk_store_wait_read();
      request_with_maps(tiles_of, maps, tiles_of.place(g + Tiles::kStages * step),
                        stage_of(slot), &full[slot]);
    }
    cur = next;
    here = there;
    slot = next_slot;
    phase = next_phase;
  }
  // The shared memory a bulk store reads goes with the block.
  if constexpr (Tiles::kBulkStores) {
    if (threadIdx.x == 0) bulk_store_wait_all();
  }
#endif
}

}  // namespace scan
}  // namespace baracuda
