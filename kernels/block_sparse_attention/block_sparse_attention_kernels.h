// Launchers of the block-sparse attention family, over raw pointers.
//
//   out[b, h, i] = sum_j softmax_j(scale * <q[b, h, i], k[b, g, j]>) v[b, g, j]
//   lse[b, h, i] = log sum_j exp(scale * <q[b, h, i], k[b, g, j]>)   (natural log)
//
// over the keys j that are visible to query i: key block j / block_k is on in
// the mask row of query block i / block_q, and the element conditions hold
// (see BlockSparseAttentionArgs: causal, a window around the query's
// position, document ids). g = h / (heads / kv_heads) (grouped-query
// attention). A row with no visible key gets out = 0 and lse = -inf, the
// empty attention state. Key blocks that are off are never read.
#pragma once

#include <cstdint>

#include "common/float_dtype.h"
#include "common/status.h"
#include "common/unit_types.h"

namespace baracuda {

// A window side without a limit; far from int64's ends, so that positions
// plus or minus it do not overflow.
constexpr int64_t kUnboundedWindow = int64_t{1} << 60;

struct BlockSparseAttentionArgs {
  FloatDtype dtype = FloatDtype::kFloat32;  // of q, k, v, out
  int64_t batch = 0, heads = 0, kv_heads = 0;
  int64_t q_len = 0, k_len = 0;
  int64_t head_dim = 0;  // of q and k
  int64_t v_dim = 0;     // of v and out
  int64_t block_q = 1, block_k = 1;            // mask granularity, in rows / keys
  int64_t num_q_blocks = 0, num_k_blocks = 0;  // ceil(q_len / block_q), ceil(k_len / block_k)
  double scale = 1.0;
  // Element conditions, all ANDed with the block mask. kv_lens: batch b
  // sees only keys [0, kv_lens[b]) (clamped to [0, k_len]; nullptr: all
  // k_len), the filled part of a preallocated cache; nothing past it is
  // read. Query row i sits at key position pos = i (top-left, torch's
  // is_causal) or, bottom_right, i + keys(b) - q_len (a chunk of new
  // queries after a KV cache). causal: keys j <= pos. Window: pos -
  // window_left <= j <= pos + window_right (kUnboundedWindow: no limit on
  // that side). Document ids (both or neither): only keys whose id equals
  // the row's.
  bool causal = false;
  bool bottom_right = false;
  // [batch] at kv_lens_stride elements, int32 or int64 as the caller gave
  // them: a decode step reads the lengths in place, with no conversion.
  const void* kv_lens = nullptr;
  int64_t kv_lens_stride = 1;
  bool kv_lens_int32 = false;
  int64_t window_left = kUnboundedWindow, window_right = kUnboundedWindow;
  const int64_t* q_documents = nullptr;   // [1 or batch, q_len]
  const int64_t* kv_documents = nullptr;  // [1 or batch, k_len]
  int64_t q_documents_stride = 0, kv_documents_stride = 0;  // batch strides, 0 broadcast
  // An exact mask's partial tiles (both or neither): partial_index, laid out
  // as the mask, holds -1 for a tile that is off or full and else the tile's
  // slot in partial_bits, [slots, block_q, bit_words] words whose bit c % 32
  // of word c / 32 in row r says whether key c of the tile is visible to
  // row r of it.
  const int32_t* partial_index = nullptr;
  int64_t partial_index_strides[4] = {};
  const uint32_t* partial_bits = nullptr;
  int64_t bit_words = 0;  // ceil(block_k / 32)
  // Packed query heads (tensor-core forward only): q_period > 0 says that
  // the rows of one (batch, head) are the queries of several heads one
  // after the other, row i being query i % q_period of its head; positions
  // follow that query index. 0: row i is query i.
  int64_t q_period = 0;
  // Split keys (tensor-core forward only, flash-decoding): with kv_splits >
  // 1 every query tile runs kv_splits times, split s over the keys [s
  // split_keys, (s + 1) split_keys) (split_keys a multiple of the key
  // tile), and writes a partial state -- out as float32, lse -- at out +
  // s out_split_stride and lse + s lse_split_stride, for a merge to combine.
  int64_t kv_splits = 1, split_keys = 0;
  int64_t out_split_stride = 0, lse_split_stride = 0;
  const void* q = nullptr;  // [batch, heads, q_len, head_dim]
  const void* k = nullptr;  // [batch, kv_heads, k_len, head_dim]
  const void* v = nullptr;  // [batch, kv_heads, k_len, v_dim]
  void* out = nullptr;      // [batch, heads, q_len, v_dim]
  void* lse = nullptr;      // [batch, heads, q_len]: float32 (float64 with float64 inputs)
  // [mask_batch, mask_heads, num_q_blocks, num_k_blocks], nonzero byte = on;
  // a broadcast axis has stride 0.
  const uint8_t* mask = nullptr;
  // Strides in elements, axes in the order of the shapes above.
  int64_t q_strides[4] = {}, k_strides[4] = {}, v_strides[4] = {}, out_strides[4] = {};
  int64_t lse_strides[3] = {};
  int64_t mask_strides[4] = {};
};

// The backward pass of the same attention. With P = softmax of the visible
// scores (P_ij = exp(scale <q_i, k_j> - lse_i)):
//   dv_j = sum_i P_ij do_i
//   dS_ij = P_ij (<do_i, v_j> - delta_i),  delta_i = <do_i, out_i> - dlse_i
//   dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i
// summed, for dk and dv, over the query heads that share a key head. A row
// that sees no key (lse = -inf) contributes nothing. `forward` holds q, k, v,
// the mask and the shapes exactly as the forward call had them (its out and
// lse pointers unused). On CUDA, block_sparse_attention_backward_rows_cuda
// fills the per-row scratch (delta, lse_log2) before an executor runs.
struct BlockSparseAttentionBackwardArgs {
  BlockSparseAttentionArgs forward;
  const void* grad_out = nullptr;   // [batch, heads, q_len, v_dim], q's dtype
  const void* out = nullptr;        // the forward's output, same layout
  const void* lse = nullptr;        // [batch, heads, q_len], the forward's (compute dtype)
  const void* grad_lse = nullptr;   // same layout as lse, or nullptr (no lse gradient)
  // Per-row scratch of the CUDA executors, [batch * heads, rows_stride] in
  // the compute dtype (rows_stride >= q_len, a multiple of 128, so that a
  // tile of rows never runs into the next head): delta, and lse in log2 units
  // with +inf for a row that saw no key (so that 2^(s - lse) is 0 there);
  // rows past q_len hold delta 0 and lse +inf.
  void* delta = nullptr;
  void* lse_log2 = nullptr;
  int64_t rows_stride = 0;
  // The fused Hopper backward's dQ (block_sparse_attention_backward_hopper_fuses):
  // a float32 accumulator of [batch * heads, rows_stride, head_dim] elements
  // and an int32 per 64-row query tile, [batch * heads, rows_stride / 64];
  // nullptr: the two-kernel backward.
  void* dq_accum = nullptr;
  int* dq_order = nullptr;
  void* grad_q = nullptr;           // contiguous [batch, heads, q_len, head_dim], q's dtype
  void* grad_k = nullptr;           // contiguous [batch, kv_heads, k_len, head_dim]
  void* grad_v = nullptr;           // contiguous [batch, kv_heads, k_len, v_dim]
  int64_t grad_out_strides[4] = {}, out_strides[4] = {};
  int64_t lse_strides[3] = {}, grad_lse_strides[3] = {};
};

// Which executor a call runs on.
enum class AttentionPath : int { kHost, kCudaGeneric, kCudaTensorCore, kCudaHopper };

// Rows of one CTA of the tensor-core forward kernels for this problem, 0
// when they cannot run it: float16/bfloat16, head_dim == v_dim in {64, 128}
// (256: the Hopper forward only), block_q a multiple of 64, block_k a
// multiple of 64 (the kernel's key tile), unit inner strides and 16-byte
// aligned rows of q, k, v and out. Position conditions, exact-mask bits and
// document ids are all fine.
inline int tensor_core_tile_rows(const BlockSparseAttentionArgs& a) {
  const bool half = a.dtype == FloatDtype::kFloat16 || a.dtype == FloatDtype::kBFloat16;
  const bool dims = a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256;
  if (!half || a.head_dim != a.v_dim || !dims) return 0;
  if (a.block_k % 64 != 0 || a.block_q % 64 != 0) return 0;
  auto aligned = [](const void* p, const int64_t* s) {
    // 16 bytes = 8 half elements: every row start must be a multiple of it.
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && s[3] == 1 && s[0] % 8 == 0 &&
           s[1] % 8 == 0 && s[2] % 8 == 0;
  };
  if (!aligned(a.q, a.q_strides) || !aligned(a.k, a.k_strides) || !aligned(a.v, a.v_strides) ||
      !aligned(a.out, a.out_strides)) {
    return 0;
  }
  return a.block_q % 128 == 0 && a.head_dim <= 128 ? 128 : 64;
}

// Host executor for float32 / float64 (the op layer upcasts half types).
KernelStatus block_sparse_attention_cpu(const BlockSparseAttentionArgs& a);
// Any dtype, head dims up to 256, any block sizes and strides.
KernelStatus block_sparse_attention_generic_cuda(const BlockSparseAttentionArgs& a, void* stream);
// The mma.sync kernel; only for problems with tensor_core_tile_rows(a) > 0.
KernelStatus block_sparse_attention_tensor_core_cuda(const BlockSparseAttentionArgs& a,
                                                     void* stream);
// How many key splits (kv_splits) the tensor-core forward kernels should
// run problem `a` with on the current device: 1 when its query tiles fill
// the GPU, else as many as keep a wave of CTAs busy, each split at least a
// few key tiles long.
int64_t tensor_core_key_splits(const BlockSparseAttentionArgs& a);
// The wgmma + TMA kernel for the same problems, on Hopper GPUs. Its grid is
// persistent and hands out work through `work_counter`, one int32 in device
// memory that must be zero when the kernel starts.
KernelStatus block_sparse_attention_hopper_cuda(const BlockSparseAttentionArgs& a, int* work_counter,
                                               void* stream);
// Backward executors: the host one (float32 / float64, the op layer upcasts
// half types) and the generic CUDA one (any dtype, head dims up to 256, any
// block sizes and strides). Both are deterministic: every gradient element
// is written once, by one thread, summing in a fixed order. The host one
// runs the key head groups [first_group, last_group) of the
// batch * kv_heads groups (b, g), which write disjoint gradients.
KernelStatus block_sparse_attention_backward_cpu(const BlockSparseAttentionBackwardArgs& a,
                                                 int64_t first_group, int64_t last_group);
KernelStatus block_sparse_attention_backward_generic_cuda(const BlockSparseAttentionBackwardArgs& a,
                                                          void* stream);
// The wgmma + TMA backward on Hopper GPUs, for problems the Hopper forward
// takes (tensor_core_tile_rows > 0, grad_out laid out as the forward needs
// out) with rows_stride a multiple of 128. Two persistent kernels (or one
// fused pass, with dq_accum and dq_order set) hand out work through
// work_counters[0] and [1], int32 in device memory that must be zero when
// the call starts.
KernelStatus block_sparse_attention_backward_hopper_cuda(const BlockSparseAttentionBackwardArgs& a,
                                                         int* work_counters, void* stream);
// Whether the Hopper backward can take this problem in one fused pass
// (head_dim 128, block_k a multiple of 128), which needs dq_accum and
// dq_order; without them it runs two kernels.
bool block_sparse_attention_backward_hopper_fuses(const BlockSparseAttentionBackwardArgs& a);
// Fills the per-row scratch (delta, lse_log2) the CUDA executors read.
KernelStatus block_sparse_attention_backward_rows_cuda(const BlockSparseAttentionBackwardArgs& a,
                                                       void* stream);
// Whether the Hopper kernel can run on `device`: built for sm_90a, a compute
// capability 9.x GPU, and a driver that encodes tensor maps.
bool block_sparse_attention_hopper_available(int device);

// ---------------------------------------------------------------- visibility
//
// Shared by every executor so they agree on which keys are computed.

// Conditions that hold a key visible by position alone (per-batch key
// counts, a window, bottom-right causal), beyond top-left causal. Every
// executor takes them; the tile walks skip their bookkeeping without them.
BARACUDA_HOST_DEVICE inline bool has_position_conditions(const BlockSparseAttentionArgs& a) {
  return a.kv_lens != nullptr || a.window_left != kUnboundedWindow ||
         a.window_right != kUnboundedWindow || (a.causal && a.bottom_right && a.q_len != a.k_len);
}

// The per-element mask tests a Hopper kernel instantiation carries, in
// increasing order. Each level costs registers (spills in some kernels)
// even where its tests never run, so a problem runs the least level that
// covers it: element_tests.
constexpr int kTestsNone = 0;
constexpr int kTestsBits = 1;       // an exact mask's bits of its partial tiles
constexpr int kTestsDocuments = 2;  // document ids, and bits where the mask has them

BARACUDA_HOST_DEVICE inline int element_tests(const BlockSparseAttentionArgs& a) {
  if (a.q_documents != nullptr) return kTestsDocuments;
  return a.partial_index != nullptr ? kTestsBits : kTestsNone;
}

// The keys batch b sees: kv_lens[b] clamped to [0, k_len], else k_len.
BARACUDA_HOST_DEVICE inline int64_t keys_of(const BlockSparseAttentionArgs& a, int64_t b) {
  if (a.kv_lens == nullptr) return a.k_len;
  const int64_t i = b * a.kv_lens_stride;
  const int64_t n = a.kv_lens_int32 ? int64_t{static_cast<const int32_t*>(a.kv_lens)[i]}
                                    : static_cast<const int64_t*>(a.kv_lens)[i];
  return n < 0 ? 0 : (n < a.k_len ? n : a.k_len);
}

// Queries per head: q_len, or q_period with packed heads.
BARACUDA_HOST_DEVICE inline int64_t queries_per_head(const BlockSparseAttentionArgs& a) {
  return a.q_period > 0 ? a.q_period : a.q_len;
}

// A query's key position minus its index in batch b.
BARACUDA_HOST_DEVICE inline int64_t position_offset(const BlockSparseAttentionArgs& a, int64_t b) {
  return a.bottom_right ? keys_of(a, b) - queries_per_head(a) : 0;
}

// The key position of row i in batch b.
BARACUDA_HOST_DEVICE inline int64_t row_position(const BlockSparseAttentionArgs& a, int64_t b,
                                                 int64_t i) {
  return (a.q_period > 0 ? i % a.q_period : i) + position_offset(a, b);
}

// The keys [lo, hi) that a query at key position pos in batch b may see by
// position (its keys, causal and window). An empty range has lo == hi at
// the upper bound (at least 0), never above it: both ends then only move
// forward with the position, so the keys of consecutive positions are [lo
// of the first, hi of the last), also where some of them see none (a range
// pushed up to a lower bound past the keys would make that union reach
// past them).
BARACUDA_HOST_DEVICE inline void position_key_range(const BlockSparseAttentionArgs& a, int64_t b,
                                                    int64_t pos, int64_t& lo, int64_t& hi) {
  hi = keys_of(a, b);
  if (a.causal && pos + 1 < hi) hi = pos + 1;
  if (a.window_right != kUnboundedWindow && pos + a.window_right + 1 < hi) {
    hi = pos + a.window_right + 1;
  }
  lo = 0;
  if (a.window_left != kUnboundedWindow && pos - a.window_left > lo) lo = pos - a.window_left;
  if (hi < 0) hi = 0;
  if (lo > hi) lo = hi;
}

// The keys [lo, hi) that row i of batch b may see by position.
BARACUDA_HOST_DEVICE inline void visible_key_range(const BlockSparseAttentionArgs& a, int64_t b,
                                                   int64_t i, int64_t& lo, int64_t& hi) {
  position_key_range(a, b, row_position(a, b, i), lo, hi);
}

// The keys [lo, hi) that any of the rows [first, last] of batch b may see
// by position. Ranges only move forward with the position, so the first
// row's start and the last row's end bound them; packed rows that wrap
// around a head's queries span all of them.
BARACUDA_HOST_DEVICE inline void rows_key_range(const BlockSparseAttentionArgs& a, int64_t b,
                                                int64_t first, int64_t last, int64_t& lo,
                                                int64_t& hi) {
  int64_t p_first, p_last;
  if (a.q_period > 0 && first / a.q_period != last / a.q_period) {
    p_first = position_offset(a, b);
    p_last = p_first + a.q_period - 1;
  } else {
    p_first = row_position(a, b, first);
    p_last = row_position(a, b, last);
  }
  int64_t unused;
  position_key_range(a, b, p_first, lo, unused);
  position_key_range(a, b, p_last, unused, hi);
}

// The rows [lo, hi) of batch b that may see key j by position: the inverse
// of visible_key_range, empty ranges at the upper bound as there (a key
// past the last row's position must not yield rows past q_len).
BARACUDA_HOST_DEVICE inline void visible_row_range(const BlockSparseAttentionArgs& a, int64_t b,
                                                   int64_t j, int64_t& lo, int64_t& hi) {
  lo = 0;
  hi = j < keys_of(a, b) ? a.q_len : 0;
  const int64_t at = j - position_offset(a, b);  // the row whose position is j
  if (a.causal && at > lo) lo = at;
  if (a.window_right != kUnboundedWindow && at - a.window_right > lo) lo = at - a.window_right;
  if (a.window_left != kUnboundedWindow && at + a.window_left + 1 < hi) {
    hi = at + a.window_left + 1;
  }
  if (hi < 0) hi = 0;
  if (lo > hi) lo = hi;
}

// Whether key j, inside row i's position range and in a tile that is on,
// is visible to row i of head h in batch b: the same document (with ids) and
// its bit set where the tile is partial (with an exact mask).
BARACUDA_HOST_DEVICE inline bool element_visible(const BlockSparseAttentionArgs& a, int64_t b,
                                                 int64_t h, int64_t i, int64_t j) {
  if (a.q_documents != nullptr && a.q_documents[b * a.q_documents_stride + i] !=
                                      a.kv_documents[b * a.kv_documents_stride + j]) {
    return false;
  }
  if (a.partial_index == nullptr) return true;
  const int64_t qb = i / a.block_q, kb = j / a.block_k;
  const int64_t* st = a.partial_index_strides;
  const int32_t slot = a.partial_index[b * st[0] + h * st[1] + qb * st[2] + kb * st[3]];
  if (slot < 0) return true;
  const int64_t c = j - kb * a.block_k;
  const uint32_t word =
      a.partial_bits[(slot * a.block_q + (i - qb * a.block_q)) * a.bit_words + c / 32];
  return ((word >> (c % 32)) & 1u) != 0;
}

// The mask row of query block qb of head h in batch b.
BARACUDA_HOST_DEVICE inline const uint8_t* mask_row(const BlockSparseAttentionArgs& a, int64_t b,
                                                    int64_t h, int64_t qb) {
  return a.mask + b * a.mask_strides[0] + h * a.mask_strides[1] + qb * a.mask_strides[2];
}

BARACUDA_HOST_DEVICE inline bool key_block_on(const BlockSparseAttentionArgs& a,
                                              const uint8_t* row, int64_t kb) {
  return row[kb * a.mask_strides[3]] != 0;
}

// Calls fn(j_begin, j_end) for runs of keys [j_begin, j_end) that together
// are the keys visible to query row i of head h in batch b, in increasing
// order: the keys of its mask row's blocks that are on, inside its position
// range, that element_visible keeps. Without per-element tests a run is a
// block's whole share of the range, so a walker that skips keys (the split
// warps of the generic kernel) does not test them one by one.
template <typename Fn>
BARACUDA_HOST_DEVICE inline void for_each_visible_run(const BlockSparseAttentionArgs& a,
                                                      int64_t b, int64_t h, int64_t i, Fn&& fn) {
  const uint8_t* row = mask_row(a, b, h, i / a.block_q);
  const bool per_element = element_tests(a) != kTestsNone;
  int64_t lo, hi;
  visible_key_range(a, b, i, lo, hi);
  for (int64_t kb = lo / a.block_k; kb * a.block_k < hi; ++kb) {
    if (!key_block_on(a, row, kb)) continue;
    const int64_t j_begin = lo > kb * a.block_k ? lo : kb * a.block_k;
    const int64_t j_end = hi < (kb + 1) * a.block_k ? hi : (kb + 1) * a.block_k;
    if (!per_element) {
      fn(j_begin, j_end);
      continue;
    }
    int64_t run = j_begin;  // the first key of the run being gathered
    for (int64_t j = j_begin; j < j_end; ++j) {
      if (element_visible(a, b, h, i, j)) continue;
      if (j > run) fn(run, j);
      run = j + 1;
    }
    if (j_end > run) fn(run, j_end);
  }
}

// Calls fn(j) for every key j visible to query row i of head h in batch b,
// in increasing order (for_each_visible_run's keys, one at a time).
template <typename Fn>
BARACUDA_HOST_DEVICE inline void for_each_visible_key(const BlockSparseAttentionArgs& a, int64_t b,
                                                      int64_t h, int64_t i, Fn&& fn) {
  for_each_visible_run(a, b, h, i, [&](int64_t j_begin, int64_t j_end) {
    for (int64_t j = j_begin; j < j_end; ++j) fn(j);
  });
}

}  // namespace baracuda
