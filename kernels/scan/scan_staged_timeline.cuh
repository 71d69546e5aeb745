// A block-by-block timeline of the staged long rows (scan_staged_rows.cuh),
// for finding where their time goes. Compiled in only with
// -DBARACUDA_STAGED_TIMELINE, which the launcher timer takes through its
// NVCC_FLAGS (benchmarks/scan_launch_timer.sh); the extension never defines
// it, and then STAGED_STAMP is nothing. Included by scan_launch.cuh.
//
// Thread 0 of each of the first kTimelineBlocks blocks writes %globaltimer
// (nanoseconds) at mark 0 when the block starts, 1 when its first tile is
// folded and published, and in its round i: 2 + 4i when the next tile's data
// is in, 3 + 4i when that tile's fold is published, 4 + 4i when the scanned
// tile's prefix is in, 5 + 4i when the tile is scanned; and a block whose
// first fold closes a group, when that fold is done, before it reads its
// peers' totals (STAGED_STAMP_CLOSER). The stamps cost the
// kernel a few microseconds a call. print_staged_timeline() summarises the
// last launch: for each mark, the spread over the blocks of its time since
// the first block's start, and the blocks whose first fold came out last
// (group closers, on H100: benchmarks/RESULTS.md), with how late the
// first-round closers got their group totals out.
//
// Every part of the CUDA scans (scan_cuda_parts.h) has its own stamp arrays
// and enters them in one list when the program loads. The timer includes
// this file and calls the two host functions: they zero every part's arrays,
// and print the one part whose blocks stamped.
#pragma once

#ifdef BARACUDA_STAGED_TIMELINE

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace baracuda {
namespace scan {

constexpr int kTimelineBlocks = 1024;
constexpr int kTimelineRounds = 24;
constexpr int kTimelineMarks = 2 + 4 * kTimelineRounds;

// Where one part's stamp arrays are on the device.
struct TimelineArrays {
  unsigned long long* stamps = nullptr;   // [kTimelineBlocks][kTimelineMarks]
  unsigned long long* closers = nullptr;  // [kTimelineBlocks]
};
using LocateTimeline = TimelineArrays (*)();

// The parts' locators, one list across the program (an inline function's
// static is one object in every translation unit).
inline std::vector<LocateTimeline>& timeline_parts() {
  static std::vector<LocateTimeline> parts;
  return parts;
}

namespace {  // one copy for each translation unit that includes this file

__device__ unsigned long long staged_timeline[kTimelineBlocks][kTimelineMarks];
// When a block that closes a group in its first fold has that fold done,
// before it reads its peers' totals (stamp_staged_closer).
__device__ unsigned long long staged_closer_folded[kTimelineBlocks];

__device__ inline void stamp_staged(int mark) {
  if (threadIdx.x != 0 || blockIdx.x >= kTimelineBlocks || mark >= kTimelineMarks) return;
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  staged_timeline[blockIdx.x][mark] = now;
}

__device__ inline void stamp_staged_closer() {
  if (threadIdx.x != 0 || blockIdx.x >= kTimelineBlocks || staged_closer_folded[blockIdx.x] != 0) {
    return;
  }
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  staged_closer_folded[blockIdx.x] = now;
}

TimelineArrays locate_timeline() {
  TimelineArrays a;
  void* at = nullptr;
  if (cudaGetSymbolAddress(&at, staged_timeline) == cudaSuccess) {
    a.stamps = static_cast<unsigned long long*>(at);
  }
  if (cudaGetSymbolAddress(&at, staged_closer_folded) == cudaSuccess) {
    a.closers = static_cast<unsigned long long*>(at);
  }
  return a;
}

const bool timeline_entered = (timeline_parts().push_back(&locate_timeline), true);

}  // namespace

// Zeroes the stamps, in stream order on the default stream: a block that
// does not reach a mark leaves it 0.
inline void clear_staged_timeline() {
  for (LocateTimeline locate : timeline_parts()) {
    const TimelineArrays a = locate();
    if (a.stamps) {
      cudaMemsetAsync(a.stamps, 0, sizeof(unsigned long long) * kTimelineBlocks * kTimelineMarks);
    }
    if (a.closers) cudaMemsetAsync(a.closers, 0, sizeof(unsigned long long) * kTimelineBlocks);
  }
}

// The timeline of one part's arrays; false if none of its blocks stamped.
inline bool print_timeline_of(const TimelineArrays& arrays) {
  std::vector<unsigned long long> h(size_t{kTimelineBlocks} * kTimelineMarks);
  if (arrays.stamps == nullptr ||
      cudaMemcpy(h.data(), arrays.stamps, h.size() * sizeof(h[0]), cudaMemcpyDeviceToHost) !=
          cudaSuccess) {
    return false;
  }
  auto at = [&](int b, int mark) { return h[size_t(b) * kTimelineMarks + mark]; };
  int blocks = 0;
  while (blocks < kTimelineBlocks && at(blocks, 0) != 0) ++blocks;
  if (blocks == 0) return false;
  unsigned long long t0 = at(0, 0);
  for (int b = 1; b < blocks; ++b) t0 = std::min(t0, at(b, 0));
  auto line = [&](const char* what, int round, int mark) {
    std::vector<double> us;
    for (int b = 0; b < blocks; ++b) {
      if (at(b, mark) >= t0 && at(b, mark) != 0) us.push_back((at(b, mark) - t0) / 1e3);
    }
    if (us.empty()) return false;
    std::sort(us.begin(), us.end());
    const size_t n = us.size();
    std::printf("  %-22s r%-3d n=%4zu min %7.2f p10 %7.2f med %7.2f p90 %7.2f max %7.2f us\n",
                what, round, n, us[0], us[n / 10], us[n / 2], us[n * 9 / 10], us[n - 1]);
    return true;
  };
  std::printf("timeline of %d blocks, us from the first block's start\n", blocks);
  line("block start", 0, 0);
  line("first fold published", 0, 1);
  // The first folds published last hold back every later tile's first scan.
  std::vector<int> order(blocks);
  for (int b = 0; b < blocks; ++b) order[b] = b;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return at(a, 1) > at(b, 1); });
  std::printf("  last first folds:");
  for (int k = 0; k < std::min(blocks, 12); ++k) {
    std::printf(" b%d %.2f", order[k], (at(order[k], 1) - t0) / 1e3);
  }
  std::printf(" us\n");
  // A one-row launch's first-round closers (block b closing tiles b - 31 to
  // b): how long after its own fold and after its last peer's total was
  // out a closer got its group's total out. The second is the time the
  // peers' totals take to reach it.
  std::vector<unsigned long long> folded(kTimelineBlocks);
  if (arrays.closers != nullptr &&
      cudaMemcpy(folded.data(), arrays.closers, folded.size() * sizeof(folded[0]),
                 cudaMemcpyDeviceToHost) == cudaSuccess) {
    std::vector<double> after_own, after_peers;
    for (int b = 31; b < blocks; b += 32) {
      if (folded[b] < t0 || at(b, 1) < folded[b]) continue;
      unsigned long long last_peer = 0;
      for (int p = b - 31; p < b; ++p) last_peer = std::max(last_peer, at(p, 1));
      after_own.push_back((at(b, 1) - folded[b]) / 1e3);
      after_peers.push_back((double(at(b, 1)) - double(last_peer)) / 1e3);
    }
    if (!after_own.empty()) {
      std::sort(after_own.begin(), after_own.end());
      std::sort(after_peers.begin(), after_peers.end());
      const size_t n = after_own.size();
      std::printf("  first-round closers (n=%zu): group total out after own fold min %.2f med "
                  "%.2f max %.2f, after the last peer's min %.2f med %.2f max %.2f us\n",
                  n, after_own[0], after_own[n / 2], after_own[n - 1], after_peers[0],
                  after_peers[n / 2], after_peers[n - 1]);
    }
  }
  for (int r = 0; r < kTimelineRounds; ++r) {
    line("next tile in", r, 2 + 4 * r);
    line("fold ahead published", r, 3 + 4 * r);
    line("prefix in", r, 4 + 4 * r);
    if (!line("tile scanned", r, 5 + 4 * r)) break;
  }
  // Where a round goes, block by block: the wait for its next tile's data
  // (from the end of the previous round's scan), the fold ahead, the wait
  // for the prefix after it, and the scan. Medians over the blocks, apart
  // for the group closers of a one-row launch (tile b + r * blocks closing
  // its group of 32; they read their group's other totals after the fold).
  std::printf("  round durations, medians over blocks (closers | others), us:\n");
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (int r = 1; r < kTimelineRounds; ++r) {
    std::vector<double> parts[2][4];
    for (int b = 0; b < blocks; ++b) {
      const unsigned long long before = at(b, 5 + 4 * (r - 1)), in = at(b, 2 + 4 * r),
                               folded = at(b, 3 + 4 * r), prefix = at(b, 4 + 4 * r),
                               scanned = at(b, 5 + 4 * r);
      if (before == 0 || scanned == 0 || in == 0 || folded == 0) continue;
      const int closer = (int64_t(b) + int64_t(r + 1) * blocks) % 32 == 31;
      parts[closer][0].push_back((double(in) - double(before)) / 1e3);
      parts[closer][1].push_back((double(folded) - double(in)) / 1e3);
      parts[closer][2].push_back((double(prefix) - double(folded)) / 1e3);
      parts[closer][3].push_back((double(scanned) - double(prefix)) / 1e3);
    }
    if (parts[0][0].empty()) break;
    std::printf("  r%-3d data wait %5.2f | %5.2f  fold %5.2f | %5.2f  prefix wait %5.2f | %5.2f"
                "  scan %5.2f | %5.2f\n",
                r, median(parts[1][0]), median(parts[0][0]), median(parts[1][1]),
                median(parts[0][1]), median(parts[1][2]), median(parts[0][2]),
                median(parts[1][3]), median(parts[0][3]));
  }
  return true;
}

inline void print_staged_timeline() {
  for (LocateTimeline locate : timeline_parts()) {
    if (print_timeline_of(locate())) return;
  }
  std::printf("timeline: no block stamped\n");
}

}  // namespace scan
}  // namespace baracuda

#define STAGED_STAMP(mark) ::baracuda::scan::stamp_staged(mark)
#define STAGED_STAMP_CLOSER() ::baracuda::scan::stamp_staged_closer()
#else
#define STAGED_STAMP(mark) ((void)0)
#define STAGED_STAMP_CLOSER() ((void)0)
#endif
