// Forward merge kernels for the dense layout (merge_dense.h).
//
// One thread per 16-byte unit of an output vector, consecutive threads on
// consecutive units: every warp access is one contiguous run, a unit's loads
// are all issued before the first is used, and a thread needs few enough
// registers for a full SM. On H100, bf16: merge_state [8192, 32, 128]
// 70-72 us against 77 for the lane-group kernels of merge.cu (whose
// per-tensor strides and loops cost them occupancy), merge_states
// [4096, 8, 32, 128] 105 us against 118.
//
// The arithmetic and its order are those of merge.cu: accumulators start at
// -0, a state of weight 0 is never added, weights are summed in state order,
// so both paths give identical bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/cuda_launch.cuh"
#include "merge/merge_chunk.cuh"
#include "merge/merge_dense.h"

namespace baracuda {
namespace {

using namespace merge;

// Pair blocks of 512 threads measured ~1 % faster than 256 on H100 (32
// registers: four blocks fill an SM); stack blocks stay at 256, which keeps
// five resident at their 44 registers.
constexpr int kPairBlock = 512;
constexpr int kStackBlock = 256;
constexpr int kUnitBytes = 16;
// States of a stack whose units one thread loads before using any: a stack
// of up to kShallowStack states is loaded whole; a deeper one in batches of
// kDeepBatch (its accumulators and pointers stay live across batches).
constexpr int kShallowStack = 8;
constexpr int kDeepBatch = 4;

template <typename T>
struct DenseParams {
  const T* v[2];
  const lse_t<T>* s[2];
  T* v_out;
  lse_t<T>* s_out;
  int64_t num_states;
  compute_t<T> log2_scale;
};

template <typename T, typename Index>
__global__ void __launch_bounds__(kPairBlock)
merge_pair_dense_kernel(DenseParams<T> p, typename DividerFor<Index>::type units_per_cell,
                        int64_t units) {
  using C = compute_t<T>;
  constexpr int kVec = kUnitBytes / sizeof(T);
  const int64_t unit = int64_t{blockIdx.x} * kPairBlock + threadIdx.x;
  const bool valid = unit < units;
  Pack<T, kVec> x0, x1;
  C s0 = 0, s1 = 0;
  int64_t cell = 0;
  if (valid) {
    cell = units_per_cell.div(static_cast<Index>(unit));
    x0 = load_raw<T, kVec>(p.v[0], unit);
    x1 = load_raw<T, kVec>(p.v[1], unit);
    s0 = p.s[0][cell];
    s1 = p.s[1][cell];
  }
  // In place, the LSE of a cell is rewritten by its first lane: every lane
  // of the cell (one warp, see dense_forward_layout) has read it by then.
  __syncwarp();
  if (!valid) return;
  const C k = p.log2_scale;
  const PairWeights<C> w = pair_weights(s0, s1, k);
  C acc[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) acc[e] = -C(0);
  add_weighted(acc, w.w0, x0);
  add_weighted(acc, w.w1, x1);
  normalise(acc, w.total);
  store<T, kVec>(p.v_out, unit, 1, acc);
  if (unit == cell * static_cast<int64_t>(units_per_cell.divisor)) {
    p.s_out[cell] = merged_lse(w.m, w.total, k);
  }
}

template <typename T, typename Index, bool kShallow>
__global__ void __launch_bounds__(kStackBlock)
merge_stack_dense_kernel(DenseParams<T> p, typename DividerFor<Index>::type units_per_cell,
                         typename DividerFor<Index>::type heads, int64_t units) {
  using C = compute_t<T>;
  constexpr int kVec = kUnitBytes / sizeof(T);
  const int64_t unit = int64_t{blockIdx.x} * kStackBlock + threadIdx.x;
  if (unit >= units) return;
  const int64_t upc = units_per_cell.divisor;
  const int64_t h_count = heads.divisor;
  const int64_t cell = units_per_cell.div(static_cast<Index>(unit));
  const int64_t chunk = unit - cell * upc;
  const int64_t o = heads.div(static_cast<Index>(cell));
  const int64_t n = p.num_states;
  // State i of this cell: LSE at s[first + i * H], unit at first * upc +
  // chunk + i * H * upc.
  const int64_t first = o * n * h_count + (cell - o * h_count);
  const lse_t<T>* s = p.s[0] + first;
  const T* v = p.v[0] + (first * upc + chunk) * kVec;
  const int64_t v_step = h_count * upc * kVec;

  // A batch of states is loaded (units and LSEs) before any is used. A
  // shallow stack is one batch and takes its largest LSE from those
  // registers; a deep one needs it before its first weight, so reads the
  // LSEs once more up front.
  constexpr int kBatch = kShallow ? kShallowStack : kDeepBatch;
  C m = neg_infinity<C>();
  if (!kShallow) {
    for (int64_t i = 0; i < n; ++i) m = merge_max(m, static_cast<C>(s[i * h_count]));
  }
  const C k = p.log2_scale;
  C acc[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) acc[e] = -C(0);
  C total = 0;
  for (int64_t i0 = 0; i0 < n; i0 += kBatch) {
    // Slots past the last state load the last state again, with an LSE of
    // -inf (weight 0, never added): no load or weight is conditional, which
    // keeps a bf16 batch of 8 in 44 registers instead of 128.
    Pack<T, kVec> x[kBatch];
    C sb[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      x[b] = load_raw<T, kVec>(v, 0);
      sb[b] = i0 + b < n ? static_cast<C>(s[0]) : neg_infinity<C>();
      if (i0 + b + 1 < n) {
        v += v_step;
        s += h_count;
      }
    }
    if (kShallow) {
#pragma unroll
      for (int b = 0; b < kBatch; ++b) m = merge_max(m, sb[b]);
    }
    if (m != neg_infinity<C>()) {
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const C w = state_weight<C>(sb[b], m, k);
        total += w;
        add_weighted(acc, w, x[b]);
      }
    }
    if (kShallow) break;
  }
  normalise(acc, total);
  store<T, kVec>(p.v_out, unit, 1, acc);
  if (chunk == 0) p.s_out[cell] = merged_lse(m, total, k);
}

template <typename T>
KernelStatus dense_typed(const MergeForwardArgs& a, const DenseMergeLayout& layout,
                         cudaStream_t stream) {
  DenseParams<T> p;
  for (int i = 0; i < 2; ++i) {
    p.v[i] = static_cast<const T*>(a.v[i]);
    p.s[i] = static_cast<const lse_t<T>*>(a.s[i]);
  }
  p.v_out = static_cast<T*>(a.v_out);
  p.s_out = static_cast<lse_t<T>*>(a.s_out);
  p.num_states = a.num_states;
  p.log2_scale = static_cast<compute_t<T>>(a.log2_scale);
  int64_t cells = 1;
  for (int d = 0; d < a.cells.rank; ++d) cells *= a.cells.sizes[d];
  const int64_t units = cells * layout.units_per_cell;
  if (units == 0) return KernelStatus::ok();
  auto go = [&](auto index) {
    using Index = decltype(index);
    const auto upc = make_divider<Index>(layout.units_per_cell);
    if (a.stacked) {
      const auto heads = make_divider<Index>(layout.heads);
      auto kernel = a.num_states <= kShallowStack ? merge_stack_dense_kernel<T, Index, true>
                                                  : merge_stack_dense_kernel<T, Index, false>;
      kernel<<<static_cast<unsigned>(ceil_div(units, kStackBlock)), kStackBlock, 0, stream>>>(
          p, upc, heads, units);
    } else {
      merge_pair_dense_kernel<T, Index>
          <<<static_cast<unsigned>(ceil_div(units, kPairBlock)), kPairBlock, 0, stream>>>(p, upc,
                                                                                         units);
    }
    return launch_status();
  };
  return units < (int64_t{1} << 31) ? go(uint32_t{}) : go(int64_t{});
}

}  // namespace

KernelStatus merge_forward_dense_cuda(const MergeForwardArgs& a, const DenseMergeLayout& layout,
                                      void* stream) {
  return dispatch_float_dtype<__half, __nv_bfloat16>(a.dtype, [&](auto t) {
    return dense_typed<decltype(t)>(a, layout, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace baracuda
