// A typed handle of a registered op by name, for C++ code that calls the
// ops through the dispatcher (so that autograd and every other key see the
// call): the families' autograd kernels.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace baracuda {

template <typename Fn>
c10::TypedOperatorHandle<Fn> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Fn>();
}

}  // namespace baracuda
