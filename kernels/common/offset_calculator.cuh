// Linear index -> element offsets in NT strided tensors that share one shape.
// Axes are stored innermost first so the loop peels them in the order a
// divide produces them; the outermost axis needs no divide. With 31-bit
// indices the divides are multiply-shifts (int_divider.h). No torch headers.
#pragma once

#include <cstdint>

#include "common/cuda_launch.cuh"
#include "common/strided_layout.h"

namespace baracuda {

template <int NT, typename Index>
struct OffsetCalculator {
  int rank;
  typename DividerFor<Index>::type sizes[kMaxRank];
  int64_t strides[NT][kMaxRank];

  __device__ void get(Index i, int64_t (&out)[NT]) const {
#pragma unroll
    for (int t = 0; t < NT; ++t) out[t] = 0;
#pragma unroll
    for (int k = 0; k < kMaxRank; ++k) {
      if (k >= rank) break;
      Index r = i;
      if (k < rank - 1) {
        const Index q = sizes[k].div(i);
        r = i - q * static_cast<Index>(sizes[k].divisor);
        i = q;
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) out[t] += static_cast<int64_t>(r) * strides[t][k];
      if (k == rank - 1) break;
    }
  }
};

// Host-side builder: sizes[rank] outermost first, strides[t][rank] likewise.
template <int NT, typename Index>
OffsetCalculator<NT, Index> make_offset_calculator(int rank, const int64_t* sizes,
                                                   const int64_t (*strides)[kMaxRank]) {
  OffsetCalculator<NT, Index> c{};
  c.rank = rank;
  for (int k = 0; k < rank; ++k) {
    const int axis = rank - 1 - k;
    c.sizes[k] = make_divider<Index>(sizes[axis]);
    for (int t = 0; t < NT; ++t) c.strides[t][k] = strides[t][axis];
  }
  return c;
}

}  // namespace baracuda
