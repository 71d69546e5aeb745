// Launching a kernel that hands states from block to block behind ready
// marks (long_rows, strip_tiles, column_tiles): on its stream's standing
// slots where it has them (common/standing_slots.h), with no zeroing ahead
// of it and no workspace; else on the workspace the op allocates, zeroed
// by a kernel of its own just ahead (common/zeroed_launch.cuh). With the
// zeroing, queuing a strip_tiles or column_tiles call took markedly more
// of the host's time than on the paths with no workspace. The staged long
// rows, launched cooperatively, lease their slots themselves
// (scan_launch.cuh). No torch headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "common/cuda_launch.cuh"
#include "common/standing_slots.h"
#include "common/zeroed_launch.cuh"
#include "scan/scan_kernels.h"
#include "scan/scan_publish.cuh"

namespace baracuda {
namespace scan {

// Launches `kernel` over `grid` with `args` and, last, what
// `slots_at(marked, states, mark)` makes of the slots: `marked_bytes` that
// hold only zeros, marks and ticket counters, then `state_bytes` for
// anything. The kernel takes its tickets by take_ticket_and_rewind, reads
// as ready only what carries `mark`, and calls grid_dependency_wait before
// it touches the slots: the launch may be programmatic, and the launch
// ahead of it may be the last to use them.
template <typename SlotsAt, typename... Params, typename... Args>
KernelStatus launch_on_slots(StandingKind kind, int64_t marked_bytes, int64_t state_bytes,
                             const ScanWorkspace& workspace, SlotsAt&& slots_at,
                             void (*kernel)(Params...), dim3 grid, dim3 block,
                             cudaStream_t stream, Args&&... args) {
  StandingLease lease;  // held until the launch is queued
  if (lease_standing_slots(stream, kind, marked_bytes, state_bytes, lease)) {
    return launch_kernel(kernel, grid, block, 0, stream, kernel_compiled_for_sm90(kernel),
                         std::forward<Args>(args)...,
                         slots_at(lease.slots, lease.states, lease.mark));
  }
  void* words = nullptr;
  KernelStatus st = KernelStatus::ok();
  if (!workspace.take(words, st)) return st;
  return launch_behind_zeroing(words, marked_bytes, kernel, grid, block, 0, stream,
                               std::forward<Args>(args)...,
                               slots_at(words, static_cast<char*>(words) + marked_bytes,
                                        kZeroedSlotsMark));
}

// The ticketed tiles (column_tiles, strip_tiles) of workspace layout `w`,
// their kernel taking TileSlots<State> last.
template <typename State, typename... Params, typename... Args>
KernelStatus launch_ticketed_tiles(void (*kernel)(Params...), dim3 grid, dim3 block,
                                   const ScanWorkspace& workspace, const TileWorkspace& w,
                                   cudaStream_t stream, Args&&... args) {
  return launch_on_slots(
      StandingKind::kTicketedTiles, w.zeroed_bytes(), w.bytes() - w.zeroed_bytes(),
      workspace,
      [&](void* marked, void* states, uint64_t mark) {
        return tile_slots<State>(marked, states, w, static_cast<unsigned int>(mark));
      },
      kernel, grid, block, stream, std::forward<Args>(args)...);
}

}  // namespace scan
}  // namespace baracuda
