// The CUDA scan kernels' tuning constants, in one place, each with its
// reason. They were set by measurement (the figures are in the history of
// the files that once held them, and the margins of whole kernels in
// docs/design/scan.md). The shape plan's thresholds are in
// scan_plan.h; the staged tiles' policies (stages, look-back, bulk stores)
// are members of their tile types (scan_staged_*.cuh). Included by the
// kernel files after the op traits (scan_block.cuh). No torch headers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "scan/scan_block.cuh"
#include "scan/scan_plan.h"

namespace baracuda {
namespace scan {

// ---------------------------------------------------------------- rows

// Blocks per SM of a rows block: neighbour-reading ops (cumprod backward)
// three, as four spill; direct-run plain ops, which need few registers,
// eight; other 4-byte states five; 8-byte states four, which holds them to
// 64 registers and beats two with more; wider states three.
template <typename Op>
constexpr int kRowsBlocksPerSm =
    ReadsNeighbors<Op>::value                                      ? 3
    : kMayGoDirect<Op> && !HasRunScan<Op>::value                   ? 8
    : sizeof(StateOf<Op>) <= 4                                     ? 5
    : sizeof(StateOf<Op>) <= 8                                     ? 4
                                                                   : 3;

// ---------------------------------------------------------------- long_rows

// cummax / cummin forward on whole two-byte runs with int32 positions: held
// to 64 registers, for four long_rows blocks per SM.
template <typename Op>
constexpr bool kLeanLongRows =
    ReadsOneArray<Op>::value && kMayLoadDirect<Op> && sizeof(StateOf<Op>) <= 8;

// Chunks a long_rows tile holds in registers: a tile's loads all go out at
// its start, so more chunks keep more bytes in flight, up to what the
// registers hold (three for 4-byte states and cumprod backward, two for
// other 8-byte states, one for wider ones, float64, and run scans loaded
// through the exchange).
template <typename Op>
constexpr int kLongChunks =
    sizeof(StateOf<Op>) <= 4                                       ? 3
    : sizeof(StateOf<Op>) > 8 || sizeof(typename Op::Storage) == 8 ? 1
    : ReadsNeighbors<Op>::value                                    ? 3
    : HasRunScan<Op>::value && !kMayLoadDirect<Op>                 ? 1
                                                                   : 2;

// Blocks per SM of a long_rows block: three for logcumsumexp (left free it
// takes about 100 registers and runs two), four for the lean extremes; the
// others are left free (0), as asking for any count costs them registers.
template <typename Op>
constexpr int kLongRowsBlocksPerSm =
    HasRunScan<Op>::value && (sizeof(StateOf<Op>) <= 4 || sizeof(typename Op::Storage) == 2) ? 3
    : kLeanLongRows<Op>                                                                        ? 4
                                                                                               : 0;

// ---------------------------------------------------------------- row_groups

constexpr int kRowGroupBlock = 128;

// Consecutive elements a lane holds: 16 bytes of the input, one vector
// (longer runs loaded element by element asked L2 for the same sectors
// more often).
template <typename Op>
constexpr int kRowGroupItems =
    std::max(2, std::min(kScanItems, int(16 / sizeof(typename Op::Storage))));

// ---------------------------------------------------------------- warp rows

constexpr int kWarpRowsBlock = 128;
// Chunks in flight beyond the one being scanned: two for ops that read one
// array, one for the backward ops that read three (two spill).
template <typename Op>
constexpr int kWarpRowsAhead = kInputArrays<Op> == 1 ? 2 : 1;
// Blocks per SM the kernel is compiled for: 32 warps, 64 registers.
constexpr int kWarpRowsBlocksPerSm = 8;

// ---------------------------------------------------------------- keyed rows

// Consecutive elements a keyed-rows thread holds: its keys are eight
// 16-byte vectors.
constexpr int kKeyedRunLen = 16;
// Records a fix-up thread reads at once: a row of 16M has 4096 tiles, 16 a
// thread.
constexpr int kFixupBatch = 16;

// ---------------------------------------------------------------- columns

// Positions a columns thread loads before its first store: 16 for 4-byte
// states, 8 for larger ones (more held registers and gained nothing).
template <typename Op>
constexpr int kColumnBatch = sizeof(StateOf<Op>) <= 4 ? 16 : 8;

// column_tiles: below this many columns every tile is resident at once and
// waits mostly on its prefix, so it reads the earlier totals eight at a
// time; above, the batch's registers cost more than the round trips it
// saves, and it reads one at a time.
constexpr int64_t kFewTileColumns = 1024;

// ---------------------------------------------------------------- column_strips

// Bytes of states a strip thread holds per step: two steps' states must fit
// 80 registers (64 for two-byte types).
template <typename Op>
constexpr int kStripStateBytes = sizeof(typename Op::Storage) <= 2 ? 128 : 160;

// Positions per warp and step: 128 bytes of loads in flight per thread, or
// fewer where the states would not fit kStripStateBytes.
template <typename Op>
constexpr int kStripRows =
    std::min<int>(128 / sizeof(typename Op::Storage),
                  kStripStateBytes<Op> /
                      (sizeof(StateOf<Op>) + (AuxTrait<Op>::kHas ? sizeof(AuxOf<Op>) : 0)));

// Blocks per SM a strip block is compiled for: two, but two-byte ops with
// 8-byte states are left free (they ran slower held to two).
template <typename Op>
constexpr int kStripBlocksPerSm =
    sizeof(typename Op::Storage) <= 2 && sizeof(StateOf<Op>) > 4 ? 1 : 2;

// Whether only the warps before a warp fold into its prefix (the last warp
// leaving the next carry in shared memory) rather than every warp folding
// all: half the work, but the last warp's fold on every step's path; it
// pays for float32 logcumsumexp forward and two-byte logcumsumexp backward.
template <typename Op>
constexpr bool kFoldEarlierWarpsOnly =
    HasRunScan<Op>::value &&
    sizeof(typename Op::Storage) == (HasPlainIo<Op>::value ? 4 : 2);

// Whether a step folds the warps' scaled sums as plain floats against their
// largest exponent where they are tame: logcumsumexp forward only (the
// backward ran slower so).
template <typename Op>
constexpr bool kFoldWarpsByReference = HasRunScan<Op>::value && HasPlainIo<Op>::value;

// Ops that name their inputs (kInputBytes, scan_ops.h), which the staged
// strips need.
template <typename Op, typename = void>
struct HasInputs : std::false_type {};
template <typename Op>
struct HasInputs<Op, std::void_t<decltype(Op::kInputBytes)>> : std::true_type {};

// Where staging a strip's loads through shared memory pays: two-byte types,
// and ops with more per element than a plain combine (a run scan, an aux);
// the other four- and eight-byte ops ran slower staged.
template <typename Op>
constexpr bool kStagingPays = HasInputs<Op>::value && (sizeof(typename Op::Storage) == 2 ||
                                                       HasRunScan<Op>::value ||
                                                       AuxTrait<Op>::kHas);

// Two columns per lane for plain ops on two-byte types, so that a strip's
// rows are 128 bytes; the costlier combines ran slower so.
template <typename Op>
constexpr int kLaneColumns =
    sizeof(typename Op::Storage) == 2 && HasPlainIo<Op>::value && !HasRunScan<Op>::value ? 2 : 1;

// An op that reads its inputs at the neighbouring scan positions too
// (ReadsNeighbors) stages the row before and the row after its positions.
template <typename Op>
constexpr int kHaloRows = ReadsNeighbors<Op>::value ? 1 : 0;

// Staged positions per warp and step: about 16 KiB of inputs a block and
// step, more for a run scan (each step has fixed work), and no more than
// 128 bytes of states a thread (more spilled).
template <typename Op>
constexpr int kStagedRows =
    std::min<int>(HasRunScan<Op>::value || Op::kInputBytes <= 2 ? 32
                  : Op::kInputBytes <= 4 || (kHaloRows<Op> && Op::kInputBytes <= 6)
                      ? 16
                      : 8,
                  128 / (sizeof(StateOf<Op>) * kLaneColumns<Op>));

template <typename Op>
constexpr int kStagedWidth = kStripWidth * kLaneColumns<Op>;
// Rows of each input a warp stages per step.
template <typename Op>
constexpr int kStagedSpan = kStagedRows<Op> + 2 * kHaloRows<Op>;
template <typename Op>
constexpr int kStagedWarpBytes = kStagedSpan<Op> * kStagedWidth<Op> * Op::kInputBytes;
template <typename Op>
constexpr int kStagedStepBytes = (kStripBlock / 32) * kStagedWarpBytes<Op>;

// Steps in shared memory: about 40 KiB of copies in flight per block (twice
// that ran slower), and at least two steps ahead.
template <typename Op>
constexpr int kStripStages = std::max(3, std::min(8, 1 + (40 << 10) / kStagedStepBytes<Op>));

// Whether a staged strip's copies ask L2 for the 256 bytes around each
// piece: two-byte types, whose neighbouring strip (the same rows' other
// bytes) the next block walks beside it; not 8-byte inputs nor float32.
template <typename Op>
constexpr bool kStagedPrefetch256 = sizeof(typename Op::Storage) == 2 && Op::kInputBytes < 8;

// Whether a staged strip copies input type U on its interior steps from one
// address and a fixed stride, untested (two-byte logcumsumexp forward, the
// 8-byte indices of two-byte cummax / cummin backward); the other ops ran
// slower so and test each copy.
template <typename Op, typename U>
constexpr bool kStagedInteriorFetch =
    sizeof(U) == 2 ? HasRunScan<Op>::value && HasPlainIo<Op>::value
                   : sizeof(U) == 8 && sizeof(typename Op::Storage) == 2;

// ---------------------------------------------------------------- strip_tiles

// Positions per warp of a tile: a strip step's, or in long tiles (kLong)
// twice as many, up to 128 bytes of the op's storage (a tile holds one step
// in registers where the walk holds two).
template <typename Op, bool kLong>
constexpr int kStripTileRows =
    kLong ? std::min<int>(128 / sizeof(typename Op::Storage), 2 * kStripRows<Op>)
          : kStripRows<Op>;

// The ops that take long tiles: those whose tiles get longer, but not
// float32 logcumsumexp backward (slower in them), nor float64 (not
// measured).
template <typename Op>
constexpr bool kLongStripTiles =
    kStripTileRows<Op, true> != kStripRows<Op> && sizeof(typename Op::Storage) <= 4 &&
    !std::is_same<Op, LogcumsumexpBackward<float, float>>::value;

// Blocks per SM of a tile, which does one step and exits: three, so that
// other tiles hide its loads and its wait; the plain ops and two-byte
// logcumsumexp forward (which spilled at three) keep the strips' count;
// long tiles, twice the registers, two.
template <typename Op, bool kLong>
constexpr int kStripTileBlocksPerSm =
    kLong ? 2
    : HasPlainIo<Op>::value && (!HasRunScan<Op>::value || sizeof(typename Op::Storage) == 2)
        ? kStripBlocksPerSm<Op>
        : 3;

}  // namespace scan
}  // namespace baracuda
