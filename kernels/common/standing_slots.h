// Slots that a stream keeps from launch to launch, for kernels that hand
// states from block to block behind ready marks. Such slots must hold no
// word with the launch's mark when it starts. A workspace zeroed ahead of
// every launch does that at the cost of a memset (or zeroing kernel) a
// call; standing slots are zeroed once, when allocated or grown, and each
// launch takes a mark no earlier launch on them used. That saves the
// zeroing and its launch gap (H100, staged logcumsumexp forward on
// [1, 16M]: float32 75.5 -> 72.8 us, bfloat16 53.1 -> 49.9; bfloat16 cumsum
// about 0.8 us; float32 cumsum unchanged; benchmarks/RESULTS.md).
//
// Two kinds, a buffer each per stream, so that no launch of one kind reads
// a mark where a launch of the other left arbitrary bytes:
//  - flagged words (long_rows, staged or not, scan_publish.cuh): a ticket
//    counter, then 16-byte words, each a 64-bit mark beside 8 bytes of
//    state, so that every word is either zero or carries the mark of the
//    launch that wrote it.
//  - ticketed tiles (column_tiles, strip_tiles): a ticket counter and
//    32-bit ready flags in a marked part, which holds nothing but zeros,
//    marks and the counter, and the states they guard in a part of their
//    own after it, which holds anything. The parts grow apart, so that a
//    launch's flags never lie where an earlier launch of another shape put
//    states. Marks of 32 bits run out: before the first that would not
//    fit, the marked part is zeroed again and marks restart at 1.
// Either kind's counter is back at zero when a launch ends: its last
// ticket sets it so (scan_publish.cuh's take_ticket_and_rewind).
//
// One buffer per (device, stream, kind), leased under a lock held until the
// lease ends: the caller launches while it holds the lease, so the buffer
// cannot be replaced under a launch queued from another thread. Launches on
// one stream run one after another, so one buffer a stream suffices. There
// is no standing buffer (the lease returns false, and the caller zeroes its
// own workspace) for a stream being captured into a CUDA graph, whose
// replays would all repeat one mark; for the per-thread default stream, one
// handle for many streams; past kMaxStandingBuffers buffers; for more than
// kMaxStandingBytes; and where allocating fails. The buffers live as long
// as the process (freed with the CUDA context, not before: freeing in a
// static destructor would race the context's teardown).
// No torch headers.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "common/cuda_launch.cuh"

namespace baracuda {

constexpr size_t kMaxStandingBuffers = 128;  // 64 streams with both kinds
constexpr int64_t kMaxStandingBytes = int64_t{16} << 20;
constexpr int64_t kMinStandingBytes = int64_t{64} << 10;

enum class StandingKind : int { kFlaggedWords = 0, kTicketedTiles = 1 };

struct StandingLease {
  void* slots = nullptr;   // the marked part
  void* states = nullptr;  // ticketed tiles: the states' part
  uint64_t mark = 0;       // this launch's ready mark, never 0
  std::unique_lock<std::mutex> hold;
};

namespace standing_detail {

struct Buffer {
  void* words = nullptr;
  int64_t marked_bytes = 0;  // zeroed when allocated
  int64_t state_bytes = 0;   // after the marked part, never zeroed
  uint64_t last_mark = 0;    // marks only grow: each one is used once
};

struct Table {
  std::mutex mutex;
  // (device, stream id, kind)
  std::map<std::tuple<int, unsigned long long, StandingKind>, Buffer> of;
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

// The last mark a launch of `kind` may take: flags of 32 bits for ticketed
// tiles, 64 for flagged words.
inline uint64_t max_mark(StandingKind kind) {
  return kind == StandingKind::kTicketedTiles ? uint64_t{0xffffffffu} : ~uint64_t{0};
}

// Replaces b's words by ones with room for `marked` and `states` bytes, the
// marked part zeroed, ordered on `stream` before what the caller launches
// next. cudaFree waits for the work that may still use the old words.
inline bool grow(Buffer& b, int64_t marked, int64_t states, cudaStream_t stream) {
  void* words = nullptr;
  if (cudaMalloc(&words, static_cast<size_t>(marked + states)) != cudaSuccess) {
    cudaGetLastError();  // out of memory is not the caller's error: it zeroes its own
    return false;
  }
  if (cudaMemsetAsync(words, 0, static_cast<size_t>(marked), stream) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(words);
    return false;
  }
  if (b.words != nullptr && cudaFree(b.words) != cudaSuccess) cudaGetLastError();
  b.words = words;
  b.marked_bytes = marked;
  b.state_bytes = states;
  return true;
}

// Leases `kind`'s buffer of `stream` with at least `marked` and `states`
// bytes, and a mark of at most `max_mark`; see lease_standing_slots.
inline bool lease(cudaStream_t stream, StandingKind kind, int64_t marked, int64_t states,
                  uint64_t max_mark, StandingLease& out) {
  if (marked + states > kMaxStandingBytes || stream == cudaStreamPerThread) return false;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone || cudaStreamGetId(stream, &id) != cudaSuccess) {
    cudaGetLastError();  // a query refused (e.g. during another stream's capture): fall back
    return false;
  }
  Table& t = table();
  std::unique_lock<std::mutex> hold(t.mutex);
  const auto key = std::make_tuple(current_device(), id, kind);
  auto it = t.of.find(key);
  if (it == t.of.end()) {
    if (t.of.size() >= kMaxStandingBuffers) return false;
    it = t.of.emplace(key, Buffer{}).first;
  }
  Buffer& b = it->second;
  if (b.marked_bytes < marked || b.state_bytes < states) {
    const int64_t grown_marked = std::max(b.marked_bytes, rounded_bytes(marked));
    const int64_t grown_states = states > 0 ? std::max(b.state_bytes, rounded_bytes(states)) : 0;
    if (grown_marked + grown_states > kMaxStandingBytes ||
        !grow(b, grown_marked, grown_states, stream)) {
      return false;
    }
  }
  if (b.last_mark == max_mark) {  // out of marks: zero the marked part, start again
    if (cudaMemsetAsync(b.words, 0, static_cast<size_t>(b.marked_bytes), stream) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    b.last_mark = 0;
  }
  out.slots = b.words;
  out.states = static_cast<char*>(b.words) + b.marked_bytes;
  out.mark = ++b.last_mark;
  out.hold = std::move(hold);
  return true;
}

}  // namespace standing_detail

// Standing slots of `kind` for `stream` on the current device, with room
// for `marked` bytes (for flagged words, all of them) and `states` bytes
// after them (ticketed tiles), and a fresh mark (64-bit for flagged words,
// 32-bit for ticketed tiles), in `lease`; false where there are none (see
// above).
inline bool lease_standing_slots(cudaStream_t stream, StandingKind kind, int64_t marked,
                                 int64_t states, StandingLease& lease) {
  return standing_detail::lease(stream, kind, marked, states, standing_detail::max_mark(kind),
                                lease);
}

// For tests of the marks' wrap, which otherwise comes after 2^32 - 1 calls
// on one stream: leaves `marks_left` fresh marks (at most 2^32 - 2) to each
// existing buffer of `stream` on the current device, so that the call after
// those zeroes the marked part and restarts at mark 1. Returns how many
// buffers it found.
inline int set_standing_marks_left(cudaStream_t stream, uint64_t marks_left) {
  unsigned long long id = 0;
  if (marks_left >= uint64_t{0xffffffffu} || cudaStreamGetId(stream, &id) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  standing_detail::Table& t = standing_detail::table();
  const std::lock_guard<std::mutex> hold(t.mutex);
  int found = 0;
  for (StandingKind kind : {StandingKind::kFlaggedWords, StandingKind::kTicketedTiles}) {
    const auto it = t.of.find(std::make_tuple(current_device(), id, kind));
    if (it == t.of.end()) continue;
    it->second.last_mark = standing_detail::max_mark(kind) - marks_left;
    ++found;
  }
  return found;
}

}  // namespace baracuda
