// Status returned by every launcher. Kernels live in files that include no
// torch headers, so they cannot throw torch errors themselves; the op layer
// turns a non-success status into a TORCH_CHECK failure that names the op.
#pragma once

namespace baracuda {

enum class StatusCode : int {
  kSuccess = 0,
  kInvalidArgument = 1,  // the launcher was handed a problem it cannot run
  kLaunchFailed = 2,     // the CUDA runtime reported an error
};

struct KernelStatus {
  StatusCode code;
  // Static string with the reason (for CUDA errors, cudaGetErrorString's text).
  const char* detail;

  static constexpr KernelStatus ok() { return {StatusCode::kSuccess, ""}; }
  static constexpr KernelStatus invalid(const char* why) {
    return {StatusCode::kInvalidArgument, why};
  }
  constexpr bool is_ok() const { return code == StatusCode::kSuccess; }
};

}  // namespace baracuda
