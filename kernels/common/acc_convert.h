// Storage <-> accumulation conversions usable from host and device code.
// Functions, not casts: torch builds CUDA code with __CUDA_NO_HALF_CONVERSIONS__
// and __CUDA_NO_BFLOAT16_CONVERSIONS__, which remove the implicit conversions
// of the device half types. Host types (float, double, or c10's half types in
// host kernels) convert with static_cast. No torch headers.
#pragma once

#include "common/unit_types.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace baracuda {

template <typename Acc, typename T> BARACUDA_HOST_DEVICE Acc to_acc(T v) {
  return static_cast<Acc>(v);
}
template <typename T, typename Acc> BARACUDA_HOST_DEVICE T from_acc(Acc v) {
  return static_cast<T>(v);
}
#if defined(__CUDACC__)
template <> __device__ inline float to_acc<float, __half>(__half v) { return __half2float(v); }
template <> __device__ inline float to_acc<float, __nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <> __device__ inline __half from_acc<__half, float>(float v) { return __float2half_rn(v); }
template <> __device__ inline __nv_bfloat16 from_acc<__nv_bfloat16, float>(float v) {
  return __float2bfloat16_rn(v);
}
#endif

}  // namespace baracuda
