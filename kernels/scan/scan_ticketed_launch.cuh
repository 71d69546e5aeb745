// Launching a ticketed tile kernel (column_tiles, strip_tiles): on its
// stream's standing slots where it has them (common/standing_slots.h), with
// no zeroing ahead of it; else behind the zeroing of the workspace the op
// allocated (common/zeroed_launch.cuh). The zeroing is a launch of its
// own: with it, queuing a strip_tiles or column_tiles call took 11-16 us
// of the host's time, against 7-10 on the paths with no workspace (H200,
// benchmarks/scan_host_probe.py). No torch headers.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/cuda_launch.cuh"
#include "common/standing_slots.h"
#include "common/zeroed_launch.cuh"
#include "scan/scan_kernels.h"
#include "scan/scan_plan.h"
#include "scan/scan_publish.cuh"

namespace baracuda {
namespace scan {

// Launches `kernel` over `grid` with `args` and, last, its TileSlots<State>
// for workspace layout `w`. The kernel takes its tickets by
// take_ticket_and_rewind, waits for flags that read TileSlots' mark, and
// calls grid_dependency_wait before it touches the slots: the launch may be
// programmatic, and the launch ahead of it may be the last to use them.
template <typename State, typename... Params, typename... Args>
KernelStatus launch_ticketed_tiles(void (*kernel)(Params...), dim3 grid, dim3 block,
                                   const ScanWorkspace& workspace, const TileWorkspace& w,
                                   cudaStream_t stream, Args&&... args) {
  StandingLease lease;  // held until the launch is queued
  if (lease_standing_tile_slots(stream, w.zeroed_bytes(), w.bytes() - w.zeroed_bytes(), lease)) {
    return launch_kernel(kernel, grid, block, 0, stream, kernel_compiled_for_sm90(kernel),
                         std::forward<Args>(args)...,
                         tile_slots<State>(lease.slots, lease.states, w,
                                           static_cast<unsigned int>(lease.mark)));
  }
  void* words = workspace.get();
  if (words == nullptr) return KernelStatus::invalid("scan: this shape needs a workspace");
  return launch_behind_zeroing(words, w.zeroed_bytes(), kernel, grid, block, 0, stream,
                               std::forward<Args>(args)..., tile_slots<State>(words, w));
}

}  // namespace scan
}  // namespace baracuda
