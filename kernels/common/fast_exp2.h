// 2^x for device code. exp2_flush is the bare special-function
// instruction: relative error about 2^-22, and results below 2^-126 flush
// to 0. exp2f adds a test and two multiplies per call to produce those
// subnormal results; callers use this where such a value vanishes next to
// what it is summed with (softmax weights next to the row's largest,
// log-add-exp terms next to 1). exp2_by_fma computes it on the FMA pipe.
// Host compilers see nothing here.
#pragma once

#if defined(__CUDACC__)
namespace baracuda {

__device__ inline float exp2_flush(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 2^x on the FMA pipe, for callers that keep the special-function unit
// busy: x rounded to the nearest integer n by adding 1.5 * 2^23, 2^(x - n)
// by a degree-5 polynomial, n added to the result's exponent. Within
// 2.1e-7 relative of 2^x for -126 <= x <= 127 (a host sweep in steps of
// 1e-4); below -126, x = -inf included, it gives 2^-126 where exp2_flush
// gives 0. x must not be NaN or above 127.
__device__ inline float exp2_by_fma(float x) {
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23
  x = fmaxf(x, -126.f);
  const float t = x + kRound;
  const float f = x - (t - kRound);
  float p = 0x1.5c08e4p-10f;
  p = fmaf(p, f, 0x1.3d0c54p-7f);
  p = fmaf(p, f, 0x1.c6b6e4p-5f);
  p = fmaf(p, f, 0x1.ebf918p-3f);
  p = fmaf(p, f, 0x1.62e428p-1f);
  p = fmaf(p, f, 0x1.000002p+0f);
  return __uint_as_float(__float_as_uint(p) + (__float_as_uint(t) << 23));
}

}  // namespace baracuda
#endif
