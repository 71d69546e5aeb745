// How the op layer lays a call out for the tensor-core forward kernels
// (Hopper wgmma or mma.sync): the query heads of a key-head group packed
// into one tile when each head has few queries (decode), and the keys split
// across CTAs (flash-decoding) when the query tiles alone would leave SMs
// idle, the partial states then merged by the merge family's kernel.
#pragma once

#include <ATen/core/Tensor.h>

#include "block_sparse_attention/block_sparse_attention_kernels.h"
#include "common/status.h"

namespace baracuda {

// Runs the forward for `a` (built for q, out, lse as the op allocated them:
// out and lse contiguous) on the Hopper kernel (`hopper`) or the mma.sync
// one, on `stream`. Half types only; lse is float32.
KernelStatus run_tensor_core_forward(BlockSparseAttentionArgs a, bool hopper, const at::Tensor& q,
                                     const at::Tensor& out, const at::Tensor& lse, void* stream);

}  // namespace baracuda
