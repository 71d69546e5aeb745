// CUDA executors of the merge launch contracts (merge_kernels.h).
//
// Work split: a cell's head_dim vector is covered by a group of G lanes
// (G a power of two <= 32, one 16-byte vector per lane and step when the
// layout allows), so a warp merges 32 / G cells at a time. The loop over
// cells is uniform across each warp, which lets the lanes of a group reduce
// with shuffles and order their reads before the in-place writes with
// __syncwarp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "common/compute_types.cuh"
#include "common/cuda_launch.cuh"
#include "common/offset_calculator.cuh"
#include "merge/merge_chunk.cuh"
#include "merge/merge_dense.h"
#include "merge/merge_kernels.h"

namespace baracuda {
namespace {

using namespace merge;

// Lanes of a warp-aligned group of `group` lanes (a power of two) sum x.
template <typename C>
__device__ inline C group_sum(C x, int group) {
  for (int o = group / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <typename C>
__device__ inline C group_max(C x, int group) {
  for (int o = group / 2; o > 0; o /= 2) x = merge_max(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

struct WarpTiling {
  int group, sub, lane_in_group, cells_per_warp;
  int64_t warp, num_warps;
  __device__ explicit WarpTiling(int g) : group(g) {
    const int lane = threadIdx.x & 31;
    sub = lane / g;
    lane_in_group = lane % g;
    cells_per_warp = 32 / g;
    warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5;
    num_warps = (gridDim.x * int64_t{blockDim.x}) >> 5;
  }
};

// Pointers of state i, for the pair and the stack forms alike.
template <typename P>
__device__ inline P* state_ptr(P* const (&ptrs)[2], bool stacked, int64_t state_stride,
                               int64_t cell_off_pair0, int64_t cell_off_pair1, int64_t i) {
  if (stacked) return ptrs[0] + cell_off_pair0 + i * state_stride;
  return i == 0 ? ptrs[0] + cell_off_pair0 : ptrs[1] + cell_off_pair1;
}

// A cell's largest LSE m and total weight W = sum_i b^(s_i - m) (0 when
// every state is empty, or for a lane past the last cell).
template <typename C, typename SAt>
__device__ inline void cell_max_and_total(bool valid, int64_t num_states, SAt s_at, C k, C& m,
                                          C& total) {
  m = neg_infinity<C>();
  total = 0;
  if (!valid) return;
  for (int64_t i = 0; i < num_states; ++i) m = merge_max(m, static_cast<C>(s_at(i)));
  if (m == neg_infinity<C>()) return;
  for (int64_t i = 0; i < num_states; ++i) total += state_weight<C>(s_at(i), m, k);
}

template <typename T>
struct ForwardParams {
  const T* v[2];
  const lse_t<T>* s[2];
  int64_t v_state_stride, s_state_stride;
  T* v_out;
  lse_t<T>* s_out;
  int64_t inner[kFwCount];
  int64_t num_states, head_dim;
  compute_t<T> log2_scale;
  bool stacked;
};

// Stack form with n <= group: lane j of a cell's group reads LSE j, so the n
// reads wait for memory once, and leaves weight j in shared memory for the
// whole group. Sums run in state order, as in cell_max_and_total.
template <typename C, typename SAt>
__device__ inline void cell_weights_cooperative(bool valid, int64_t num_states, SAt s_at, C k,
                                                const WarpTiling& tile, C* weights, C& m,
                                                C& total) {
  const int j = tile.lane_in_group;
  const C sj = (valid && j < num_states) ? static_cast<C>(s_at(j)) : neg_infinity<C>();
  m = group_max(sj, tile.group);
  weights[j] = (m != neg_infinity<C>() && j < num_states) ? state_weight<C>(sj, m, k) : C(0);
  __syncwarp();
  total = 0;
  for (int64_t i = 0; i < num_states; ++i) total += weights[i];
}

// Stack form: state i of a cell is v[0] + i * v_state_stride.
template <typename T, int VEC, typename Index>
__global__ void __launch_bounds__(256)
merge_stack_forward_kernel(ForwardParams<T> p, OffsetCalculator<kFwCount, Index> calc,
                           int64_t cells, int group) {
  using C = compute_t<T>;
  __shared__ C weight_slots[256];  // one per thread: see cell_weights_cooperative
  const WarpTiling tile(group);
  C* const weights = weight_slots + (threadIdx.x - tile.lane_in_group);
  const bool cooperative = p.num_states <= group;
  const int64_t chunks = (p.head_dim + VEC - 1) / VEC;
  const C k = p.log2_scale;
  for (int64_t base = tile.warp * tile.cells_per_warp; base < cells;
       base += tile.num_warps * tile.cells_per_warp) {
    const int64_t cell = base + tile.sub;
    const bool valid = cell < cells;
    int64_t off[kFwCount] = {};
    if (valid) calc.get(static_cast<Index>(cell), off);
    auto s_at = [&](int64_t i) { return p.s[0][off[kFwS0] + i * p.s_state_stride]; };
    C m, total;
    if (cooperative) {
      cell_weights_cooperative(valid, p.num_states, s_at, k, tile, weights, m, total);
    } else {
      cell_max_and_total(valid, p.num_states, s_at, k, m, total);
    }
    if (valid) {
      for (int64_t c = tile.lane_in_group; c < chunks; c += group) {
        C acc[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] = -C(0);
        if (m != neg_infinity<C>()) {
#pragma unroll 4
          for (int64_t i = 0; i < p.num_states; ++i) {
            // Loaded unconditionally so several loads are in flight.
            const Pack<T, VEC> x =
                load_raw<T, VEC>(p.v[0] + off[kFwV0] + i * p.v_state_stride, c, p.inner[kFwV0]);
            add_weighted(acc, cooperative ? weights[i] : state_weight<C>(s_at(i), m, k), x);
          }
        }
        normalise(acc, total);
        store<T, VEC>(p.v_out + off[kFwVOut], c, p.inner[kFwVOut], acc);
      }
    }
    // Every lane is done with this cell's weight slots before the next cell
    // overwrites them.
    __syncwarp();
    if (valid && tile.lane_in_group == 0) p.s_out[off[kFwSOut]] = merged_lse(m, total, k);
  }
}

// Pair form (merge_state, merge_state_). A group merges U cells per step and
// requests each cell's first chunk of both states and both LSEs before using
// any, so a cell waits for memory once. U trades loads in flight against
// registers (occupancy); see forward_typed.
// 16-bit types: 5 blocks per SM (48 registers) measured faster than 4.
template <typename T, int VEC, typename Index, int U>
__global__ void __launch_bounds__(256, sizeof(T) <= 2 ? 5 : 1)
merge_pair_forward_kernel(ForwardParams<T> p, OffsetCalculator<kFwCount, Index> calc,
                          int64_t cells, int group) {
  using C = compute_t<T>;
  const WarpTiling tile(group);
  const int64_t chunks = (p.head_dim + VEC - 1) / VEC;
  const int64_t c0 = tile.lane_in_group;
  const C k = p.log2_scale;
  const int64_t step = int64_t{tile.cells_per_warp} * U;
  for (int64_t base = tile.warp * step; base < cells; base += tile.num_warps * step) {
    int64_t off[U][kFwCount];
    bool valid[U];
    Pack<T, VEC> x0[U], x1[U];
    C s0[U], s1[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t cell = base + int64_t{u} * tile.cells_per_warp + tile.sub;
      valid[u] = cell < cells;
      if (valid[u]) {
        calc.get(static_cast<Index>(cell), off[u]);
        if (c0 < chunks) {
          x0[u] = load_raw<T, VEC>(p.v[0] + off[u][kFwV0], c0, p.inner[kFwV0]);
          x1[u] = load_raw<T, VEC>(p.v[1] + off[u][kFwV1], c0, p.inner[kFwV1]);
        }
        s0[u] = p.s[0][off[u][kFwS0]];
        s1[u] = p.s[1][off[u][kFwS1]];
      }
    }
    // Every lane has read its cells' LSEs before any lane overwrites one
    // (the in-place merge writes s_out over s[0]; each lane rewrites only
    // the v chunks it has itself read).
    __syncwarp();
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!valid[u]) continue;
      const PairWeights<C> w = pair_weights(s0[u], s1[u], k);
      for (int64_t c = c0; c < chunks; c += group) {
        if (c != c0) {
          x0[u] = load_raw<T, VEC>(p.v[0] + off[u][kFwV0], c, p.inner[kFwV0]);
          x1[u] = load_raw<T, VEC>(p.v[1] + off[u][kFwV1], c, p.inner[kFwV1]);
        }
        C acc[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] = -C(0);
        add_weighted(acc, w.w0, x0[u]);
        add_weighted(acc, w.w1, x1[u]);
        normalise(acc, w.total);
        store<T, VEC>(p.v_out + off[u][kFwVOut], c, p.inner[kFwVOut], acc);
      }
      if (tile.lane_in_group == 0) p.s_out[off[u][kFwSOut]] = merged_lse(w.m, w.total, k);
    }
  }
}

template <typename T>
struct BackwardParams {
  const T* grad_v;
  const lse_t<T>* grad_s;
  const T* v[2];
  const lse_t<T>* s[2];
  int64_t v_state_stride, s_state_stride;
  T* grad_vin[2];
  lse_t<T>* grad_sin[2];
  int64_t grad_v_state_stride, grad_s_state_stride;
  int64_t inner[kBwCount];
  int64_t num_states, head_dim;
  compute_t<T> log2_scale;
  bool stacked;
};

template <typename T, int VEC, typename Index>
__global__ void __launch_bounds__(256)
merge_backward_kernel(BackwardParams<T> p, OffsetCalculator<kBwCount, Index> calc, int64_t cells,
                      int group) {
  using C = compute_t<T>;
  const WarpTiling tile(group);
  const int64_t chunks = (p.head_dim + VEC - 1) / VEC;
  const C k = p.log2_scale;
  const C ln_b = C(0.6931471805599453) * k;
  for (int64_t base = tile.warp * tile.cells_per_warp; base < cells;
       base += tile.num_warps * tile.cells_per_warp) {
    const int64_t cell = base + tile.sub;
    const bool valid = cell < cells;
    int64_t off[kBwCount] = {};
    if (valid) calc.get(static_cast<Index>(cell), off);
    auto s_at = [&](int64_t i) {
      return static_cast<C>(*state_ptr(p.s, p.stacked, p.s_state_stride, off[kBwS0], off[kBwS1], i));
    };
    C m, total;
    cell_max_and_total(valid, p.num_states, s_at, k, m, total);
    auto prob = [&](int64_t i) {
      if (!valid || m == neg_infinity<C>()) return C(0);
      const C w = state_weight<C>(s_at(i), m, k);
      return state_share(w, total);
    };
    const C gs = (valid && p.grad_s != nullptr) ? static_cast<C>(p.grad_s[off[kBwGradS]]) : C(0);
    const T* gv = p.grad_v + off[kBwGradV];
    C dbar = 0;
    for (int64_t i = 0; i < p.num_states; ++i) {  // uniform across the warp
      const C pi = prob(i);
      const T* vi = state_ptr(p.v, p.stacked, p.v_state_stride, off[kBwV0], off[kBwV1], i);
      T* gvi = state_ptr(p.grad_vin, p.stacked, p.grad_v_state_stride, off[kBwGradV0],
                         off[kBwGradV1], i);
      const int64_t vi_inner = p.inner[p.stacked || i == 0 ? kBwV0 : kBwV1];
      const int64_t gvi_inner = p.inner[p.stacked || i == 0 ? kBwGradV0 : kBwGradV1];
      C d = 0;
      if (valid) {
        for (int64_t c = tile.lane_in_group; c < chunks; c += group) {
          C g[VEC], out[VEC];
          load<T, VEC>(gv, c, p.inner[kBwGradV], g);
          if (pi != 0) {
            C x[VEC];
            load<T, VEC>(vi, c, vi_inner, x);
#pragma unroll
            for (int e = 0; e < VEC; ++e) d += g[e] * x[e];
          }
#pragma unroll
          for (int e = 0; e < VEC; ++e) out[e] = pi * g[e];
          store<T, VEC>(gvi, c, gvi_inner, out);
        }
      }
      d = group_sum(d, group);
      if (valid && tile.lane_in_group == 0) {
        lse_t<T>* gsi = state_ptr(p.grad_sin, p.stacked, p.grad_s_state_stride, off[kBwGradS0],
                                  off[kBwGradS1], i);
        *gsi = pi != 0 ? pi * (gs + ln_b * d) : C(0);
      }
      dbar += pi * d;
    }
    if (valid && tile.lane_in_group == 0) {
      for (int64_t i = 0; i < p.num_states; ++i) {
        const C pi = prob(i);
        if (pi != 0) {
          *state_ptr(p.grad_sin, p.stacked, p.grad_s_state_stride, off[kBwGradS0],
                     off[kBwGradS1], i) -= pi * ln_b * dbar;
        }
      }
    }
  }
}

// ------------------------------------------------------------------ host side

int next_pow2_at_most_32(int64_t x) {
  int g = 1;
  while (g < 32 && g < x) g *= 2;
  return g;
}

bool aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// 16-byte vectors need unit inner strides, head_dim a multiple of the
// vector, and every base pointer and stride aligned to it.
template <typename T, int NT>
bool vector_ok(int64_t head_dim, const int64_t (&inner)[NT], const int* v_slots, int n_slots,
               const void* const* ptrs, int n_ptrs, const int64_t (&cell_strides)[NT][kMaxRank],
               int rank, const int64_t* extra_strides, int n_extra) {
  constexpr int vec = 16 / sizeof(T);
  if (head_dim % vec != 0) return false;
  for (int j = 0; j < n_slots; ++j) {
    if (inner[v_slots[j]] != 1) return false;
    for (int d = 0; d < rank; ++d) {
      if (cell_strides[v_slots[j]][d] % vec != 0) return false;
    }
  }
  for (int j = 0; j < n_ptrs; ++j) {
    if (ptrs[j] != nullptr && !aligned(ptrs[j], 16)) return false;
  }
  for (int j = 0; j < n_extra; ++j) {
    if (extra_strides[j] % vec != 0) return false;
  }
  return true;
}

// cells_per_step: cells a lane group takes per loop step (U of the pair kernel).
template <typename Kernel, typename Params, typename Calc>
KernelStatus launch(Kernel kernel, const Params& params, const Calc& calc, int64_t cells,
                    int group, cudaStream_t stream, int cells_per_step = 1) {
  const int threads = 256;
  const int64_t cells_per_block = (threads / 32) * (32 / group) * cells_per_step;
  int64_t blocks = ceil_div(cells, cells_per_block);
  if (blocks > (int64_t{1} << 20)) blocks = int64_t{1} << 20;  // the loop covers the rest
  kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(params, calc, cells, group);
  return launch_status();
}

// Calls go(vector width constant, index type value): 16-byte vectors when
// the layout allows, 31-bit indices (multiply-shift divides) when they fit.
template <int Vec, typename Go>
KernelStatus with_vec_and_index(bool use_vec, int64_t cells, Go&& go) {
  using One = std::integral_constant<int, 1>;
  using Wide = std::integral_constant<int, Vec>;
  const bool narrow = cells < (int64_t{1} << 31);
  if (use_vec) return narrow ? go(Wide{}, uint32_t{}) : go(Wide{}, int64_t{});
  return narrow ? go(One{}, uint32_t{}) : go(One{}, int64_t{});
}

template <typename T>
KernelStatus forward_typed(const MergeForwardArgs& a, cudaStream_t stream) {
  ForwardParams<T> p;
  p.v[0] = static_cast<const T*>(a.v[0]);
  p.v[1] = static_cast<const T*>(a.v[1]);
  p.s[0] = static_cast<const lse_t<T>*>(a.s[0]);
  p.s[1] = static_cast<const lse_t<T>*>(a.s[1]);
  p.v_state_stride = a.v_state_stride;
  p.s_state_stride = a.s_state_stride;
  p.v_out = static_cast<T*>(a.v_out);
  p.s_out = static_cast<lse_t<T>*>(a.s_out);
  for (int t = 0; t < kFwCount; ++t) p.inner[t] = a.inner_strides[t];
  p.num_states = a.num_states;
  p.head_dim = a.head_dim;
  p.log2_scale = static_cast<compute_t<T>>(a.log2_scale);
  p.stacked = a.stacked;

  int64_t cells = 1;
  for (int d = 0; d < a.cells.rank; ++d) cells *= a.cells.sizes[d];
  if (cells == 0) return KernelStatus::ok();
  const int v_slots[] = {kFwV0, kFwV1, kFwVOut};
  const void* ptrs[] = {a.v[0], a.stacked ? nullptr : a.v[1], a.v_out};
  const int64_t extra[] = {a.v_state_stride};
  constexpr int vec = 16 / sizeof(T);
  const bool use_vec = vector_ok<T, kFwCount>(a.head_dim, a.inner_strides, v_slots,
                                              a.stacked ? 1 : 2, ptrs, 3, a.cell_strides,
                                              a.cells.rank, extra, 1) &&
                       a.inner_strides[kFwVOut] == 1;
  const int group = next_pow2_at_most_32(ceil_div(a.head_dim, use_vec ? vec : 1));
  // Pair cells per step, measured on H100 ([8192, 32, 128], 16-byte
  // vectors): occupancy beats loads in flight for 16-bit types (1 cell:
  // 81 us, 2: 88, 4: 106), while float32 gains from a second (1: 153 us,
  // 2: 137, 4: 145).
  constexpr int kPairCellsPerStep = sizeof(T) <= 2 ? 1 : 2;
  return with_vec_and_index<vec>(use_vec, cells, [&](auto vec_c, auto index_c) {
    using Index = decltype(index_c);
    constexpr int kVec = decltype(vec_c)::value;
    const auto calc = make_offset_calculator<kFwCount, Index>(a.cells.rank, a.cells.sizes,
                                                              a.cell_strides);
    if (a.stacked) {
      return launch(merge_stack_forward_kernel<T, kVec, Index>, p, calc, cells, group, stream);
    }
    return launch(merge_pair_forward_kernel<T, kVec, Index, kPairCellsPerStep>, p, calc, cells,
                  group, stream, kPairCellsPerStep);
  });
}

template <typename T>
KernelStatus backward_typed(const MergeBackwardArgs& a, cudaStream_t stream) {
  BackwardParams<T> p;
  p.grad_v = static_cast<const T*>(a.grad_v);
  p.grad_s = static_cast<const lse_t<T>*>(a.grad_s);
  for (int i = 0; i < 2; ++i) {
    p.v[i] = static_cast<const T*>(a.v[i]);
    p.s[i] = static_cast<const lse_t<T>*>(a.s[i]);
    p.grad_vin[i] = static_cast<T*>(a.grad_vin[i]);
    p.grad_sin[i] = static_cast<lse_t<T>*>(a.grad_sin[i]);
  }
  p.v_state_stride = a.v_state_stride;
  p.s_state_stride = a.s_state_stride;
  p.grad_v_state_stride = a.grad_v_state_stride;
  p.grad_s_state_stride = a.grad_s_state_stride;
  for (int t = 0; t < kBwCount; ++t) p.inner[t] = a.inner_strides[t];
  p.num_states = a.num_states;
  p.head_dim = a.head_dim;
  p.log2_scale = static_cast<compute_t<T>>(a.log2_scale);
  p.stacked = a.stacked;

  int64_t cells = 1;
  for (int d = 0; d < a.cells.rank; ++d) cells *= a.cells.sizes[d];
  if (cells == 0) return KernelStatus::ok();
  const int v_slots_pair[] = {kBwGradV, kBwV0, kBwV1, kBwGradV0, kBwGradV1};
  const int v_slots_stack[] = {kBwGradV, kBwV0, kBwGradV0};
  const void* ptrs[] = {a.grad_v, a.v[0], a.stacked ? nullptr : a.v[1], a.grad_vin[0],
                        a.stacked ? nullptr : a.grad_vin[1]};
  const int64_t extra[] = {a.v_state_stride, a.grad_v_state_stride};
  constexpr int vec = 16 / sizeof(T);
  const bool use_vec =
      a.stacked ? vector_ok<T, kBwCount>(a.head_dim, a.inner_strides, v_slots_stack, 3, ptrs, 5,
                                         a.cell_strides, a.cells.rank, extra, 2)
                : vector_ok<T, kBwCount>(a.head_dim, a.inner_strides, v_slots_pair, 5, ptrs, 5,
                                         a.cell_strides, a.cells.rank, extra, 0);
  const int group = next_pow2_at_most_32(ceil_div(a.head_dim, use_vec ? vec : 1));
  return with_vec_and_index<vec>(use_vec, cells, [&](auto vec_c, auto index_c) {
    using Index = decltype(index_c);
    return launch(merge_backward_kernel<T, decltype(vec_c)::value, Index>, p,
                  make_offset_calculator<kBwCount, Index>(a.cells.rank, a.cells.sizes,
                                                          a.cell_strides),
                  cells, group, stream);
  });
}

}  // namespace

KernelStatus merge_forward_cuda(const MergeForwardArgs& a, void* stream) {
  const DenseMergeLayout dense = dense_forward_layout(a, float_dtype_bytes(a.dtype));
  if (dense.dense) return merge_forward_dense_cuda(a, dense, stream);
  return dispatch_float_dtype<__half, __nv_bfloat16>(a.dtype, [&](auto t) {
    return forward_typed<decltype(t)>(a, static_cast<cudaStream_t>(stream));
  });
}

KernelStatus merge_backward_cuda(const MergeBackwardArgs& a, void* stream) {
  return dispatch_float_dtype<__half, __nv_bfloat16>(a.dtype, [&](auto t) {
    return backward_typed<decltype(t)>(a, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace baracuda
