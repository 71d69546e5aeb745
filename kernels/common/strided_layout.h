// A copy between two strided views of one shape, and the host-side
// simplifications every copy-like launcher wants before it picks a kernel:
// drop unit axes, order axes so the destination is walked in memory order,
// merge axes that are contiguous in both views, and widen the element to the
// largest unit (up to 16 bytes) that every address and stride allows.
// Framework-free: used by the op layer (with torch) and by plain kernels.
#pragma once

#include <cstdint>

namespace baracuda {

constexpr int kMaxRank = 8;

struct StridedPair {
  int rank = 0;
  int64_t sizes[kMaxRank] = {};
  int64_t dst_strides[kMaxRank] = {};  // in elements (or units after widening)
  int64_t src_strides[kMaxRank] = {};

  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= sizes[d];
    return n;
  }
  // Both views are one gap-free, front-to-back run of memory.
  bool is_single_dense_run() const {
    return rank == 1 && dst_strides[0] == 1 && src_strides[0] == 1;
  }
};

// Put the pair in canonical form: no size-1 axes, axes ordered by destination
// stride (outermost first), adjacent axes merged where both views allow it.
// A pair with zero elements is left alone; a single element becomes rank 1.
inline void canonicalize(StridedPair& p) {
  if (p.numel() == 0) return;
  StridedPair q;
  for (int d = 0; d < p.rank; ++d) {
    if (p.sizes[d] == 1) continue;
    q.sizes[q.rank] = p.sizes[d];
    q.dst_strides[q.rank] = p.dst_strides[d];
    q.src_strides[q.rank] = p.src_strides[d];
    ++q.rank;
  }
  // Insertion sort (rank <= 8): larger destination stride first; ties keep order.
  for (int i = 1; i < q.rank; ++i) {
    for (int j = i; j > 0 && q.dst_strides[j - 1] < q.dst_strides[j]; --j) {
      int64_t t;
      t = q.sizes[j]; q.sizes[j] = q.sizes[j - 1]; q.sizes[j - 1] = t;
      t = q.dst_strides[j]; q.dst_strides[j] = q.dst_strides[j - 1]; q.dst_strides[j - 1] = t;
      t = q.src_strides[j]; q.src_strides[j] = q.src_strides[j - 1]; q.src_strides[j - 1] = t;
    }
  }
  StridedPair m;
  for (int d = 0; d < q.rank; ++d) {
    if (m.rank > 0) {
      const int last = m.rank - 1;
      const bool dst_joins = m.dst_strides[last] == q.dst_strides[d] * q.sizes[d];
      const bool src_joins = m.src_strides[last] == q.src_strides[d] * q.sizes[d];
      if (dst_joins && src_joins) {
        m.sizes[last] *= q.sizes[d];
        m.dst_strides[last] = q.dst_strides[d];
        m.src_strides[last] = q.src_strides[d];
        continue;
      }
    }
    m.sizes[m.rank] = q.sizes[d];
    m.dst_strides[m.rank] = q.dst_strides[d];
    m.src_strides[m.rank] = q.src_strides[d];
    ++m.rank;
  }
  if (m.rank == 0) {
    m.rank = 1;
    m.sizes[0] = 1;
    m.dst_strides[0] = 1;
    m.src_strides[0] = 1;
  }
  p = m;
}

// Largest unit (a multiple of elem_bytes, at most 16 bytes) in which the
// canonical pair can be re-expressed: the innermost axis must be unit-stride
// in both views and span whole units, and every other stride (plus any extra
// strides the caller adds to addresses, such as per-row steps) and both base
// addresses must be unit-aligned. Returns elem_bytes when nothing wider fits.
inline int widest_unit_bytes(const StridedPair& p, int elem_bytes, uintptr_t dst_addr,
                             uintptr_t src_addr, const int64_t* extra_strides,
                             int num_extra) {
  if (p.rank == 0 || p.numel() == 0) return elem_bytes;
  const int inner = p.rank - 1;
  if (p.dst_strides[inner] != 1 || p.src_strides[inner] != 1) return elem_bytes;
  for (int unit = 16; unit > elem_bytes; unit /= 2) {
    if (unit % elem_bytes != 0) continue;
    bool fits = (dst_addr % unit == 0) && (src_addr % unit == 0) &&
                (p.sizes[inner] * elem_bytes) % unit == 0;
    for (int d = 0; fits && d < inner; ++d) {
      fits = (p.dst_strides[d] * elem_bytes) % unit == 0 &&
             (p.src_strides[d] * elem_bytes) % unit == 0;
    }
    for (int e = 0; fits && e < num_extra; ++e) {
      fits = (extra_strides[e] * elem_bytes) % unit == 0;
    }
    if (fits) return unit;
  }
  return elem_bytes;
}

// Rescale a canonical pair from elements of elem_bytes to units of unit_bytes
// (which widest_unit_bytes has shown to divide every stride involved).
inline void rescale_to_unit(StridedPair& p, int elem_bytes, int unit_bytes) {
  if (unit_bytes == elem_bytes) return;
  const int64_t ratio = unit_bytes / elem_bytes;
  const int inner = p.rank - 1;
  p.sizes[inner] /= ratio;
  for (int d = 0; d < inner; ++d) {
    p.dst_strides[d] /= ratio;
    p.src_strides[d] /= ratio;
  }
}

}  // namespace baracuda
