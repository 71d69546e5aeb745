// The scan benchmark's cases (bench_scan.py, and the few-column shapes of
// bench_scan_shapes.py and short rows) timed at the launcher level: the
// CUDA launchers of kernels/scan called from C++, no torch. It builds in a
// minute (scan_launch_timer.sh), so a kernel variant can be measured without
// building the extension, and it times the device alone: launches queue up
// ahead of the GPU, CUDA events around each one (the workspace memset
// included), median of 30, inputs rotated through more than 200 MB so that
// L2 does not serve repeats. Each case is also checked once, its output
// poisoned first, against the host engine in float64 on the same inputs:
// the last column is max |ours - ref| / max |ref| (cummax / cummin also
// compare indices exactly; a mismatch prints inf). Beside each case, a
// device-to-device copy of its minimal bytes is timed the same way.
//
//   scan_launch_timer [TEXT]   only the cases whose name contains TEXT;
//                              SCAN_DTYPE=bf16 or f32 keeps one dtype;
//                              SCAN_X=bench draws every op's x near 1, as
//                              the benchmark does (by default only
//                              cumprod's: the others take x normal);
//                              SCAN_X=masked sets every other stretch of
//                              65536 positions of x to -inf, and
//                              SCAN_X=masked_short of 1000 (stretches
//                              that end inside a thread's run);
//                              SCAN_ROWS="R,L;R,L" adds [R, L] shapes;
//                              SCAN_COLS="O,L,I;O,L,I" adds [O, L, I]
//                              shapes scanned along dim 1;
//                              SCAN_REVERSE=1 times the reversed scans
//                              (their backward too), checked against the
//                              reversed reference
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "scan/scan_kernels.h"
#include "scan/scan_plan.h"

using namespace baracuda;

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void check_status(const KernelStatus& st, const char* what) {
  if (!st.is_ok()) {
    std::printf("%s failed: %s\n", what, st.detail);
    std::exit(1);
  }
}

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    check_cuda(cudaMalloc(&ptr, std::max<size_t>(bytes, 16)), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Keeps the GPU busy for `cycles` clocks.
__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// Median microseconds of `launch(r)` over `reps` calls. No sync between
// calls, and the timed calls queue up behind a spin of a few milliseconds
// (longer than the host takes to enqueue them all), so even a case shorter
// than its launches runs back to back: the events time the device, not the
// host's launch latency.
template <typename Launch>
float median_us(Launch&& launch, int reps = 30, int warmup = 5) {
  for (int r = 0; r < warmup; ++r) launch(r);
  std::vector<cudaEvent_t> start(reps), stop(reps);
  for (int r = 0; r < reps; ++r) {
    check_cuda(cudaEventCreate(&start[r]), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop[r]), "cudaEventCreate");
  }
  spin_kernel<<<1, 1>>>(10'000'000);
  for (int r = 0; r < reps; ++r) {
    check_cuda(cudaEventRecord(start[r]), "cudaEventRecord");
    launch(r);
    check_cuda(cudaEventRecord(stop[r]), "cudaEventRecord");
  }
  check_cuda(cudaDeviceSynchronize(), "timed launches");
  std::vector<float> us(reps);
  for (int r = 0; r < reps; ++r) {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start[r], stop[r]), "cudaEventElapsedTime");
    us[r] = ms * 1e3f;
    cudaEventDestroy(start[r]);
    cudaEventDestroy(stop[r]);
  }
  return median(us);
}

// Bytes read + written per second by a 1 GiB device-to-device copy.
double copy_roofline_gbs() {
  const size_t n = size_t(1) << 30;
  DeviceBuffer a(n), b(n);
  const float us = median_us(
      [&](int) { check_cuda(cudaMemcpyAsync(b.ptr, a.ptr, n, cudaMemcpyDeviceToDevice), "copy"); },
      20, 3);
  return 2.0 * n / us / 1e3;
}

// Microseconds of a device-to-device copy of `bytes` (half read, half
// written), cold buffers rotated as for the cases: what moving a case's
// minimal bytes costs at its own size, launch and ramp included. (At 32 MB
// that is well under the 1 GiB rate.)
float same_bytes_copy_us(double bytes) {
  const size_t n = static_cast<size_t>(bytes / 2);
  const int count = std::max(2, std::min(8, int(std::ceil(200e6 / bytes))));
  std::vector<std::unique_ptr<DeviceBuffer>> from, to;
  for (int k = 0; k < count; ++k) {
    from.push_back(std::make_unique<DeviceBuffer>(n));
    to.push_back(std::make_unique<DeviceBuffer>(n));
  }
  return median_us([&](int r) {
    check_cuda(cudaMemcpyAsync(to[r % count]->ptr, from[r % count]->ptr, n,
                               cudaMemcpyDeviceToDevice),
               "copy");
  });
}

const char* const kKindNames[] = {"cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"};

struct Case {
  ScanKind kind;
  bool backward;
  bool bf16;
  const char* shape_label;
  ScanShape shape;

  bool extremes() const { return kind == ScanKind::kCummax || kind == ScanKind::kCummin; }
  int elem_bytes() const { return bf16 ? 2 : 4; }
  FloatDtype dtype() const { return bf16 ? FloatDtype::kBFloat16 : FloatDtype::kFloat32; }
  std::string name() const {
    return std::string(kKindNames[int(kind)]) + (backward ? " bwd " : " fwd ") + shape_label;
  }
  // The benchmark's minimal bytes (bench_scan._bytes).
  double bytes_moved() const {
    const double n = double(shape.numel());
    if (extremes()) return n * (2 * elem_bytes() + 8);
    const bool saves_xy = kind == ScanKind::kCumprod || kind == ScanKind::kLogcumsumexp;
    return (backward && saves_xy ? 4 : 2) * n * elem_bytes();
  }
};

// One cold set of a case's tensors: the forward's input and output (the
// saved tensors of the backward), a gradient, the timed op's output.
struct TensorSet {
  DeviceBuffer x, y, dy, out, indices, workspace;
  explicit TensorSet(const Case& c)
      : x(c.shape.numel() * c.elem_bytes()),
        y(c.shape.numel() * c.elem_bytes()),
        dy(c.shape.numel() * c.elem_bytes()),
        out(c.shape.numel() * c.elem_bytes()),
        indices(c.extremes() ? c.shape.numel() * 8 : 0),
        workspace(scan_workspace_bytes(c.shape)) {}
};

// The fields every launch shares (Args: ScanForwardArgs or ScanBackwardArgs).
// SCAN_REVERSE=1: every launch, ours and the reference's, reversed.
bool reverse_scans() {
  const char* r = std::getenv("SCAN_REVERSE");
  return r != nullptr && std::string(r) == "1";
}

template <typename Args>
Args args_of(const Case& c, FloatDtype dtype) {
  Args a;
  a.kind = c.kind;
  a.dtype = dtype;
  a.shape = c.shape;
  a.reverse = reverse_scans();
  return a;
}

ScanForwardArgs forward_args(const Case& c, const TensorSet& t, void* y) {
  ScanForwardArgs a = args_of<ScanForwardArgs>(c, c.dtype());
  a.x = t.x.ptr;
  a.y = y;
  a.indices = c.extremes() ? static_cast<int64_t*>(t.indices.ptr) : nullptr;
  a.workspace.ptr = t.workspace.ptr;
  return a;
}

ScanBackwardArgs backward_args(const Case& c, const TensorSet& t) {
  ScanBackwardArgs a = args_of<ScanBackwardArgs>(c, c.dtype());
  a.dy = t.dy.ptr;
  a.x = t.x.ptr;
  a.y = t.y.ptr;
  a.indices = static_cast<const int64_t*>(t.indices.ptr);
  a.dx = t.out.ptr;
  a.workspace.ptr = t.workspace.ptr;
  return a;
}

// The timed op: the forward into `out` (y stays the saved one; cummax /
// cummin rewrite the same indices), or the backward.
void launch_case(const Case& c, const TensorSet& t) {
  if (c.backward) {
    check_status(scan_backward_cuda(backward_args(c, t), nullptr), "scan_backward_cuda");
  } else {
    check_status(scan_forward_cuda(forward_args(c, t, t.out.ptr), nullptr), "scan_forward_cuda");
  }
}

void upload(const DeviceBuffer& to, const std::vector<float>& v, bool bf16) {
  if (!bf16) {
    check_cuda(cudaMemcpy(to.ptr, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "upload");
    return;
  }
  std::vector<__nv_bfloat16> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = __float2bfloat16(v[i]);
  check_cuda(cudaMemcpy(to.ptr, h.data(), h.size() * 2, cudaMemcpyHostToDevice), "upload");
}

std::vector<double> download(const DeviceBuffer& from, int64_t n, bool bf16) {
  std::vector<double> out(n);
  if (bf16) {
    std::vector<__nv_bfloat16> h(n);
    check_cuda(cudaMemcpy(h.data(), from.ptr, n * 2, cudaMemcpyDeviceToHost), "download");
    for (int64_t i = 0; i < n; ++i) out[i] = __bfloat162float(h[i]);
  } else {
    std::vector<float> h(n);
    check_cuda(cudaMemcpy(h.data(), from.ptr, n * 4, cudaMemcpyDeviceToHost), "download");
    for (int64_t i = 0; i < n; ++i) out[i] = h[i];
  }
  return out;
}

// max |ours - ref| / max |ref| of the timed op's output on set `t`, against
// the host engine in float64 on the same (rounded) inputs.
double relative_error(const Case& c, const TensorSet& t) {
  const int64_t n = c.shape.numel();
  std::vector<double> x = download(t.x, n, c.bf16), y = download(t.y, n, c.bf16),
                      dy = download(t.dy, n, c.bf16), ours = download(t.out, n, c.bf16);
  std::vector<int64_t> indices(c.extremes() ? n : 0), ref_indices(indices.size());
  if (c.extremes()) {
    check_cuda(cudaMemcpy(indices.data(), t.indices.ptr, n * 8, cudaMemcpyDeviceToHost), "indices");
  }
  std::vector<double> ref(n);
  if (c.backward) {
    ScanBackwardArgs a = args_of<ScanBackwardArgs>(c, FloatDtype::kFloat64);
    a.dy = dy.data();
    a.x = x.data();
    a.y = y.data();
    a.indices = indices.data();
    a.dx = ref.data();
    check_status(scan_backward_cpu(a), "scan_backward_cpu");
  } else {
    ScanForwardArgs a = args_of<ScanForwardArgs>(c, FloatDtype::kFloat64);
    a.x = x.data();
    a.y = ref.data();
    a.indices = c.extremes() ? ref_indices.data() : nullptr;
    check_status(scan_forward_cpu(a), "scan_forward_cpu");
    if (ref_indices != indices) return INFINITY;
  }
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (ours[i] == ref[i] && !std::isfinite(ref[i])) continue;  // the same infinity
    const double d = std::fabs(ours[i] - ref[i]);
    if (!(d <= 1e300)) return INFINITY;  // NaN or inf where the reference is finite
    worst = std::max(worst, d);
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return worst / std::max(scale, 1e-30);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string filter = argc > 1 ? argv[1] : "";
  const char* only_dtype = std::getenv("SCAN_DTYPE");
  const char* x_draw = std::getenv("SCAN_X");
  const bool bench_x = x_draw && std::string(x_draw) == "bench";
  // The masked stretches' length: none, 65536 or 1000 positions.
  const size_t mask_stretch = !x_draw                                 ? 0
                              : std::string(x_draw) == "masked"       ? 65536
                              : std::string(x_draw) == "masked_short" ? 1000
                                                                      : 0;
  const double roofline = copy_roofline_gbs();
  std::printf("copy roofline %.1f GB/s\n\n", roofline);
  if (reverse_scans()) std::printf("reversed scans (SCAN_REVERSE=1)\n\n");
  std::printf("| case | dtype | path | us | %% of copy roofline | copy of the same bytes, us | rel err |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  struct Shape {
    const char* label;
    ScanShape shape;
  };
  // The issue's three shapes, the few-column shapes of bench_scan_shapes.py
  // (the columns and column_tiles paths), many short rows (row_groups), and
  // other long rows (long_rows).
  std::vector<Shape> shapes = {{"[4096, 8192] dim=-1", {4096, 8192, 1}},
                          {"[4096, 8192] dim=0", {1, 4096, 8192}},
                          {"[1, 16777216]", {1, 1 << 24, 1}},
                          {"[16, 2048, 64] dim=1", {16, 2048, 64}},
                          {"[8, 4096, 3] dim=1", {8, 4096, 3}},
                          {"[128, 1000, 7] dim=1", {128, 1000, 7}},
                          {"[4096, 96] dim=0", {1, 4096, 96}},
                          {"[1048576, 16] dim=-1", {1048576, 16, 1}},
                          {"[262144, 64] dim=-1", {262144, 64, 1}},
                          {"[65536, 256] dim=-1", {65536, 256, 1}},
                          {"[1, 1048576]", {1, 1 << 20, 1}},
                          {"[1, 4194304]", {1, 1 << 22, 1}},
                          {"[4, 4194304]", {4, 1 << 22, 1}},
                          {"[64, 262144]", {64, 1 << 18, 1}}};
  // SCAN_ROWS="R,L;R,L": more [R, L] shapes along dim -1, and
  // SCAN_COLS="O,L,I;O,L,I": more [O, L, I] shapes along dim 1, after these.
  std::deque<std::string> labels;
  const auto add_shapes = [&](const char* env, int fields) {
    const char* list_text = std::getenv(env);
    if (list_text == nullptr) return;
    std::stringstream list(list_text);
    std::string item;
    while (std::getline(list, item, ';')) {
      std::stringstream numbers(item);
      std::string number;
      std::vector<int64_t> n;
      while (std::getline(numbers, number, ',')) n.push_back(std::stoll(number));
      if (static_cast<int>(n.size()) != fields) continue;
      std::string label = "[";
      for (size_t k = 0; k < n.size(); ++k) label += (k ? ", " : "") + std::to_string(n[k]);
      labels.push_back(label + (fields == 3 ? "] dim=1" : "]"));
      const ScanShape shape = fields == 3 ? ScanShape{n[0], n[1], n[2]} : ScanShape{n[0], n[1], 1};
      shapes.push_back({labels.back().c_str(), shape});
    }
  };
  add_shapes("SCAN_ROWS", 2);
  add_shapes("SCAN_COLS", 3);
  std::normal_distribution<float> normal;
  for (const bool bf16 : {false, true}) {
    if (only_dtype && std::string(only_dtype) != (bf16 ? "bf16" : "f32")) continue;
    for (const Shape& s : shapes) {
      bool any = false;
      for (int kind = 0; kind < 5; ++kind) {
        for (const bool backward : {false, true}) {
          any |= Case{ScanKind(kind), backward, bf16, s.label, s.shape}.name().find(filter) !=
                 std::string::npos;
        }
      }
      if (!any) continue;  // a large shape's draw takes seconds
      // One draw per shape, uploaded to every set: the sets are cold copies.
      // Seeded by the shape, so a case's data is the same whatever the filter.
      std::mt19937 gen(static_cast<unsigned>(&s - shapes.data()));
      std::vector<float> x(s.shape.numel()), dy(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        x[i] = normal(gen);
        dy[i] = normal(gen);
      }
      for (int kind = 0; kind < 5; ++kind) {
        for (const bool backward : {false, true}) {
          const Case c{ScanKind(kind), backward, bf16, s.label, s.shape};
          if (c.name().find(filter) == std::string::npos) continue;
          // x near 1, as the benchmark draws it: always for cumprod (its
          // factors), for every op with SCAN_X=bench.
          std::vector<float> xs = x;
          if (c.kind == ScanKind::kCumprod || bench_x) {
            for (float& v : xs) v = 1.f + 1e-3f * v;
          }
          // SCAN_X=masked or masked_short: every other stretch -inf, as a
          // mask leaves logits.
          if (mask_stretch != 0) {
            for (size_t i = 0; i < xs.size(); ++i) {
              if ((i / mask_stretch) % 2 == 1) xs[i] = -std::numeric_limits<float>::infinity();
            }
          }
          const int count = std::max(2, std::min(8, int(std::ceil(200e6 / c.bytes_moved()))));
          std::vector<std::unique_ptr<TensorSet>> sets;
          for (int k = 0; k < count; ++k) {
            sets.push_back(std::make_unique<TensorSet>(c));
            const TensorSet& t = *sets.back();
            upload(t.x, xs, bf16);
            upload(t.dy, dy, bf16);
            check_status(scan_forward_cuda(forward_args(c, t, t.y.ptr), nullptr), "saved forward");
          }
          // Every element written: poisoned (all bits set: NaN) before the check run.
          check_cuda(cudaMemset(sets[0]->out.ptr, 0xff, s.shape.numel() * c.elem_bytes()), "poison");
          launch_case(c, *sets[0]);
          check_cuda(cudaDeviceSynchronize(), c.name().c_str());
          const double err = relative_error(c, *sets[0]);
          const float us = median_us([&](int r) { launch_case(c, *sets[r % count]); });
          sets.clear();
          const float copy_us = same_bytes_copy_us(c.bytes_moved());
          std::printf("| %s | %s | %s | %.1f | %.1f | %.1f | %.2e |\n", c.name().c_str(),
                      bf16 ? "bfloat16" : "float32", scan_path_name(plan_scan(s.shape).path), us,
                      100.0 * c.bytes_moved() / us / 1e3 / roofline, copy_us, err);
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
