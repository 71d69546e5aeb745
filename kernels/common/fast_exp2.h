// 2^x as the bare special-function instruction, for device code: relative
// error about 2^-22, and results below 2^-126 flush to 0. exp2f adds a test
// and two multiplies per call to produce those subnormal results; callers use
// this where such a value vanishes next to what it is summed with (softmax
// weights next to the row's largest, log-add-exp terms next to 1). Host
// compilers see nothing here.
#pragma once

#if defined(__CUDACC__)
namespace baracuda {

__device__ inline float exp2_flush(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace baracuda
#endif
