// The dense forward layout: the one the merge ops produce and most callers
// pass (contiguous v and s). In it a 16-byte unit of a head_dim vector is
// found from its flat index with one division, so the dense kernels
// (merge_dense.cu) spend no registers on per-tensor strides: those
// registers went to occupancy, which decides the speed of these
// memory-bound kernels. Host-only and framework-free.
#pragma once

#include <cstdint>

#include "merge/merge_kernels.h"

namespace baracuda {

// Cells are numbered row-major over args.cells. In the dense layout, cell c
// of a pair tensor or of an output sits at c * head_dim (v) and at c (s).
// A stack (merge_states) keeps its stack axis between the cell axes: with
// H the product of the cell axes after it, state i of cell c = o * H + h
// sits at ((o * n + i) * H + h) * head_dim (v) and at (o * n + i) * H + h
// (s). Every v tensor has unit stride along head_dim, and head_dim fills
// whole 16-byte units.
struct DenseMergeLayout {
  bool dense = false;
  int64_t units_per_cell = 0;  // 16-byte units of one head_dim vector
  int64_t heads = 1;           // H (stack form)
};

namespace merge_detail {

// Strides of one tensor over the cell axes match the dense layout with
// element `unit` per cell, the stack axis of `states` entries sitting just
// before cell axis `split` (states == 1: no stack axis).
inline bool dense_strides(const CellGrid& g, const int64_t* strides, int64_t unit, int split,
                          int64_t states) {
  int64_t expected = unit;
  for (int d = g.rank - 1; d >= 0; --d) {
    if (d + 1 == split) expected *= states;
    if (g.sizes[d] != 1 && strides[d] != expected) return false;
    expected *= g.sizes[d];
  }
  return true;
}

}  // namespace merge_detail

inline DenseMergeLayout dense_forward_layout(const MergeForwardArgs& a, int element_bytes) {
  using merge_detail::dense_strides;
  DenseMergeLayout out;
  const int64_t d = a.head_dim;
  if (d <= 0 || (d * element_bytes) % 16 != 0) return out;
  const int v_slots[] = {kFwV0, kFwV1, kFwVOut};
  for (int t : v_slots) {
    if ((t != kFwV1 || !a.stacked) && a.inner_strides[t] != 1) return out;
  }
  const void* ptrs[] = {a.v[0], a.stacked ? nullptr : a.v[1], a.v_out};
  for (const void* p : ptrs) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return out;
  }
  if (!dense_strides(a.cells, a.cell_strides[kFwVOut], d, 0, 1) ||
      !dense_strides(a.cells, a.cell_strides[kFwSOut], 1, 0, 1)) {
    return out;
  }
  out.units_per_cell = d * element_bytes / 16;
  if (!a.stacked) {
    out.dense = dense_strides(a.cells, a.cell_strides[kFwV0], d, 0, 1) &&
                dense_strides(a.cells, a.cell_strides[kFwV1], d, 0, 1) &&
                dense_strides(a.cells, a.cell_strides[kFwS0], 1, 0, 1) &&
                dense_strides(a.cells, a.cell_strides[kFwS1], 1, 0, 1);
    // In place, the lane writing a cell's LSE must not run ahead of lanes of
    // the same cell still to read it: only a cell within one warp is safe.
    if (a.s_out == a.s[0] && 32 % out.units_per_cell != 0) out.dense = false;
    return out;
  }
  // Stack: try every place of the stack axis among the cell axes. An empty
  // stack is laid out as if it held one state (torch's strides do the same).
  const int64_t states = a.num_states > 1 ? a.num_states : 1;
  int64_t heads = 1;
  for (int split = a.cells.rank; split >= 0; --split) {
    if (split < a.cells.rank) heads *= a.cells.sizes[split];
    const bool strides_fit =
        states == 1 || (a.v_state_stride == heads * d && a.s_state_stride == heads);
    if (strides_fit && dense_strides(a.cells, a.cell_strides[kFwV0], d, split, states) &&
        dense_strides(a.cells, a.cell_strides[kFwS0], 1, split, states)) {
      out.dense = true;
      out.heads = heads;
      return out;
    }
  }
  return out;
}

// Runs the forward merge with the dense kernels; only for layouts that
// dense_forward_layout accepts.
KernelStatus merge_forward_dense_cuda(const MergeForwardArgs& a, const DenseMergeLayout& layout,
                                      void* stream);

}  // namespace baracuda
