// Launchers of the attention-state merge family, over raw pointers.
//
// A state is (v, s): v a head_dim vector, s its log-sum-exp. Merging states
// i = 0..n-1 of one cell (a (position, head) pair):
//   m = max_i s_i,  w_i = b^(s_i - m),  W = sum_i w_i
//   v = sum_i w_i v_i / W,  s = m + log_b W
// with the empty state (v = 0, s = -inf) as neutral element: a cell whose
// states are all empty gives (0, -inf), and a state of weight 0 is skipped
// (never multiplied), so merging with an empty state is exact bit for bit.
// A cell with an LSE of NaN or +inf is undefined and merges to (NaN, NaN)
// (merge_math.h).
//
// States come in two forms: a pair of separate tensors (merge_state) or a
// stack along one axis (merge_states). Every tensor may have its own strides.
#pragma once

#include <cstdint>

#include "common/float_dtype.h"
#include "common/status.h"
#include "common/strided_layout.h"

namespace baracuda {

// Offsets of every cell, per tensor, over the cell axes (all axes of v but
// the head dim; for a stack, also without the stack axis), outermost first.
struct CellGrid {
  int rank = 0;
  int64_t sizes[kMaxRank] = {};
};

// Forward: which tensor each row of cell_strides / entry of inner_strides is.
enum MergeForwardTensor { kFwV0, kFwV1, kFwS0, kFwS1, kFwVOut, kFwSOut, kFwCount };

struct MergeForwardArgs {
  FloatDtype dtype = FloatDtype::kFloat32;  // of v; s is float32 (float64 with float64 v)
  int64_t num_states = 2;
  int64_t head_dim = 0;
  // Pair form: state i is (v[i], s[i]). Stack form: state i is
  // (v[0] + i * v_state_stride, s[0] + i * s_state_stride).
  bool stacked = false;
  const void* v[2] = {nullptr, nullptr};
  const void* s[2] = {nullptr, nullptr};
  int64_t v_state_stride = 0;
  int64_t s_state_stride = 0;
  void* v_out = nullptr;  // may alias v[0] / s[0] (in-place pairwise merge)
  void* s_out = nullptr;
  CellGrid cells;
  int64_t cell_strides[kFwCount][kMaxRank] = {};  // in elements
  int64_t inner_strides[kFwCount] = {};            // along head_dim (v tensors)
  // s is in base b; log2_scale = log2(b) converts it to base 2 (1 for "2",
  // 1/ln 2 for "e").
  double log2_scale = 1.0;
};

enum MergeBackwardTensor {
  kBwGradV, kBwGradS, kBwV0, kBwV1, kBwS0, kBwS1, kBwGradV0, kBwGradV1, kBwGradS0, kBwGradS1,
  kBwCount
};

// Backward of the merge with respect to every input state:
//   p_i = w_i / W,  d_i = <grad_v, v_i>,  dbar = sum_i p_i d_i
//   grad_v_i = p_i grad_v
//   grad_s_i = p_i (grad_s + ln(b) (d_i - dbar))
// States of weight 0 (empty) get zero gradients; every state of an
// undefined cell gets NaN ones.
struct MergeBackwardArgs {
  FloatDtype dtype = FloatDtype::kFloat32;
  int64_t num_states = 2;
  int64_t head_dim = 0;
  bool stacked = false;
  const void* grad_v = nullptr;
  const void* grad_s = nullptr;  // nullptr: zero
  const void* v[2] = {nullptr, nullptr};
  const void* s[2] = {nullptr, nullptr};
  int64_t v_state_stride = 0;
  int64_t s_state_stride = 0;
  void* grad_vin[2] = {nullptr, nullptr};  // stacked: grad_vin[0] + i * stride
  void* grad_sin[2] = {nullptr, nullptr};
  int64_t grad_v_state_stride = 0;
  int64_t grad_s_state_stride = 0;
  CellGrid cells;
  int64_t cell_strides[kBwCount][kMaxRank] = {};
  int64_t inner_strides[kBwCount] = {};
  double log2_scale = 1.0;
};

KernelStatus merge_forward_cuda(const MergeForwardArgs& args, void* stream);
KernelStatus merge_backward_cuda(const MergeBackwardArgs& args, void* stream);

// Host versions for float32 and float64 (the op layer upcasts half types).
KernelStatus merge_forward_cpu(const MergeForwardArgs& args);
KernelStatus merge_backward_cpu(const MergeBackwardArgs& args);

}  // namespace baracuda
