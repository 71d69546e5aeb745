// Slots that a stream keeps from launch to launch, for kernels that hand
// states from block to block behind ready marks (scan_publish.cuh's flagged
// words). Such slots must hold no word with the launch's mark when it
// starts. A workspace zeroed ahead of every launch does that at the cost of
// a memset a call; standing slots are zeroed once, when allocated or grown,
// and each launch takes a mark no earlier launch on them used. That saves
// the memset and its launch gap (H100, staged logcumsumexp forward on
// [1, 16M]: float32 75.5 -> 72.8 us, bfloat16 53.1 -> 49.9; bfloat16 cumsum
// about 0.8 us; float32 cumsum unchanged; benchmarks/RESULTS.md).
//
// One buffer per (device, stream), leased under a lock held until the lease
// ends: the caller launches while it holds the lease, so the buffer cannot
// be replaced under a launch queued from another thread. Launches on one
// stream run one after another, so one buffer a stream suffices. There is
// no standing buffer (lease_standing_slots returns false, and the caller
// zeroes its own workspace) for a stream being captured into a CUDA graph,
// whose replays would all repeat one mark; for the per-thread default
// stream, one handle for many streams; past kMaxStandingStreams streams;
// for more than kMaxStandingBytes; and where allocating fails. The buffers
// live as long as the process (freed with the CUDA context, not before:
// freeing in a static destructor would race the context's teardown).
// No torch headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "common/cuda_launch.cuh"

namespace baracuda {

constexpr size_t kMaxStandingStreams = 64;
constexpr int64_t kMaxStandingBytes = int64_t{16} << 20;
constexpr int64_t kMinStandingBytes = int64_t{64} << 10;

struct StandingLease {
  void* slots = nullptr;
  uint64_t mark = 0;  // this launch's ready mark, never 0
  std::unique_lock<std::mutex> hold;
};

namespace standing_detail {

struct Buffer {
  void* words = nullptr;
  int64_t bytes = 0;
  uint64_t last_mark = 0;  // marks only grow: each one is used once
};

struct Table {
  std::mutex mutex;
  std::map<std::pair<int, unsigned long long>, Buffer> of;  // (device, stream id)
};

inline Table& table() {
  static Table* t = new Table;  // never destroyed: see the header's note on lifetime
  return *t;
}

// The smallest power of two of at least `bytes` and kMinStandingBytes, so
// that a stream's buffer grows only a few times.
inline int64_t rounded_bytes(int64_t bytes) {
  int64_t r = kMinStandingBytes;
  while (r < bytes) r *= 2;
  return r;
}

// Replaces b's words by `bytes` zeroed ones, ordered on `stream` before what
// the caller launches next. cudaFree waits for the work that may still use
// the old words.
inline bool grow(Buffer& b, int64_t bytes, cudaStream_t stream) {
  void* words = nullptr;
  if (cudaMalloc(&words, static_cast<size_t>(bytes)) != cudaSuccess) {
    cudaGetLastError();  // out of memory is not the caller's error: it zeroes its own
    return false;
  }
  if (cudaMemsetAsync(words, 0, static_cast<size_t>(bytes), stream) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(words);
    return false;
  }
  if (b.words != nullptr && cudaFree(b.words) != cudaSuccess) cudaGetLastError();
  b.words = words;
  b.bytes = bytes;
  return true;
}

}  // namespace standing_detail

// At least `bytes` of standing slots for `stream` on the current device, and
// a fresh mark, in `lease`; false where there are none (see above).
inline bool lease_standing_slots(cudaStream_t stream, int64_t bytes, StandingLease& lease) {
  using namespace standing_detail;
  if (bytes > kMaxStandingBytes || stream == cudaStreamPerThread) return false;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone || cudaStreamGetId(stream, &id) != cudaSuccess) {
    cudaGetLastError();  // a query refused (e.g. during another stream's capture): fall back
    return false;
  }
  Table& t = table();
  std::unique_lock<std::mutex> hold(t.mutex);
  const auto key = std::make_pair(current_device(), id);
  auto it = t.of.find(key);
  if (it == t.of.end()) {
    if (t.of.size() >= kMaxStandingStreams) return false;
    it = t.of.emplace(key, Buffer{}).first;
  }
  Buffer& b = it->second;
  if (b.bytes < bytes && !grow(b, rounded_bytes(bytes), stream)) return false;
  lease.slots = b.words;
  lease.mark = ++b.last_mark;
  lease.hold = std::move(hold);
  return true;
}

}  // namespace baracuda
