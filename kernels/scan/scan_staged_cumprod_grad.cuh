// Staged cumprod gradient: the staged long rows (scan_staged_rows.cuh) for
// cumprod's backward (CumprodBackward, scan_ops.h) on float32 and two-byte
// elements. Same loop and conditions as the staged long rows (rows starting
// 16 bytes aligned, compute capability 9.0 and up); only the tiles differ.
// Included by scan_launch.cuh. No torch headers.
//
// In the forward's order, dx_f = y_{f-1} R_f with R_f = dy_f + x_{f+1}
// R_{f+1}. CumprodBackward scans R itself, each element's map reading x one
// place away, which a tile would have to stage past its edges. These tiles
// hand Q_f = x_f R_f from run to run instead, whose step reads the element
// alone, Q_f = x_f (dy_f + Q_{f+1}): the map q -> x_f q + x_f dy_f,
// composed in the backward's scan order as AffineCombine composes. A run
// starts from the Q before it, R = dy + Q, and then carries R as
// CumprodBackward does, x one place away being its own previous element.
// Only y_{f-1}, the element after f in scan order, comes from a neighbour:
// in the thread's own run, from the stage past the run's end, or for the
// tile's last element in scan order from memory (read while the tile is
// folded, a round before its scan). No division: zeros in x are exact.
//
// The tiles hold dy, x and y as their base, StagedGradTiles
// (scan_staged_grad_tiles.cuh), lays them out (float32: y, which only the
// scan reads, from memory). Thread t folds its run of 16 consecutive
// elements in scan order, and the block's runs are joined; once the tile's
// prefix is known the run is read again and scanned, and its dx goes out
// through the stage.
//
// Faster than the long_rows kernel, and float32's error against the float64
// engine 2.1e-3 -> 2.1e-5 on a [1, 16M] row (R carried in double, below).
// Reading the stage in a staggered order, and y past a run from the next
// thread by a shuffle, pays for float32 (bfloat16 unchanged). Slower:
// float32 tiles of 2048 (eight elements a thread, with three stages or
// four); asking for a stage's x and y as soon as the scan has read them,
// its dy after (bfloat16; float32 unchanged).
#pragma once

#include <cstdint>
#include <type_traits>

#include "scan/scan_staged_grad_tiles.cuh"

namespace baracuda {
namespace scan {

template <typename Op>
constexpr bool kStagedCumprodGradApply = IsStagedGradOf<CumprodBackward, Op>::value;

template <typename Op, bool kReverse>
struct StagedCumprodGradTiles : StagedGradTiles<Op, kReverse, 2> {
  using T = typename Op::Storage;
  using Base = StagedGradTiles<Op, kReverse, 2>;  // y: dx alone reads it
  using Base::Base;
  using Base::op;
  using Base::len;
  // kStride rather than kGroups: faster for both element sizes, two-byte
  // ones with finish_stride_prefix as written (another form of it gained
  // little: see there).
  static constexpr LookBack kLookBack = LookBack::kStride;
  static constexpr int R = Base::R;                // a run's elements
  static constexpr int kVectors = Base::kVectors;  // and its vectors of each input
  using State = StateOf<Op>;  // Affine: q -> scale q + shift
  using Acc = decltype(State::scale);
  // What a run carries R and its map in: double for float32 elements. The
  // runs are chained only through the tiles' and runs' float totals, a few
  // dozen roundings whatever the row's length, where a float R rounds at
  // every element: on a float32 row of 40003 factors near 1 (sigma 0.01)
  // whose gradient cancels to -4.84 at its end, a float recurrence run
  // element by element ends 5.5e-4 off, these tiles in float 8.0e-4.
  using Wide = std::conditional_t<sizeof(T) == 4, double, Acc>;
  using Totals = TotalsOf<Op>;
  using Total = TotalOf<Op>;
  static_assert(std::is_same<Total, State>::value, "the tiles publish the op's own states");
  static_assert(std::is_same<Acc, float>::value, "float32 and two-byte elements");

  struct Fold {
    Total before;  // everything in the tile before the thread's run
    Acc after;     // y after the tile's last element in scan order (thread 255)
  };

  __device__ Totals totals() const { return totals_of(op); }

  // y one element further in scan order, in memory: one element lower when
  // the scan walks memory backwards.
  static constexpr int kAfter = kReverse ? -1 : 1;

  // The row position of the tile's first element in memory.
  __device__ int64_t tile_at(const StagedPlace& p) const { return p.first - p.row * len; }
  // y at row position l of the tile's row, 1 outside the row (the scan's
  // last element has no y after it).
  __device__ Acc y_at(const StagedPlace& p, int64_t l) const {
    return l < 0 || l >= len ? Acc(1) : to_acc<Acc>(op.y[p.row * len + l]);
  }

  // Inside a run R itself is carried, R_f = x_{f+1} R_{f+1} + dy_f by one
  // fma per element, in Wide; Q is formed only where the run ends. The
  // run's map of the Q before it, R = a q + b along the run:
  struct RunMap {
    Wide a = Wide(1), b = Wide(0), x_last = Wide(1);
    bool started = false;
    __device__ void step(Acc d, Acc x) {
      if (started) {
        a = x_last * a;
        b = fma(x_last, b, Wide(d));
      } else {
        b = d;
        started = true;
      }
      x_last = x;
    }
    __device__ State total() const {  // of Q
      return {static_cast<Acc>(x_last * a), static_cast<Acc>(x_last * b)};
    }
  };

  __device__ Total fold(const StagedPlace& p, unsigned char* stage, Fold& f) const {
    __shared__ typename BlockTotalsScan<Totals>::TempStorage scratch;
    RunMap run;
    if (Base::whole(p)) {
      uint4 dy[kVectors], x[kVectors];
      Base::load_run(stage, 0, dy);
      Base::load_run(stage, 1, x);
#pragma unroll
      for (int s = 0; s < R; ++s) run.step(Base::element(dy, Base::memory_of(s)), Base::element(x, Base::memory_of(s)));
      if (threadIdx.x == kScanBlock - 1) {
        f.after = y_at(p, kReverse ? tile_at(p) - 1 : tile_at(p) + Base::kTileLen);
      }
    } else {
      Base::for_each_short(p, [&](int64_t, int64_t off) {
        run.step(to_acc<Acc>(op.dy[off]), to_acc<Acc>(op.x[off]));
      });
    }
    return join_staged_runs(scratch, totals(), run.total(), f.before);
  }

  __device__ void scan(const StagedPlace& p, unsigned char* stage, const Fold& f,
                       const Total& carry, const typename Base::Prefetched& pre = {}) const {
    // Q of everything before the run (0 before the scan's start); then R
    // along the run as RunMap carries it.
    const Wide q = totals().combine(carry, f.before).shift;
    if (!Base::whole(p)) {
      Wide r = Wide(0), x_last = Wide(0);
      bool started = false;
      Base::for_each_short(p, [&](int64_t e, int64_t off) {
        const Wide d = to_acc<Acc>(op.dy[off]);
        r = started ? fma(x_last, r, d) : d + q;
        started = true;
        op.dx[off] = from_acc<T>(static_cast<Acc>(Wide(y_at(p, tile_at(p) + e + kAfter)) * r));
        x_last = to_acc<Acc>(op.x[off]);
      });
      return;
    }
    uint4 dy[kVectors], x[kVectors], y[kVectors];
    Base::load_run(stage, 0, dy);
    Base::load_run(stage, 1, x);
    if constexpr (Base::kPrefetches) {
#pragma unroll
      for (int q = 0; q < kVectors; ++q) y[q] = pre.raw[q];
    } else {
      Base::load_run(stage, 2, y);
    }
    // y after the run's last element in scan order: the first of the next
    // run, which thread t + 1 holds (for a warp's last lane, from the stage,
    // or for float32 from the prefetch: runs 64 bytes apart, a warp's reads
    // of the stage there would meet in two banks), or past the tile's end.
    const Acc next_first = __shfl_down_sync(0xffffffffu, Base::element(y, Base::memory_of(0)), 1);
    Acc after = next_first;
    if (threadIdx.x == kScanBlock - 1) {
      after = f.after;
    } else if (threadIdx.x % 32 == 31) {
      if constexpr (Base::kPrefetches) {
        after = pre.next;
      } else {
        const int run = Base::run_in_tile();
        const int beyond = kReverse ? run * R - 1 : (run + 1) * R;
        after = to_acc<Acc>(
            reinterpret_cast<const T*>(stage + Base::stage_part(2) * Base::kTileBytes)[beyond]);
      }
    }
    uint4 out[kVectors];
    Wide r = Wide(0);
#pragma unroll
    for (int s = 0; s < R; ++s) {
      const int e = Base::memory_of(s);
      const Wide d = Base::element(dy, e);
      r = s == 0 ? d + q : fma(Wide(Base::element(x, Base::memory_of(s - 1))), r, d);
      const Acc y_after = s + 1 < R ? Base::element(y, Base::memory_of(s + 1)) : after;
      set_run_element<T>(out, e, static_cast<Acc>(Wide(y_after) * r));
    }
    Base::store_dx(p, stage, out, op.dx);
  }
};

}  // namespace scan
}  // namespace baracuda
