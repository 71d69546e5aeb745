// A design probe for the long_rows path (not the library's kernel): cumsum of
// one [1, 16M] row, float32 and bfloat16, by persistent blocks that stage
// tiles in shared memory with the bulk copy engine (three stages), walk
// tiles striped by block index (tile b, b + grid, ...), and fold each tile
// one tile ahead of its scan, publishing its total before waiting for its
// own prefix; the prefix is the in-order fold of group and tile totals, as
// in scan_publish.cuh, so results are bit-reproducible (checked). Beside
// each configuration: a copy of the same bytes (cudaMemcpyAsync and two
// copy kernels) and the memset of the published slots alone. It measures how
// close such a kernel comes to a copy before the scan engine's general ops
// are fitted into it (benchmarks/RESULTS.md).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a \
//        -o build/staged_scan_probe benchmarks/staged_scan_probe.cu && build/staged_scan_probe
//
// Columns: V = 16-byte vectors per thread and tile (a tile is 256 V vectors),
// S = stages; times are medians of 30 calls queued back to back on cold
// inputs (sets rotated past 200 MB); "2 memsets" zeroes the counter and the
// slots apart (as the probe's first form did), "1 memset" stands for the one
// memset a launch needs, "kernel" re-uses slots by epoch and needs none.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>
#include <algorithm>
#include <random>
#include <memory>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s: %s line %d\n", #x, cudaGetErrorString(e), __LINE__); exit(1);} } while (0)

constexpr int kThreads = 256;
constexpr int kGroup = 32;

__host__ __device__ inline float to_f(float v) { return v; }
__host__ __device__ inline float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__host__ __device__ inline void from_f(float v, float& o) { o = v; }
__host__ __device__ inline void from_f(float v, __nv_bfloat16& o) { o = __float2bfloat16(v); }

__device__ inline void publish(uint4* slot, float v, unsigned epoch) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(slot), "r"(epoch), "r"(0u),
               "r"(__float_as_uint(v)), "r"(0u) : "memory");
}
__device__ inline bool try_read(const uint4* slot, float& v, unsigned epoch) {
  unsigned w[4];  // flag, pad, value, pad
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
               : "l"(slot)
               : "memory");
  v = __uint_as_float(w[2]);
  return w[0] == epoch;
}
__device__ inline float read_spin(const uint4* slot, unsigned epoch) {
  float v;
  while (!try_read(slot, v, epoch)) {}
  return v;
}

__device__ inline float warp_sum(float v) {  // fixed tree: deterministic
#pragma unroll
  for (int d = 16; d >= 1; d /= 2) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

__device__ inline void mbar_init(uint64_t* bar, unsigned count) {
  unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count));
}
__device__ inline void mbar_expect_tx(uint64_t* bar, unsigned bytes) {
  unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes) : "memory");
}
__device__ inline void mbar_wait(uint64_t* bar, unsigned parity) {
  unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}" ::"r"(a), "r"(parity) : "memory");
}
__device__ inline void bulk_load(void* smem_dst, const void* gsrc, unsigned bytes, uint64_t* bar) {
  unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(d), "l"(gsrc), "r"(bytes), "r"(b) : "memory");
}


template <typename T, int V>
struct TileFold {
  float before[V];
  float chunk_tot[V];
};

// Block scan of the per-thread run sums of one staged tile: each thread's
// exclusive prefix within each chunk and the chunk totals.
template <typename T, int V>
__device__ void fold_tile(const unsigned char* stage, TileFold<T, V>& f, float& tile_total,
                          float (*warp_tot)[V]) {
  constexpr int E = 16 / sizeof(T);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const uint4* st = reinterpret_cast<const uint4*>(stage);
  float run[V], incl[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const uint4 v = st[j * kThreads + tid];
    T raw[E];
    memcpy(raw, &v, 16);
    float a = 0.f;
#pragma unroll
    for (int k = 0; k < E; ++k) a += to_f(raw[k]);
    run[j] = a;
    float w = a;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const float up = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += up;
    }
    incl[j] = w;
    if (lane == 31) warp_tot[warp][j] = w;
  }
  __syncthreads();
  tile_total = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float p = 0.f, tot = 0.f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) {
      const float wt = warp_tot[w][j];
      if (w < warp) p += wt;
      tot += wt;
    }
    f.before[j] = p + (incl[j] - run[j]);
    f.chunk_tot[j] = tot;
    tile_total += tot;
  }
  __syncthreads();  // warp_tot free again
}

// Publishes a tile's total, and for the last tile of a group the group's.
__device__ inline void publish_tile(float tile_total, int64_t t, int64_t groups, uint4* tile_slots,
                                    uint4* group_slots, unsigned epoch) {
  const int tid = threadIdx.x;
  if (tid >= 32) return;
  const int64_t group = t / kGroup, gfirst = group * kGroup;
  if (tid == 0) publish(tile_slots + t, tile_total, epoch);
  if (t - gfirst == kGroup - 1 && group + 1 < groups) {
    float pv = 0.f;
    if (tid < kGroup - 1) pv = read_spin(tile_slots + gfirst + tid, epoch);
    pv = warp_sum(pv);
    if (tid == 0) publish(group_slots + group, pv + tile_total, epoch);
  }
}

__device__ inline float read_prefix(int64_t t, uint4* tile_slots, uint4* group_slots,
                                    unsigned epoch, float* warp_pref) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t group = t / kGroup, gfirst = group * kGroup;
  float pv = 0.f;
  if (warp == 0) {
    if (lane < t - gfirst) pv = read_spin(tile_slots + gfirst + lane, epoch);
  } else {
    for (int64_t g = tid - 32; g < group; g += kThreads - 32) pv += read_spin(group_slots + g, epoch);
  }
  pv = warp_sum(pv);
  if (lane == 0) warp_pref[warp] = pv;
  __syncthreads();
  float prefix = 0.f;
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) prefix += warp_pref[w];
  prefix += warp_pref[0];
  return prefix;
}

template <typename T, int V, int S>
__global__ void __launch_bounds__(kThreads) staged_scan(const T* x, T* y, int64_t tiles,
    unsigned long long* counter, uint4* tile_slots, uint4* group_slots, unsigned epoch) {
  static_assert(S >= 3, "a stage scanned, a stage folded ahead, one in flight");
  constexpr int E = 16 / sizeof(T);
  constexpr int kTileBytes = kThreads * 16 * V;
  constexpr int64_t kTileElems = int64_t(kThreads) * E * V;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t full[S];
  __shared__ float warp_tot[kThreads / 32][V];
  __shared__ float warp_pref[2][kThreads / 32];
  const int tid = threadIdx.x;
  const int64_t groups = (tiles + kGroup - 1) / kGroup;
  const int64_t G = gridDim.x;
  const int64_t first = blockIdx.x;
  if (first >= tiles) return;
  if (tid == 0) {
    for (int s = 0; s < S; ++s) mbar_init(&full[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int s = 0; s < S; ++s) {
      const int64_t t = first + s * G;
      if (t < tiles) {
        mbar_expect_tx(&full[s], kTileBytes);
        bulk_load(smem + s * kTileBytes, x + t * kTileElems, kTileBytes, &full[s]);
      }
    }
  }
  __syncthreads();
  TileFold<T, V> cur, next;
  float total;
  mbar_wait(&full[0], 0);
  fold_tile<T, V>(smem, cur, total, warp_tot);
  publish_tile(total, first, groups, tile_slots, group_slots, epoch);
  for (int i = 0;; ++i) {
    const int64_t t = first + int64_t(i) * G;
    if (t >= tiles) break;
    const int s = i % S;
    // Fold the next tile ahead, so that its total is out before this
    // tile's prefix is waited for.
    const int64_t tn = t + G;
    if (tn < tiles) {
      const int sn = (i + 1) % S;
      mbar_wait(&full[sn], ((i + 1) / S) & 1);
      fold_tile<T, V>(smem + sn * kTileBytes, next, total, warp_tot);
      publish_tile(total, tn, groups, tile_slots, group_slots, epoch);
    }
    float carry = read_prefix(t, tile_slots, group_slots, epoch, warp_pref[i & 1]);
    const uint4* st = reinterpret_cast<const uint4*>(smem + s * kTileBytes);
    T* out = y + t * kTileElems;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const uint4 v = st[j * kThreads + tid];
      T raw[E];
      memcpy(raw, &v, 16);
      float r = carry + cur.before[j];
#pragma unroll
      for (int k = 0; k < E; ++k) { r += to_f(raw[k]); from_f(r, raw[k]); }
      uint4 u;
      memcpy(&u, raw, 16);
      reinterpret_cast<uint4*>(out)[j * kThreads + tid] = u;
      carry += cur.chunk_tot[j];
    }
    __syncthreads();  // stage s read by all
    if (tid == 0) {
      const int64_t nt = t + S * G;
      if (nt < tiles) {
        mbar_expect_tx(&full[s], kTileBytes);
        bulk_load(smem + s * kTileBytes, x + nt * kTileElems, kTileBytes, &full[s]);
      }
    }
    cur = next;
  }
}

__global__ void copy_kernel(const uint4* a, uint4* b, int64_t n) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 v0 = a[i], v1 = a[i + stride], v2 = a[i + 2 * stride], v3 = a[i + 3 * stride];
    b[i] = v0; b[i + stride] = v1; b[i + 2 * stride] = v2; b[i + 3 * stride] = v3;
  }
  for (; i < n; i += stride) b[i] = a[i];
}
__global__ void copy_kernel_flat(const uint4* a, uint4* b, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) b[i] = a[i];
}

template <typename F>
float median_us(F&& f, int reps = 30, int warm = 5) {
  for (int r = 0; r < warm; ++r) f(r);
  std::vector<cudaEvent_t> a(reps), b(reps);
  for (int r = 0; r < reps; ++r) { CK(cudaEventCreate(&a[r])); CK(cudaEventCreate(&b[r])); }
  for (int r = 0; r < reps; ++r) { CK(cudaEventRecord(a[r])); f(r); CK(cudaEventRecord(b[r])); }
  CK(cudaDeviceSynchronize());
  std::vector<float> us(reps);
  for (int r = 0; r < reps; ++r) { float ms; CK(cudaEventElapsedTime(&ms, a[r], b[r])); us[r] = ms * 1e3f; }
  std::sort(us.begin(), us.end());
  return us[reps / 2];
}

struct Buf { void* p = nullptr; explicit Buf(size_t n) { CK(cudaMalloc(&p, n)); } ~Buf() { cudaFree(p); } };

template <typename T, int V, int S>
void run_case(int64_t n, const char* name, int sms) {
  constexpr int E = 16 / sizeof(T);
  constexpr int64_t kTileElems = int64_t(kThreads) * E * V;
  constexpr int kTileBytes = kThreads * 16 * V;
  const int64_t tiles = n / kTileElems;  // n a multiple of the tile here
  const int64_t groups = (tiles + kGroup - 1) / kGroup;
  const size_t bytes = n * sizeof(T);
  const int sets = std::max(2, (int)std::ceil(200e6 / (2.0 * bytes)));
  std::vector<std::unique_ptr<Buf>> xs, ys;
  std::mt19937 gen(1);
  std::normal_distribution<float> nd;
  std::vector<T> ht(n);
  for (int64_t i = 0; i < n; ++i) from_f(nd(gen), ht[i]);
  for (int k = 0; k < sets; ++k) {
    xs.push_back(std::make_unique<Buf>(bytes));
    ys.push_back(std::make_unique<Buf>(bytes));
    CK(cudaMemcpy(xs.back()->p, ht.data(), bytes, cudaMemcpyHostToDevice));
  }
  // [0, 16): counter of the memset variant; [16, 16 * 4096): per-launch counters
  // of the epoch variant; then the tile and group slots.
  const size_t head = 16 * 4096;
  const size_t slot_bytes = (tiles + groups) * 16;
  const size_t ws_bytes = head + slot_bytes;
  Buf ws(ws_bytes);
  CK(cudaMemset(ws.p, 0, ws_bytes));
  auto kern = staged_scan<T, V, S>;
  const int smem = S * kTileBytes;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int bps = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, kern, kThreads, smem));
  const int grid = (int)std::min<int64_t>(tiles, (int64_t)sms * bps);
  unsigned epoch = 1;
  char* base = static_cast<char*>(ws.p);
  uint4* tslots = reinterpret_cast<uint4*>(base + head);
  auto launch = [&](int r, bool memset) {
    unsigned long long* counter;
    unsigned ep;
    if (memset) {
      // what a real launch zeroes: the counter and the slots
      CK(cudaMemsetAsync(base, 0, 16));
      CK(cudaMemsetAsync(tslots, 0, slot_bytes));
      counter = reinterpret_cast<unsigned long long*>(base);
      ep = 1;
    } else {
      ++epoch;
      counter = reinterpret_cast<unsigned long long*>(base) + 2 * (epoch % 4000 + 1);
      CK(cudaMemsetAsync(counter, 0, 8));  // cheap stand-in: still one memset node
      ep = epoch;
    }
    kern<<<grid, kThreads, smem>>>(static_cast<const T*>(xs[r % sets]->p), static_cast<T*>(ys[r % sets]->p),
                                   tiles, counter, tslots, tslots + tiles, ep);
    CK(cudaGetLastError());
  };
  auto launch_nomemset = [&](int r) {
    ++epoch;
    unsigned long long* counter = reinterpret_cast<unsigned long long*>(base) + 2 * (epoch % 4000 + 1);
    kern<<<grid, kThreads, smem>>>(static_cast<const T*>(xs[r % sets]->p), static_cast<T*>(ys[r % sets]->p),
                                   tiles, counter, tslots, tslots + tiles, epoch);
    CK(cudaGetLastError());
  };
  CK(cudaMemset(ys[0]->p, 0xff, bytes));
  launch(0, true);
  CK(cudaDeviceSynchronize());
  std::vector<T> hy(n);
  CK(cudaMemcpy(hy.data(), ys[0]->p, bytes, cudaMemcpyDeviceToHost));
  double acc = 0, worst = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    acc += double(to_f(ht[i]));
    const double d = std::fabs(double(to_f(hy[i])) - acc);
    if (!(d <= 1e30)) { worst = INFINITY; break; }
    worst = std::max(worst, d);
    scale = std::max(scale, std::fabs(acc));
  }
  std::vector<T> hy2(n);
  launch(1, true);
  launch(0, true);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(hy2.data(), ys[0]->p, bytes, cudaMemcpyDeviceToHost));
  const bool same = memcmp(hy.data(), hy2.data(), bytes) == 0;
  CK(cudaMemset(ys[0]->p, 0xff, bytes));
  CK(cudaMemset(base + 16, 0, head - 16));
  launch_nomemset(0);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(hy2.data(), ys[0]->p, bytes, cudaMemcpyDeviceToHost));
  const bool same_epoch = memcmp(hy.data(), hy2.data(), bytes) == 0;
  const float with_memset = median_us([&](int r) { launch(r, true); });
  CK(cudaMemset(base + 16, 0, head - 16));
  const float one_memset = median_us([&](int r) { launch(r, false); });
  CK(cudaMemset(base + 16, 0, head - 16));
  const float no_memset = median_us([&](int r) { launch_nomemset(r); });
  printf("| %s V=%d S=%d | %d (%d/SM) | %.1f | %.1f | %.1f | %.2e | %d | %d |\n", name, V, S, grid, bps,
         with_memset, one_memset, no_memset, worst / scale, (int)same, (int)same_epoch);
  static bool printed_copy[2] = {false, false};
  if (!printed_copy[sizeof(T) == 2]) {
    printed_copy[sizeof(T) == 2] = true;
    const float memcpy_us = median_us([&](int r) {
      CK(cudaMemcpyAsync(ys[r % sets]->p, xs[r % sets]->p, bytes, cudaMemcpyDeviceToDevice)); });
    const int64_t nv = bytes / 16;
    const float kcopy_us = median_us([&](int r) {
      copy_kernel<<<sms * 8, 256>>>(static_cast<const uint4*>(xs[r % sets]->p),
                                    static_cast<uint4*>(ys[r % sets]->p), nv); });
    const float kflat_us = median_us([&](int r) {
      copy_kernel_flat<<<(nv + 255) / 256, 256>>>(static_cast<const uint4*>(xs[r % sets]->p),
                                                  static_cast<uint4*>(ys[r % sets]->p), nv); });
    const float ms_us = median_us([&](int) { CK(cudaMemsetAsync(tslots, 0, slot_bytes)); });
    printf("| copy %s same bytes | memcpy %.1f | grid-stride kernel %.1f | flat kernel %.1f | memset of slots %.1f |\n",
           name, memcpy_us, kcopy_us, kflat_us, ms_us);
  }
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t n = int64_t(1) << 24;
  {
    const size_t big = size_t(1) << 30;
    Buf a(big), b(big);
    const float us = median_us([&](int) { CK(cudaMemcpyAsync(b.p, a.p, big, cudaMemcpyDeviceToDevice)); }, 20, 3);
    printf("copy roofline %.1f GB/s\n", 2.0 * big / us / 1e3);
  }
  printf("| case | grid | us: 2 memsets + kernel | 1 memset + kernel | kernel | rel err | deterministic | epoch run same |\n|---|---|---|---|---|---|---|---|\n");
  run_case<float, 4, 3>(n, "f32", sms);
  run_case<float, 4, 4>(n, "f32", sms);
  run_case<float, 2, 3>(n, "f32", sms);
  run_case<float, 2, 4>(n, "f32", sms);
  run_case<float, 8, 3>(n, "f32", sms);
  run_case<__nv_bfloat16, 4, 3>(n, "bf16", sms);
  run_case<__nv_bfloat16, 4, 4>(n, "bf16", sms);
  run_case<__nv_bfloat16, 2, 3>(n, "bf16", sms);
  run_case<__nv_bfloat16, 2, 4>(n, "bf16", sms);
  run_case<__nv_bfloat16, 8, 3>(n, "bf16", sms);
  return 0;
}
