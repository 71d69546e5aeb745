// The sum of one value per lane over a full warp, returned to every lane,
// in a fixed order of additions (a butterfly), so the same inputs give the
// same bits. No torch headers.
#pragma once

namespace baracuda {

template <typename C>
__device__ inline C warp_sum(C x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

}  // namespace baracuda
