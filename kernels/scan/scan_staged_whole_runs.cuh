// Staged whole runs: the staged long rows (scan_staged_rows.cuh) for the
// whole-run ops that read several arrays of their storage type at the
// element alone and write one (kWholeRunIo without kReadsNeighbors,
// scan_ops.h: logcumsumexp backward, which reads dy, x and y and writes dx),
// on float32 and two-byte elements. Same loop and conditions as the staged
// long rows (rows starting 16 bytes aligned, compute capability 9.0 and
// up); only the tiles differ. Included by scan.cu. No torch headers.
//
// The copy engine stages each input's part of a tile. Thread t takes the
// tile's 16-byte vectors t * V ... t * V + V - 1 in scan order of every
// input (V = kWholeRunVectors): a run of consecutive elements whose states
// the op's own load builds on a copy of the op pointed at registers
// (unpack_whole_run, scan_block.cuh), as the rows path builds them. The run
// is folded and the block's runs joined; once the tile's prefix is known
// the run is loaded, folded and scanned again (kept in registers across the
// next tile's fold, it would double the states a thread holds). The outputs
// go back through the stage, so that each warp's stores are 512 contiguous
// bytes rather than each store a fraction of every sector it touches. A
// row's last tile in memory, where it is short, is read and written
// element by element, straight from memory.
//
// Measured on H100 (launcher timer, benchmarks/RESULTS.md), logcumsumexp
// backward [1, 16M] against the long_rows kernel's 179 us (float32) and 111
// (bfloat16):
// - tiles of 2048 (eight elements a thread), three stages, three blocks per
//   SM (80 registers): 170 and 125 us;
// - the same at two blocks per SM: 186 and 151;
// - tiles of 4096 float32 (16 elements a thread) and 4096 two-byte (16),
//   two stages, two blocks per SM (128 registers, no spill): 151 and 104;
// - two-byte tiles of 8192 (32 elements a thread) instead: 118;
// - float32 vectors read from the stage in a rotated order (below): 142
//   (its forward-order kernel, untimed, then spills 20 bytes).
// cumprod backward, whose runs also need each input's neighbours (staged
// with a 16-byte granule either side of the tile), ran slower than its
// long_rows kernel in every form tried here (float32 181-222 us against
// 133, bfloat16 111-192 against 95); it takes tiles of its own
// (scan_staged_cumprod_grad.cuh), which need one neighbour only.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/hopper.cuh"
#include "scan/scan_block.cuh"
#include "scan/scan_plan.h"
#include "scan/scan_staged_rows.cuh"

namespace baracuda {
namespace scan {

template <typename Op>
constexpr bool kStagedWholeRunsApply = HasWholeRunIo<Op>::value && !HasPlainIo<Op>::value &&
                                       !ReadsNeighbors<Op>::value &&
                                       sizeof(typename Op::Storage) <= 4;

// Vectors a thread takes of each input per tile: 16 elements a thread
// either way, tiles of 4096 (see the measurements above).
template <typename Op>
constexpr int kWholeRunVectors = sizeof(typename Op::Storage) == 4 ? 4 : 2;

template <typename Op, bool kReverse>
struct StagedWholeRunTiles {
  using T = typename Op::Storage;
  using State = StateOf<Op>;
  using Totals = TotalsOf<Op>;
  using Total = TotalOf<Op>;
  static constexpr int kElems = 16 / int{sizeof(T)};  // a vector's
  static constexpr int kVectors = kWholeRunVectors<Op>;
  static constexpr int kRunLen = kVectors * kElems;
  static constexpr int kArrays = kInputArrays<Op>;
  static constexpr int64_t kTileLen = int64_t{kScanBlock} * kRunLen;
  static constexpr int kTileBytes = static_cast<int>(kTileLen * int64_t{sizeof(T)});
  static constexpr int kStageBytes = kArrays * kTileBytes;
  // Two stages of three float32 inputs take 96 KiB a block, so an SM holds
  // two blocks (128 registers a thread), each folding one tile while the
  // next is on its way.
  static constexpr int kBlocksPerSm = 2;
  static constexpr int kStages = 2;
  // H100, [1, 16M], launcher timer: float32 143.8 -> 138.7 us, bfloat16
  // 104.0 -> 101.0 (staged_rows_kernel's two-step prefix).
  static constexpr bool kEarlyPrefix = true;
  static_assert(kTileLen >= ::baracuda::kTileLen, "the workspace holds a slot per tile");

  struct Fold {
    Total before;  // everything in the tile before the thread's run
  };
  using Part = State[kElems];
  using AuxPart = AuxOf<Op>[kElems];

  Op op;
  int64_t len, tiles;

  __device__ Totals totals() const { return totals_of(op); }
  __device__ StagedPlace place(int64_t g) const {
    return place_staged_tile<kTileLen, kReverse>(g, len, tiles);
  }
  __device__ Line line(const StagedPlace& p) const { return {p.row * len, 1, len, kReverse}; }
  __device__ static bool whole(const StagedPlace& p) { return p.valid == kTileLen; }
  // The tile's first scan position, and one past its last.
  __device__ int64_t scan_first(const StagedPlace& p) const {
    const int64_t at = p.first - p.row * len;
    return kReverse ? len - at - p.valid : at;
  }
  __device__ static unsigned char* tile_of(unsigned char* stage, int a) {
    return stage + a * kTileBytes;
  }

  __device__ void request(const StagedPlace& p, unsigned char* stage, uint64_t* full) const {
    if (!whole(p)) {
      mbarrier_arrive_expect_tx(full, 0);  // read from memory
      return;
    }
    mbarrier_arrive_expect_tx(full, kArrays * kTileBytes);
    int a = 0;
    op.for_each_input([&](const T* src) {
      bulk_copy_to_shared(tile_of(stage, a++), src + p.first, kTileBytes, full);
    });
  }

  // The run [first, first + kElems) of a whole tile as fetch_whole_run reads
  // it from memory, from the stage.
  __device__ WholeRun<Op> fetch(unsigned char* stage, const StagedPlace& p, const Line& ln,
                                int64_t first) const {
    WholeRun<Op> run{};
    const int64_t at = whole_run_at<kElems>(ln, first) - p.first;
#pragma unroll
    for (int a = 0; a < kArrays; ++a) {
      run.input[a] = reinterpret_cast<const uint4*>(tile_of(stage, a))[at / kElems];
    }
    return run;
  }

  __device__ static Part& part(State (&v)[kRunLen], int j) {
    return *reinterpret_cast<Part*>(v + j * kElems);
  }
  __device__ static AuxPart& aux_part(AuxOf<Op> (&v)[kRunLen], int j) {
    return *reinterpret_cast<AuxPart*>(v + j * kElems);
  }
  __device__ int64_t run_first(const StagedPlace& p, int j) const {
    return scan_first(p) + (int64_t{threadIdx.x} * kVectors + j) * kElems;
  }

  // The thread's run: states, and what the stores read besides them.
  __device__ void load(const StagedPlace& p, unsigned char* stage, State (&items)[kRunLen],
                       AuxOf<Op> (&aux)[kRunLen]) const {
    const Line ln = line(p);
    if (whole(p)) {
      if constexpr (kVectors == 4) {
        // A thread's four vectors of an input lie 64 bytes from the next
        // thread's, so that a quarter warp reading its j-th vectors meets
        // two of the eight 16-byte bank groups, four to a group: read in
        // an order rotated by thread (as StagedRun does), the eight threads
        // meet eight groups at every step, and the vectors are put back in
        // registers. H100, launcher timer, float32 [1, 16M]: 150.1, 150.6
        // -> 141.6, 142.8 us. Rotating the stores into the stage as well
        // gained nothing more (141.3, 141.6) and doubled the forward-order
        // kernel's spill (20 -> 40 bytes; without the rotation it has none).
        const int rot = staggered_rotation<4>();
        const int lowest = kReverse ? static_cast<int>(kTileLen / kElems) - 4 * (threadIdx.x + 1)
                                    : 4 * threadIdx.x;
        uint4 r[kArrays][4];
#pragma unroll
        for (int a = 0; a < kArrays; ++a) {
          const uint4* v = reinterpret_cast<const uint4*>(tile_of(stage, a)) + lowest;
#pragma unroll
          for (int q = 0; q < 4; ++q) r[a][q] = v[(q + rot) & 3];
          rotate_four(r[a], (4 - rot) & 3);
        }
#pragma unroll
        for (int j = 0; j < kVectors; ++j) {
          WholeRun<Op> run{};
#pragma unroll
          for (int a = 0; a < kArrays; ++a) run.input[a] = r[a][kReverse ? 3 - j : j];
          unpack_whole_run<kElems>(op, ln, run_first(p, j), run, part(items, j),
                                   aux_part(aux, j));
        }
      } else {
#pragma unroll
        for (int j = 0; j < kVectors; ++j) {
          const int64_t first = run_first(p, j);
          unpack_whole_run<kElems>(op, ln, first, fetch(stage, p, ln, first), part(items, j),
                                   aux_part(aux, j));
        }
      }
    } else {
      load_run<kRunLen>(op, ln, run_first(p, 0), scan_first(p) + p.valid, items, aux);
    }
  }

  __device__ Total fold(const StagedPlace& p, unsigned char* stage, Fold& f) const {
    __shared__ typename BlockTotalsScan<Totals>::TempStorage scratch;
    State items[kRunLen];
    AuxOf<Op> aux[kRunLen];
    load(p, stage, items, aux);
    RunMemoOf<Op> memo;
    const Total mine = fold_run(op, items, memo);
    Total tile_total;
    BlockTotalsScan<Totals>::exclusive(scratch, totals(), mine, f.before, tile_total);
    __syncthreads();  // scratch free for the next fold
    return tile_total;
  }

  __device__ void scan(const StagedPlace& p, unsigned char* stage, const Fold& f,
                       const Total& prefix) const {
    State items[kRunLen];
    AuxOf<Op> aux[kRunLen];
    load(p, stage, items, aux);
    RunMemoOf<Op> memo;
    fold_run(op, items, memo);
    scan_thread_run(op, totals().combine(prefix, f.before), items, memo);
    const Line ln = line(p);
    if (!whole(p)) {
      store_inclusive_run<kRunLen>(op, ln, run_first(p, 0), scan_first(p) + p.valid, items);
      return;
    }
    // The outputs go where input 0's part of the tile was (each thread
    // over its own vectors, read above).
    uint4* staged = reinterpret_cast<uint4*>(tile_of(stage, 0));
#pragma unroll
    for (int j = 0; j < kVectors; ++j) {
      const int64_t first = run_first(p, j);
      T out[kElems];
      LineWalk w = LineWalk::from<kElems>(ln, first, ln.len);
      whole_run_outputs(op, w, kReverse, part(items, j), aux_part(aux, j), out);
      memcpy(&staged[(whole_run_at<kElems>(ln, first) - p.first) / kElems], out, 16);
    }
    __syncthreads();
    uint4* dst = reinterpret_cast<uint4*>(whole_run_output(op) + p.first);
#pragma unroll
    for (int c = 0; c < kVectors; ++c) {
      const int m = c * kScanBlock + threadIdx.x;
      __stwb(dst + m, staged[m]);
    }
  }
};

}  // namespace scan
}  // namespace baracuda
