// Which CUDA path a scan of a given [outer, len, inner] shape takes, and how
// much workspace it needs. Host-only and framework-free: the op layer uses it
// to size the workspace and to report the path; the launcher to launch.
// Within a path the launcher picks one kernel (ScanKernel below) by the op,
// the arrays' alignment, the compiled targets and the device, in one place
// (choose_kernel, scan_launch.cuh), which scan_path(x, dim, kind) reports.
//
//   row_groups inner == 1, rows of at most kRowGroupMaxLen: a group of
//              lanes per row (scan_row_groups.cuh), 2 to 32 of them, each
//              holding 16 bytes of elements; a whole warp walks longer rows
//              in chunks. Or, for two-byte logcumsumexp rows of 256
//              or more, one warp per row (scan_warp_rows.cuh: the
//              launcher's choice, same path name).
//   rows       inner == 1, longer rows: one block per row walks it in
//              chunks of kRowChunk, carrying the prefix from chunk to chunk;
//              or, for two-byte logcumsumexp rows with rows enough, one warp
//              per row (scan_warp_rows.cuh: the launcher's choice, same path
//              name).
//   long_rows  inner == 1, few long rows: one pass over tiles of one or
//              more chunks (scan_launch.cuh), held in registers. Tiles take
//              tickets in order, publish their totals, and each group of
//              kGroupTiles tiles gets one total (published by the group's
//              last tile); a tile's prefix is the in-order reduction of the
//              earlier groups' totals and of the earlier tiles of its own
//              group -- the same association whatever the timing, so
//              bit-identical run to run, and a tile only ever waits for tiles
//              with smaller tickets (no deadlock). Or, for cumsum, cumprod,
//              cumsum's backward and float32 / two-byte logcumsumexp
//              forward on 16-byte aligned
//              rows, on GPUs with the bulk copy engine
//              (scan_staged_rows.cuh: the launcher's choice, same path
//              name): persistent blocks stage 16 KiB tiles in shared memory
//              and publish each tile's total a tile ahead of its scan; the
//              same for float32 / two-byte cummax / cummin forward, x
//              staged in tiles of 4096 (scan_staged_extremes.cuh), and
//              for float32 / two-byte cumprod and logcumsumexp backward,
//              dy, x and y staged in tiles of 4096
//              (scan_staged_grad_tiles.cuh).
//              Or, for cummax / cummin backward on 16-byte aligned rows
//              (scan_keyed_rows.cuh: likewise), every tile scanned alone
//              and the one element per tile whose run comes in from the
//              tiles before rewritten by a second kernel, after a scan of
//              the tiles' totals.
//   column_strips  inner > 1 with enough columns for kMinStrips strips, and
//              at least three in four lanes of a strip with a column: a
//              block owns kStripWidth consecutive columns of one outer index
//              (a lane per column) and walks the whole axis in steps, each
//              warp taking kStripRows consecutive positions per step, the
//              next step's loads in flight while the current one is scanned.
//              The warps' totals meet in shared memory and are folded in warp
//              order: one pass, no workspace, no waiting on other blocks.
//   strip_tiles  inner > 1, lanes as for strips but too few strips to fill
//              the GPU with a block each, an axis of at most kMaxStripTiles
//              tiles of kStripTileMinLen (scan_strip_tiles.cuh): a block
//              per strip step -- a tile of the strips' walk -- with tickets
//              as in column_tiles; a tile's carry is the in-order fold of
//              its strip's earlier tiles' totals.
//   column_tiles  inner > 1, too few columns for strips and not taken by
//              strip_tiles (a strip's lanes mostly idle, or a longer axis),
//              an axis of at most kMaxColumnGroups groups of tiles: a tile is
//              kColumnTileRows positions of the axis for
//              kColumnBlock consecutive columns (a thread per column,
//              coalesced along inner, its rows in registers), one pass with
//              the same tickets and tile / group totals as long_rows, per
//              column.
//   columns    the other inner > 1 shapes (an axis of one tile, or of
//              more groups than column_tiles takes, or too much workspace
//              for its totals): one thread per (outer, inner) column walks
//              the axis; long axes are cut into `segments` pieces: reduce
//              each, scan the segment totals, rescan.
#pragma once

#include <algorithm>
#include <cstdint>

#include "scan/scan_kernels.h"

namespace baracuda {

enum class ScanPath : int {
  kEmpty,
  kRowGroups,
  kRows,
  kLongRows,
  kColumnStrips,
  kColumnTiles,
  kColumns,
  kStripTiles
};

constexpr int kScanBlock = 256;         // threads of a row / tile block
constexpr int kScanItems = 8;           // consecutive elements per thread
constexpr int64_t kRowChunk = int64_t(kScanBlock) * kScanItems;
// long_rows tiles are one or more chunks (the op decides, scan_launch.cuh);
// the plan sizes the workspace for the shortest.
constexpr int64_t kTileLen = kRowChunk;
constexpr int64_t kGroupTiles = 32;
constexpr int kColumnBlock = 128;       // threads of a column block
constexpr int64_t kWorkspaceSlotBytes = 16;  // every scan state fits in 16 bytes
// Enough independent columns (or tiles) to keep every SM of a large GPU busy.
constexpr int64_t kTargetThreads = int64_t(1) << 18;
constexpr int64_t kMinSegmentLen = 32;
constexpr int64_t kMaxGridY = 65535;
// Rows up to this long take row_groups: a block per row (256 threads, 8
// elements each) would leave most of its threads idle.
constexpr int64_t kRowGroupMaxLen = 1024;
// Grid of the block-stride kernels (rows, strips): blocks beyond this loop.
constexpr int64_t kMaxBlocks = int64_t(1) << 30;

constexpr int kStripWidth = 32;   // columns of a strip: a lane each
constexpr int kStripBlock = 256;  // threads of a strip block
// Strips from which a block walking each (column_strips) beats a block per
// strip step (strip_tiles): about one per SM of a large GPU. Below, a
// strip's walk, one step after another, is the whole kernel's time, while
// strip_tiles' time grows with the strips. From here column_strips ran much
// faster for most ops; four of 20 lost at 128 strips (float32 cummax /
// cummin forward, bfloat16 cummax / cummin backward, which walk their
// strips slowest) and one at 219. At 96 strips six lost, by up to a third.
constexpr int64_t kMinStrips = 128;

// strip_tiles: a tile is a strip step, kStripBlock / 32 warps of
// kStripRows<Op> positions each, or twice as many (long tiles,
// scan_strip_tiles.cuh); the plan, knowing no op, sizes the
// workspace for the shortest step any op takes (four positions a warp), and
// takes the path for axes of at most kMaxStripTiles such tiles. A tile
// reads every earlier tile's totals of its strip (eight at a time), so the
// axis stays short. (Measured faster than column_tiles on such shapes.)
constexpr int64_t kStripTileMinLen = (kStripBlock / 32) * 4;
constexpr int64_t kMaxStripTiles = 128;

constexpr int kColumnTileRows = 16;
// Few enough groups that a tile's in-order prefix stays short. (Fewer
// columns than a block has threads leave some idle, but the columns path
// does worse there: three launches, and a walk over every segment's total
// in one thread per column.)
constexpr int64_t kMaxColumnGroups = 64;
// Its per-column tile totals cost a slot per kColumnTileRows elements; past
// this much workspace the three-pass columns path (a few slots per column)
// is used instead.
constexpr int64_t kMaxColumnTileWorkspace = int64_t(64) << 20;

// Workspace of long_rows: the ticket counter, then a published state per tile
// and per group (flagged words, scan_publish.cuh), all zeroed ahead of the
// launch (by a kernel, common/zeroed_launch.cuh; the staged long rows by a
// memset), where the stream has no standing slots to take instead
// (common/standing_slots.h). A state of up to 16 bytes takes two 16-byte
// words.
constexpr int64_t kLongRowsCounterBytes = 16;
constexpr int64_t kFlaggedSlotBytes = 32;

// Workspace of column_tiles and strip_tiles, in this order: the ticket
// counter (16 bytes), the ready flags of tiles and of groups (uint32),
// zeroed ahead of the launch, then the state slots of tiles and of groups:
// a flag per tile and a slot per column. Where the stream has standing
// slots (scan_slots_launch.cuh) the launch takes those instead.
struct TileWorkspace {
  int64_t tile_flags = 0;
  int64_t group_flags = 0;
  int64_t tile_slots = 0;
  int64_t group_slots = 0;
  int64_t zeroed_bytes() const { return 16 + ((tile_flags + group_flags) * 4 + 15) / 16 * 16; }
  int64_t bytes() const { return zeroed_bytes() + (tile_slots + group_slots) * kWorkspaceSlotBytes; }
};

struct ScanPlan {
  ScanPath path = ScanPath::kEmpty;
  // column_tiles: tiles along the axis, and their groups of kGroupTiles;
  // strip_tiles: the most tiles along the axis its workspace holds.
  // (long_rows tiles depend on the op: its launcher counts them.)
  int64_t tiles = 1;
  int64_t groups = 1;
  int64_t column_blocks = 1;  // column_tiles: blocks of kColumnBlock columns
  int64_t strips_per_outer = 1;  // column_strips, strip_tiles
  int64_t segments = 1;  // columns: pieces of the axis
  int64_t workspace_bytes = 0;
  TileWorkspace tile_ws;
};

inline ScanPlan plan_scan(const ScanShape& s) {
  ScanPlan p;
  if (s.numel() == 0) return p;
  // An axis past INT32_MAX positions, where cummax / cummin carry 64-bit
  // positions (scan_dispatch.h), takes its layout's general path; no
  // specialisation is compiled for 64-bit positions (choose_kernel).
  const bool wide = s.len > INT32_MAX;
  if (s.inner == 1 && s.len <= kRowGroupMaxLen) {
    p.path = ScanPath::kRowGroups;
    return p;
  }
  if (s.inner == 1) {
    const int64_t tiles = (s.len + kTileLen - 1) / kTileLen;
    // A few long rows would leave most SMs idle with one block per row.
    if (wide || (tiles >= 2 && s.outer * 4 < kTargetThreads / kScanBlock)) {
      p.path = ScanPath::kLongRows;
      const int64_t groups = (tiles + kGroupTiles - 1) / kGroupTiles;
      p.workspace_bytes = kLongRowsCounterBytes + s.outer * (tiles + groups) * kFlaggedSlotBytes;
    } else {
      p.path = ScanPath::kRows;
    }
    return p;
  }
  // A strip's lanes past the last column idle: take strips (or their
  // tiles) only when at least three in four lanes have a column.
  const int64_t strips_per_outer = (s.inner + kStripWidth - 1) / kStripWidth;
  const bool strip_lanes_filled =
      s.inner > 1 && s.inner * 4 >= strips_per_outer * kStripWidth * 3;
  if (strip_lanes_filled && s.outer * strips_per_outer >= kMinStrips && !wide) {
    p.path = ScanPath::kColumnStrips;
    p.strips_per_outer = strips_per_outer;
    return p;
  }
  const int64_t strip_tiles = (s.len + kStripTileMinLen - 1) / kStripTileMinLen;
  if (strip_lanes_filled && strip_tiles >= 2 && strip_tiles <= kMaxStripTiles) {
    p.path = ScanPath::kStripTiles;
    p.strips_per_outer = strips_per_outer;
    p.tiles = strip_tiles;
    TileWorkspace w;
    w.tile_flags = strip_tiles * s.outer * strips_per_outer;
    w.tile_slots = w.tile_flags * kStripWidth;
    p.tile_ws = w;
    p.workspace_bytes = w.bytes();
    return p;
  }
  const int64_t columns = s.outer * s.inner;
  const int64_t tiles = (s.len + kColumnTileRows - 1) / kColumnTileRows;
  const int64_t groups = (tiles + kGroupTiles - 1) / kGroupTiles;
  if (s.inner > 1 && tiles >= 2 && groups <= kMaxColumnGroups) {
    const int64_t blocks = (columns + kColumnBlock - 1) / kColumnBlock;
    TileWorkspace w;
    w.tile_flags = tiles * blocks;
    w.group_flags = groups * blocks;
    w.tile_slots = tiles * columns;
    w.group_slots = groups * columns;
    if (w.bytes() <= kMaxColumnTileWorkspace) {
      p.path = ScanPath::kColumnTiles;
      p.tiles = tiles;
      p.groups = groups;
      p.column_blocks = blocks;
      p.tile_ws = w;
      p.workspace_bytes = w.bytes();
      return p;
    }
  }
  p.path = ScanPath::kColumns;
  int64_t segments = (kTargetThreads + columns - 1) / columns;
  segments = std::min(segments, (s.len + kMinSegmentLen - 1) / kMinSegmentLen);
  segments = std::max<int64_t>(1, std::min(segments, kMaxGridY));
  p.segments = segments;
  p.workspace_bytes = segments > 1 ? segments * columns * kWorkspaceSlotBytes : 0;
  return p;
}

// The CUDA kernels a path's scans run on, as the launcher chooses them
// (scan_launch.cuh's choose_kernel, by op, alignment, compiled targets and
// device), and as scan_path(x, dim, kind) names them.
enum class ScanKernel : int {
  kNone,
  kRowGroups,                  // row_groups: a group of lanes per row
  kWarpRows,                   // row_groups, rows: a warp per row (scan_warp_rows.cuh)
  kRows,                       // rows: a block per row
  kLongRows,                   // long_rows: tiles in registers, one pass
  kStagedRows,                 // long_rows: staged tiles of one array (scan_staged_rows.cuh)
  kSwizzledRuns,               // long_rows: logcumsumexp on swizzled stages
  kStagedExtremes,             // long_rows: cummax / cummin forward, staged
  kStagedCumprodGrad,          // long_rows: cumprod backward, staged
  kStagedLogcumsumexpGrad,     // long_rows: logcumsumexp backward, staged
  kSwizzledLogcumsumexpGrad,   // long_rows: two-byte logcumsumexp backward, swizzled
  kKeyedRows,                  // long_rows: cummax / cummin backward, tiles alone
  kColumnStrips,               // column_strips: loads through registers
  kStagedStrips,               // column_strips: loads staged by cp.async
  kStripTiles,                 // strip_tiles: a block per strip step
  kLongStripTiles,             // strip_tiles: a block per two strip steps
  kColumnTiles,                // column_tiles
  kColumns,                    // columns
};

inline const char* scan_kernel_name(ScanKernel kernel) {
  switch (kernel) {
    case ScanKernel::kNone: return "empty";
    case ScanKernel::kRowGroups: return "row_groups";
    case ScanKernel::kWarpRows: return "warp_rows";
    case ScanKernel::kRows: return "rows";
    case ScanKernel::kLongRows: return "long_rows";
    case ScanKernel::kStagedRows: return "staged_rows";
    case ScanKernel::kSwizzledRuns: return "swizzled_runs";
    case ScanKernel::kStagedExtremes: return "staged_extremes";
    case ScanKernel::kStagedCumprodGrad: return "staged_cumprod_grad";
    case ScanKernel::kStagedLogcumsumexpGrad: return "staged_logcumsumexp_grad";
    case ScanKernel::kSwizzledLogcumsumexpGrad: return "swizzled_logcumsumexp_grad";
    case ScanKernel::kKeyedRows: return "keyed_rows";
    case ScanKernel::kColumnStrips: return "column_strips";
    case ScanKernel::kStagedStrips: return "staged_strips";
    case ScanKernel::kStripTiles: return "strip_tiles";
    case ScanKernel::kLongStripTiles: return "long_strip_tiles";
    case ScanKernel::kColumnTiles: return "column_tiles";
    case ScanKernel::kColumns: return "columns";
  }
  return "?";
}

inline int64_t scan_workspace_bytes(const ScanShape& s) {
  return plan_scan(s).workspace_bytes;
}

inline const char* scan_path_name(ScanPath path) {
  switch (path) {
    case ScanPath::kEmpty: return "empty";
    case ScanPath::kRowGroups: return "row_groups";
    case ScanPath::kRows: return "rows";
    case ScanPath::kLongRows: return "long_rows";
    case ScanPath::kColumnStrips: return "column_strips";
    case ScanPath::kColumnTiles: return "column_tiles";
    case ScanPath::kColumns: return "columns";
    case ScanPath::kStripTiles: return "strip_tiles";
  }
  return "?";
}

}  // namespace baracuda
