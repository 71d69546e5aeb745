// Arithmetic types of floating-point kernels: half types compute in float32,
// float32 and float64 in themselves; to_compute / from_compute convert a
// stored element (round to nearest on the way back). No torch headers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace baracuda {

template <typename T> struct ComputeOf { using type = float; };
template <> struct ComputeOf<double> { using type = double; };
template <typename T> using compute_t = typename ComputeOf<T>::type;

__device__ inline float to_compute(__half x) { return __half2float(x); }
__device__ inline float to_compute(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float to_compute(float x) { return x; }
__device__ inline double to_compute(double x) { return x; }
template <typename T> __device__ inline T from_compute(compute_t<T> x);
template <> __device__ inline __half from_compute<__half>(float x) { return __float2half_rn(x); }
template <> __device__ inline __nv_bfloat16 from_compute<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ inline float from_compute<float>(float x) { return x; }
template <> __device__ inline double from_compute<double>(double x) { return x; }

// VEC consecutive elements, moved as one access when VEC > 1 (the address
// must then be aligned to the pack's size).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T x[VEC];
};

}  // namespace baracuda
