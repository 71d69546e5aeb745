// merge_state_ under autograd. The in-place merge is not differentiable (its
// backward would need the states it overwrites; merge_state is the
// differentiable form), and without a kernel here autograd let it through:
// v and s kept their old history, whose gradient was then silently wrong.
// A call that would join a graph is refused before anything is written, and
// the version counters of v and s are bumped at ADInplaceOrView, as torch's
// own in-place ops do, so tensors saved before the merge are checked.
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <c10/util/string_view.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>

#include <string>

#include "common/op_handle.h"

namespace baracuda {
namespace {

using MergeInPlaceFn = void(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, c10::string_view);

const c10::TypedOperatorHandle<MergeInPlaceFn>& merge_state_op() {
  static const auto op = find_op<MergeInPlaceFn>("baracuda::merge_state_");
  return op;
}

void merge_state_autograd(const at::Tensor& v, const at::Tensor& s, const at::Tensor& v_other,
                          const at::Tensor& s_other, c10::string_view lse_base) {
  if (c10::GradMode::is_enabled()) {
    std::string needing_grad;
    const char* const names[] = {"v", "s", "v_other", "s_other"};
    const at::Tensor* const inputs[] = {&v, &s, &v_other, &s_other};
    for (int i = 0; i < 4; ++i) {
      if (!inputs[i]->requires_grad()) continue;
      needing_grad += needing_grad.empty() ? names[i] : std::string(", ") + names[i];
    }
    TORCH_CHECK(needing_grad.empty(), "baracuda::merge_state_: the in-place merge is not "
                "differentiable, but ", needing_grad, " requires grad; use merge_state, or "
                "call it under torch.no_grad()");
  }
  at::AutoDispatchBelowAutograd below;
  merge_state_op().call(v, s, v_other, s_other, lse_base);
}

void merge_state_bump_versions(const at::Tensor& v, const at::Tensor& s,
                               const at::Tensor& v_other, const at::Tensor& s_other,
                               c10::string_view lse_base) {
  {
    at::AutoDispatchBelowADInplaceOrView below;
    merge_state_op().call(v, s, v_other, s_other, lse_base);
  }
  torch::autograd::increment_version(v);
  torch::autograd::increment_version(s);
}

}  // namespace

TORCH_LIBRARY_IMPL(baracuda, Autograd, m) {
  m.impl("merge_state_", &merge_state_autograd);
}

TORCH_LIBRARY_IMPL(baracuda, ADInplaceOrView, m) {
  m.impl("merge_state_", &merge_state_bump_versions);
}

}  // namespace baracuda
