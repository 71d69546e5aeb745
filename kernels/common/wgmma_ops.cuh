// The warpgroup MMA forms the kernels use (sm_90a): m64nNk16 with 16-bit
// inputs and float32 accumulators, N in {64, 128} (and 256 with A from
// registers). Accumulators are laid out as PTX's wgmma D fragment, per
// warp w of the warpgroup and lane l:
//   d[4 j + 0..1]: row 16 w + l / 4,     columns 8 j + 2 (l % 4) + 0..1
//   d[4 j + 2..3]: row 16 w + l / 4 + 8, the same columns
// `accumulate` false overwrites d (D = A B), true adds to it (D += A B).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace baracuda {

// A and B from shared memory, both K-major (descriptors).
template <typename T, int N>
__device__ inline void wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b, bool accumulate);

// A and B from shared memory, both MN-major (descriptors; trans-a = trans-b
// = 1): A's M axis and B's N axis contiguous, as a tile stored K-row by
// K-row.
template <typename T, int N>
__device__ inline void wgmma_ss_mn(float (&d)[N / 2], uint64_t a, uint64_t b, bool accumulate);

// A from registers (per warp, the m16k16 A fragment of mma.sync), B from
// shared memory MN-major, its N axis contiguous (trans-b = 1).
template <typename T, int N>
__device__ inline void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b,
                                bool accumulate);

// Every accumulator register is its own asm operand, hence the lists (per N).
#define BARACUDA_WGMMA_D_N64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" \
  ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define BARACUDA_WGMMA_D_N128 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" \
  ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" \
  ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define BARACUDA_WGMMA_OUT_N64 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
  "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
  "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
  "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), \
  "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define BARACUDA_WGMMA_OUT_N128 \
  BARACUDA_WGMMA_OUT_N64, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
  "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
  "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
  "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), \
  "+f"(d[62]), "+f"(d[63])

#define BARACUDA_WGMMA_D_N256 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" \
  ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" \
  ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79" \
  ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95" \
  ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111" \
  ", %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define BARACUDA_WGMMA_OUT_N256 \
  BARACUDA_WGMMA_OUT_N128, \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), \
  "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), \
  "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), \
  "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), \
  "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), \
  "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), \
  "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), \
  "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), \
  "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// A is operand N/2 (descriptor) or N/2..N/2+3 (registers); the predicate
// operand comes last.
// FN: wgmma_ss (both K-major, trans 0 0) or wgmma_ss_mn (both MN-major, 1 1).
#define BARACUDA_WGMMA_SS_FORM(FN, TRANS, T, PTX, N, A, B, P)                              \
  template <>                                                                            \
  __device__ inline void FN<T, N>(float(&d)[N / 2], uint64_t a, uint64_t b,               \
                                  bool accumulate) {                                       \
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" #P ", 0;\n"                     \
                 " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " "      \
                 BARACUDA_WGMMA_D_N##N ", %" #A ", %" #B ", p, 1, 1, " TRANS ";\n}\n"     \
                 : BARACUDA_WGMMA_OUT_N##N                                                 \
                 : "l"(a), "l"(b), "r"(static_cast<uint32_t>(accumulate)));              \
  }
#define BARACUDA_WGMMA_SS(T, PTX, N, A, B, P) \
  BARACUDA_WGMMA_SS_FORM(wgmma_ss, "0, 0", T, PTX, N, A, B, P)
#define BARACUDA_WGMMA_SS_MN(T, PTX, N, A, B, P) \
  BARACUDA_WGMMA_SS_FORM(wgmma_ss_mn, "1, 1", T, PTX, N, A, B, P)
#define BARACUDA_WGMMA_RS(T, PTX, N, A0, A1, A2, A3, B, P)                                 \
  template <>                                                                            \
  __device__ inline void wgmma_rs<T, N>(float(&d)[N / 2], const uint32_t(&a)[4],          \
                                        uint64_t b, bool accumulate) {                     \
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" #P ", 0;\n"                     \
                 " wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX "." PTX " "      \
                 BARACUDA_WGMMA_D_N##N ", {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #B   \
                 ", p, 1, 1, 1;\n}\n"                                                    \
                 : BARACUDA_WGMMA_OUT_N##N                                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b),                   \
                   "r"(static_cast<uint32_t>(accumulate)));                              \
  }

BARACUDA_WGMMA_SS(__half, "f16", 64, 32, 33, 34)
BARACUDA_WGMMA_SS(__nv_bfloat16, "bf16", 64, 32, 33, 34)
BARACUDA_WGMMA_SS(__half, "f16", 128, 64, 65, 66)
BARACUDA_WGMMA_SS(__nv_bfloat16, "bf16", 128, 64, 65, 66)
// dQ += dS K of the fused backward: dS^T and K both stored key-row by key-row.
BARACUDA_WGMMA_SS_MN(__half, "f16", 64, 32, 33, 34)
BARACUDA_WGMMA_SS_MN(__nv_bfloat16, "bf16", 64, 32, 33, 34)
BARACUDA_WGMMA_RS(__half, "f16", 64, 32, 33, 34, 35, 36, 37)
BARACUDA_WGMMA_RS(__nv_bfloat16, "bf16", 64, 32, 33, 34, 35, 36, 37)
BARACUDA_WGMMA_RS(__half, "f16", 128, 64, 65, 66, 67, 68, 69)
BARACUDA_WGMMA_RS(__nv_bfloat16, "bf16", 128, 64, 65, 66, 67, 68, 69)
// N = 256: P V of a 256-wide head (the forward's O accumulator).
BARACUDA_WGMMA_RS(__half, "f16", 256, 128, 129, 130, 131, 132, 133)
BARACUDA_WGMMA_RS(__nv_bfloat16, "bf16", 256, 128, 129, 130, 131, 132, 133)

#undef BARACUDA_WGMMA_RS
#undef BARACUDA_WGMMA_SS_MN
#undef BARACUDA_WGMMA_SS_FORM
#undef BARACUDA_WGMMA_SS
#undef BARACUDA_WGMMA_OUT_N256
#undef BARACUDA_WGMMA_OUT_N128
#undef BARACUDA_WGMMA_OUT_N64
#undef BARACUDA_WGMMA_D_N256
#undef BARACUDA_WGMMA_D_N128
#undef BARACUDA_WGMMA_D_N64

}  // namespace baracuda
