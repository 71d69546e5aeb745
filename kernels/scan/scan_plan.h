// Which CUDA path a scan of a given [outer, len, inner] shape takes, and how
// much workspace it needs. Host-only and framework-free: the op layer uses it
// to size the workspace and to report the path; the launcher to launch.
//
//   rows       inner == 1: one block per row walks it in chunks of
//              kRowChunk, carrying the prefix from chunk to chunk.
//   long_rows  inner == 1, few long rows: one pass over tiles of kTileLen
//              held in registers. Tiles take tickets in order, publish their
//              totals, and each group of kGroupTiles tiles gets one total
//              (published by the group's last tile); a tile's prefix is the
//              in-order reduction of the earlier groups' totals and of the
//              earlier tiles of its own group -- the same association
//              whatever the timing, so bit-identical run to run, and a tile
//              only ever waits for tiles with smaller tickets (no deadlock).
//   columns    inner > 1: one thread per (outer, inner) column, coalesced
//              along inner, walking the axis; long axes are cut into
//              `segments` pieces chained the same three-pass way. Short rows
//              (inner == 1, len <= kShortRow) take it too, a thread per row:
//              a whole block per row of a few elements would idle.
#pragma once

#include <algorithm>
#include <cstdint>

#include "scan/scan_kernels.h"

namespace baracuda {

enum class ScanPath : int { kEmpty, kRows, kLongRows, kColumns };

constexpr int kScanBlock = 256;         // threads of a row / tile block
constexpr int kScanItems = 8;           // consecutive elements per thread
constexpr int64_t kRowChunk = int64_t(kScanBlock) * kScanItems;
constexpr int64_t kTileLen = kRowChunk;   // long_rows: one chunk per tile
constexpr int64_t kGroupTiles = 32;
constexpr int kColumnBlock = 128;       // threads of a column block
constexpr int64_t kWorkspaceSlotBytes = 16;  // every scan state fits in 16 bytes
// Enough independent columns (or tiles) to keep every SM of a large GPU busy.
constexpr int64_t kTargetThreads = int64_t(1) << 18;
constexpr int64_t kMinSegmentLen = 32;
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kShortRow = 32;

// long_rows workspace, in this order: the ticket counter (16 bytes), one
// ready flag per tile and per group (uint32, zeroed before every launch),
// then one state slot per tile and per group.
struct TileWorkspace {
  int64_t tile_count = 0;   // outer * tiles
  int64_t group_count = 0;  // outer * groups
  int64_t flag_bytes() const {
    return ((tile_count + group_count) * 4 + 15) / 16 * 16;
  }
  int64_t zeroed_bytes() const { return 16 + flag_bytes(); }
  int64_t bytes() const { return zeroed_bytes() + (tile_count + group_count) * kWorkspaceSlotBytes; }
};

struct ScanPlan {
  ScanPath path = ScanPath::kEmpty;
  int64_t tiles = 1;     // long_rows: tiles per row
  int64_t groups = 1;    // long_rows: groups of kGroupTiles tiles per row
  int64_t segments = 1;  // columns: pieces of the axis
  int64_t workspace_bytes = 0;
  TileWorkspace tile_ws;
};

inline ScanPlan plan_scan(const ScanShape& s) {
  ScanPlan p;
  if (s.numel() == 0) return p;
  if (s.inner == 1 && s.len > kShortRow) {
    const int64_t tiles = (s.len + kTileLen - 1) / kTileLen;
    // A few long rows would leave most SMs idle with one block per row.
    if (tiles >= 2 && s.outer * 4 < kTargetThreads / kScanBlock) {
      p.path = ScanPath::kLongRows;
      p.tiles = tiles;
      p.groups = (tiles + kGroupTiles - 1) / kGroupTiles;
      p.tile_ws.tile_count = s.outer * tiles;
      p.tile_ws.group_count = s.outer * p.groups;
      p.workspace_bytes = p.tile_ws.bytes();
    } else {
      p.path = ScanPath::kRows;
    }
    return p;
  }
  p.path = ScanPath::kColumns;
  const int64_t columns = s.outer * s.inner;
  int64_t segments = (kTargetThreads + columns - 1) / columns;
  segments = std::min(segments, (s.len + kMinSegmentLen - 1) / kMinSegmentLen);
  segments = std::max<int64_t>(1, std::min(segments, kMaxGridY));
  p.segments = segments;
  p.workspace_bytes = segments > 1 ? segments * columns * kWorkspaceSlotBytes : 0;
  return p;
}

inline int64_t scan_workspace_bytes(const ScanShape& s) {
  return plan_scan(s).workspace_bytes;
}

inline const char* scan_path_name(ScanPath path) {
  switch (path) {
    case ScanPath::kEmpty: return "empty";
    case ScanPath::kRows: return "rows";
    case ScanPath::kLongRows: return "long_rows";
    case ScanPath::kColumns: return "columns";
  }
  return "?";
}

}  // namespace baracuda
