// CUDA executors of the write_slice launch contracts (write_slice_kernels.h).
#include <cuda_runtime.h>

#include "common/cuda_launch.cuh"
#include "common/offset_calculator.cuh"
#include "common/unit_types.h"
#include "write_slice/nibble_patch.h"
#include "write_slice/write_slice_kernels.h"

namespace baracuda {
namespace {

// The copy's two tensors as an offset calculator: 0 = destination, 1 = source.
template <typename Index>
OffsetCalculator<2, Index> make_calculator(const StridedPair& p) {
  int64_t strides[2][kMaxRank];
  for (int d = 0; d < p.rank; ++d) {
    strides[0][d] = p.dst_strides[d];
    strides[1][d] = p.src_strides[d];
  }
  return make_offset_calculator<2, Index>(p.rank, p.sizes, strides);
}

// Each thread moves kItems units per step; all loads are issued before any
// store so that several independent memory requests are in flight.
constexpr int kItems = 4;
constexpr int kThreads = 256;

template <typename U, typename Index>
__global__ void __launch_bounds__(kThreads)
strided_copy_kernel(U* __restrict__ dst, const U* __restrict__ src,
                    OffsetCalculator<2, Index> calc, Index row_numel, RowSpec rows) {
  for (int64_t r = blockIdx.y; r < rows.count; r += gridDim.y) {
    int64_t offset;
    if (!resolve_row_offset(rows, r, &offset)) continue;  // uniform per block
    U* dst_row = dst + r * rows.dst_stride + offset * rows.offset_dst_stride;
    const U* src_row = src + r * rows.src_stride;
    const Index step = static_cast<Index>(gridDim.x) * blockDim.x * kItems;
    for (Index base = static_cast<Index>(blockIdx.x) * blockDim.x * kItems; base < row_numel;
         base += step) {
      U vals[kItems];
      int64_t dst_off[kItems];
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const Index i = base + k * blockDim.x + threadIdx.x;
        if (i < row_numel) {
          int64_t off[2];
          calc.get(i, off);
          dst_off[k] = off[0];
          vals[k] = src_row[off[1]];
        }
      }
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const Index i = base + k * blockDim.x + threadIdx.x;
        if (i < row_numel) dst_row[dst_off[k]] = vals[k];
      }
      if (step > row_numel - base) break;  // avoids Index overflow on the last step
    }
  }
}

template <typename U, typename Index>
KernelStatus launch_strided_copy(const StridedCopyArgs& a, cudaStream_t stream) {
  const int64_t row_numel = a.pair.numel();
  const int64_t per_block = int64_t{kThreads} * kItems;
  // Enough blocks to fill the GPU many times over; larger rows loop.
  const int64_t blocks_x = ceil_div(row_numel, per_block) < 65536 * 8
                               ? ceil_div(row_numel, per_block)
                               : 65536 * 8;
  const int64_t blocks_y = a.rows.count < 65535 ? a.rows.count : 65535;
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(blocks_y));
  strided_copy_kernel<U, Index><<<grid, kThreads, 0, stream>>>(
      static_cast<U*>(a.dst), static_cast<const U*>(a.src), make_calculator<Index>(a.pair),
      static_cast<Index>(row_numel), a.rows);
  return launch_status();
}

// One thread per (row, outer element, destination byte slot). A row touches
// at most nibble_count / 2 + 1 bytes; slots past its last byte do nothing.
__global__ void nibble_copy_kernel(NibbleCopyArgs a, OffsetCalculator<2, int64_t> outer,
                                   int64_t outer_numel, int64_t slots) {
  const int64_t per_row = outer_numel * slots;
  const int64_t total = per_row * a.rows.count;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < total;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = t / per_row;
    const int64_t o = (t - r * per_row) / slots;
    const int64_t slot = t - r * per_row - o * slots;
    int64_t offset;
    if (!resolve_row_offset(a.rows, r, &offset)) continue;
    int64_t start = a.dst_nibble_start;
    uint8_t* dst = a.dst + r * a.rows.dst_stride;
    if (a.offset_in_nibbles) {
      start += offset;
    } else {
      dst += offset * a.rows.offset_dst_stride;
    }
    const int64_t b = first_nibble_byte(start) + slot;
    if (b > last_nibble_byte(start, a.nibble_count)) continue;
    int64_t off[2] = {0, 0};
    if (outer.rank > 0) outer.get(o, off);
    uint8_t* byte = dst + off[0] + b * a.dst_inner_stride;
    *byte = patch_nibble_byte(*byte, b, start, a.nibble_count,
                              a.src + r * a.rows.src_stride + off[1], a.src_inner_stride);
  }
}

}  // namespace

KernelStatus copy_bytes_cuda(void* dst, const void* src, int64_t bytes, void* stream) {
  if (bytes == 0) return KernelStatus::ok();
  return to_status(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                                   cudaMemcpyDeviceToDevice,
                                   static_cast<cudaStream_t>(stream)));
}

KernelStatus strided_copy_cuda(const StridedCopyArgs& a, void* stream) {
  if (a.pair.rank < 1 || a.pair.rank > kMaxRank) {
    return KernelStatus::invalid("strided copy rank must be in [1, 8]");
  }
  const int64_t row_numel = a.pair.numel();
  if (row_numel == 0 || a.rows.count == 0) return KernelStatus::ok();
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch_unit_width(a.unit_bytes, [&](auto width) {
    using U = unit_t<decltype(width)::value>;
    // 31-bit indices allow the multiply-shift divider (see int_divider.h).
    return row_numel < (int64_t{1} << 31) ? launch_strided_copy<U, uint32_t>(a, s)
                                          : launch_strided_copy<U, int64_t>(a, s);
  });
}

KernelStatus nibble_copy_cuda(const NibbleCopyArgs& a, void* stream) {
  if (a.outer.rank < 0 || a.outer.rank > kMaxRank - 1) {
    return KernelStatus::invalid("packed int4 copy needs at most 7 outer axes");
  }
  const int64_t outer_numel = a.outer.numel();
  if (a.nibble_count == 0 || outer_numel == 0 || a.rows.count == 0) {
    return KernelStatus::ok();
  }
  const int64_t slots = a.nibble_count / 2 + 1;
  const int64_t total = outer_numel * slots * a.rows.count;
  const int threads = 256;
  const int64_t blocks = ceil_div(total, threads) < 65536 * 8 ? ceil_div(total, threads)
                                                               : 65536 * 8;
  nibble_copy_kernel<<<static_cast<unsigned>(blocks), threads, 0,
                       static_cast<cudaStream_t>(stream)>>>(
      a, make_calculator<int64_t>(a.outer), outer_numel, slots);
  return launch_status();
}

}  // namespace baracuda
