// Every schema of the baracuda namespace, in one place, so the op surface can
// be read at a glance. Implementations register per family and backend in
// kernels/<family>/*_op.cpp; fake kernels and autograd live in Python, but for
// the scans' autograd (kernels/scan/scan_autograd.cpp).
#include <Python.h>
#include <torch/library.h>

extern "C" {
// `import baracuda_torch._C` loads this library and so runs the registrations
// below; the module itself is empty (the ops live in torch.ops.baracuda).
PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
}

// The element conditions of block-sparse attention, last in each of its ops.
#define ELEMENT_ARGUMENTS                                                              \
  "str causal_align=\"top_left\", SymInt? window_left=None, SymInt? window_right=None, " \
  "Tensor? q_document_ids=None, Tensor? kv_document_ids=None, Tensor? partial_index=None, " \
  "Tensor? partial_bits=None, Tensor? kv_lens=None"

TORCH_LIBRARY(baracuda, m) {
  // ---- write_slice: dest[ranges] = source, bit-exact, any dtype ----
  // ranges is flat: (start_0, end_0, start_1, end_1, ...), one pair per axis.
  m.def("write_slice_(Tensor(a!) dest, Tensor source, SymInt[] ranges, "
        "bool packed_int4=False) -> ()",
        {at::Tag::pt2_compliant_tag});
  m.def("write_slice(Tensor dest, Tensor source, SymInt[] ranges, "
        "bool packed_int4=False) -> Tensor",
        {at::Tag::pt2_compliant_tag});
  m.def("write_slice_at_(Tensor(a!) dest, Tensor source, int dim, Tensor offsets, "
        "bool packed_int4=False) -> ()",
        {at::Tag::pt2_compliant_tag});
  // Which path write_slice_ would take for these arguments (for tests and tuning).
  m.def("write_slice_path(Tensor dest, Tensor source, SymInt[] ranges, "
        "bool packed_int4=False) -> str");

  // ---- attention-state merge: (v, lse) pairs, empty state (0, -inf) neutral ----
  // lse_base "2" (base-2 LSE) or "e" (natural log).
  m.def("merge_state(Tensor v_a, Tensor s_a, Tensor v_b, Tensor s_b, str lse_base=\"2\") "
        "-> (Tensor, Tensor)",
        {at::Tag::pt2_compliant_tag});
  m.def("merge_state_(Tensor(a!) v, Tensor(b!) s, Tensor v_other, Tensor s_other, "
        "str lse_base=\"2\") -> ()",
        {at::Tag::pt2_compliant_tag});
  m.def("merge_states(Tensor v, Tensor s, str lse_base=\"2\") -> (Tensor, Tensor)",
        {at::Tag::pt2_compliant_tag});
  m.def("merge_state_backward(Tensor grad_v, Tensor? grad_s, Tensor v_a, Tensor s_a, "
        "Tensor v_b, Tensor s_b, str lse_base) -> (Tensor, Tensor, Tensor, Tensor)",
        {at::Tag::pt2_compliant_tag});
  m.def("merge_states_backward(Tensor grad_v, Tensor? grad_s, Tensor v, Tensor s, "
        "str lse_base) -> (Tensor, Tensor)",
        {at::Tag::pt2_compliant_tag});

  // ---- block-sparse attention: only the key blocks the mask keeps ----
  // block_mask: bool/uint8 [B or 1, H or 1, ceil(Lq/block_q), ceil(Lk/block_k)]
  // (or its last two axes flattened). scale=None: 1/sqrt(head_dim). Returns
  // (out [B, H, Lq, Dv], lse [B, H, Lq], natural log).
  // Element conditions, ANDed with the mask: causal_align "top_left" (query i
  // at key position i) or "bottom_right" (at i + Lk - Lq); window_left /
  // window_right: keys within that many positions before / after the query's
  // (None: no limit); document ids [B or 1, Lq] and [B or 1, Lk], int32 or
  // int64, both or neither: only keys of the query's document; partial_index
  // and partial_bits (masks.ExactMask): a bit per element of the mask's
  // partial tiles; kv_lens [B], int32 or int64: batch b sees keys
  // [0, kv_lens[b]) of a preallocated cache (bottom_right aligns to them).
  m.def("block_sparse_attention(Tensor q, Tensor k, Tensor v, Tensor block_mask, int block_q, "
        "int block_k, float? scale=None, bool is_causal=False, " ELEMENT_ARGUMENTS
        ") -> (Tensor, Tensor)",
        {at::Tag::pt2_compliant_tag});
  // Its gradients with respect to q, k and v, from the forward's arguments
  // and its saved out and lse. grad_out None: zeros (only lse was used);
  // grad_lse None: no lse term. Deterministic.
  m.def("block_sparse_attention_backward(Tensor? grad_out, Tensor? grad_lse, Tensor q, "
        "Tensor k, Tensor v, Tensor out, Tensor lse, Tensor block_mask, int block_q, "
        "int block_k, float? scale=None, bool is_causal=False, " ELEMENT_ARGUMENTS
        ") -> (Tensor, Tensor, Tensor)",
        {at::Tag::pt2_compliant_tag});
  // Which executor block_sparse_attention takes for these arguments (for tests).
  m.def("block_sparse_attention_path(Tensor q, Tensor k, Tensor v, Tensor block_mask, "
        "int block_q, int block_k, float? scale=None, bool is_causal=False, " ELEMENT_ARGUMENTS
        ") -> str");

  // ---- scans along one axis: cumsum, cumprod, logcumsumexp, cummax, cummin ----
  // torch semantics; reverse=True scans from the last element to the first
  // (indices stay in the original coordinates). dtype: as torch.cumsum's
  // (x cast to it first; integer and bool x give int64 without it).
  m.def("cumsum(Tensor x, int dim, bool reverse=False, ScalarType? dtype=None) -> Tensor",
        {at::Tag::pt2_compliant_tag});
  m.def("cumprod(Tensor x, int dim, bool reverse=False, ScalarType? dtype=None) -> Tensor",
        {at::Tag::pt2_compliant_tag});
  m.def("logcumsumexp(Tensor x, int dim, bool reverse=False) -> Tensor",
        {at::Tag::pt2_compliant_tag});
  m.def("cummax(Tensor x, int dim, bool reverse=False) -> (Tensor values, Tensor indices)",
        {at::Tag::pt2_compliant_tag});
  m.def("cummin(Tensor x, int dim, bool reverse=False) -> (Tensor values, Tensor indices)",
        {at::Tag::pt2_compliant_tag});
  // One backward for every kind ("cumsum", ..., "cummin"); x, y: the saved
  // forward input and output (cumprod, logcumsumexp), indices: cummax/cummin's.
  m.def("scan_backward(Tensor grad, Tensor? x, Tensor? y, Tensor? indices, int dim, "
        "str kind, bool reverse) -> Tensor",
        {at::Tag::pt2_compliant_tag});
  // The linear recurrence h_t = a_t h_{t-1} + b_t along dim (h_{-1} = h0, or
  // zero), and its backward: (da, db) from the gradient of h and the saved
  // a and h.
  m.def("linear_scan(Tensor a, Tensor b, int dim, bool reverse=False, Tensor? h0=None) "
        "-> Tensor",
        {at::Tag::pt2_compliant_tag});
  m.def("linear_scan_backward(Tensor grad, Tensor a, Tensor h, Tensor? h0, int dim, "
        "bool reverse) -> (Tensor, Tensor)",
        {at::Tag::pt2_compliant_tag});
  // Which CUDA path a scan of x along dim takes (for tests and tuning).
  m.def("scan_path(Tensor x, int dim, str? kind=None, *, bool backward=False, "
        "bool reverse=False, ScalarType? dtype=None) -> str");
  // For tests: leaves marks_left fresh marks to the standing slots of the
  // current stream of like's device, so that the wrap, which otherwise takes
  // 2^32 - 1 calls on one stream, comes after marks_left calls. Returns how
  // many of the stream's buffers it found.
  m.def("_scan_standing_marks_left(Tensor like, int marks_left) -> int");

  // ---- fractional max pooling, 2-D and 3-D (len(kernel_size) spatial axes) ----
  // x: [C, spatial...] or [N, C, spatial...]; samples [N (1 unbatched), C, dims]
  // in x's dtype or float32. placement "torch" (PyTorch's windows) or "even".
  // Returns (out, indices), indices flat within each (n, c) plane.
  m.def("fractional_max_pool(Tensor x, int[] kernel_size, SymInt[] output_size, Tensor samples, "
        "str placement=\"torch\") -> (Tensor, Tensor)",
        {at::Tag::pt2_compliant_tag});
  // Deterministic gradient of the above (a gather, no atomics); input_size: x's shape.
  m.def("fractional_max_pool_backward(Tensor grad_out, Tensor indices, Tensor samples, "
        "SymInt[] input_size, int[] kernel_size, str placement=\"torch\") -> Tensor",
        {at::Tag::pt2_compliant_tag});
}
