// C entry points over the flash-attention GPU kernels, built by
// tests/gpu/device_check.sh into libpaddle_ext_gpu_kernels.so, for
// bench/flash_attn_gpu.py to call through ctypes on PyTorch's tensors
// and stream (no Paddle, no torch extension to compile). Padded layout
// [B, S, H, D], lse [B, Hq, Sq]. Every call returns 0, or 1 with the error's
// text in `error` (a C++ exception never crosses into Python).
#include <cstdint>
#include <cstdio>
#include <exception>

#include "kernel_calls.h"

extern "C" {

// Mirrored by flash_attn_gpu.FlashArgs (checked there against pe_flash_args_size()).
struct PeFlashArgs {
  int32_t kind;  // 0 float32, 1 float16, 2 bfloat16 (paddle_ext::DType)
  int32_t causal;
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_k, head_dim;
  float dropout;
  uint64_t seed, offset;
};

int64_t pe_flash_args_size() { return static_cast<int64_t>(sizeof(PeFlashArgs)); }
const char* pe_kernels_platform() { return paddle_ext::gpu::kPlatform; }

}  // extern "C"

namespace {

gpu_check::FlashShape shape_of(const PeFlashArgs& a) {
  gpu_check::FlashShape s = gpu_check::flash_shape(static_cast<paddle_ext::DType>(a.kind), a.batch, a.seqlen_q,
                                                   a.seqlen_k, a.heads_q, a.heads_k, a.head_dim, a.causal != 0,
                                                   a.dropout);
  s.seed = a.seed;
  s.offset = a.offset;
  return s;
}

template <class F>
int guarded(char* error, size_t error_len, F&& body) {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    if (error != nullptr && error_len > 0) std::snprintf(error, error_len, "%s", e.what());
  } catch (...) {
    if (error != nullptr && error_len > 0) std::snprintf(error, error_len, "unknown C++ exception");
  }
  return 1;
}

}  // namespace

extern "C" {

int64_t pe_flash_backward_workspace_bytes(const PeFlashArgs* a) {
  return gpu_check::flash_backward_workspace_bytes(gpu_check::make_problem(shape_of(*a), nullptr, nullptr));
}

int pe_flash_forward(const PeFlashArgs* a, const void* q, const void* k, const void* v, void* out, float* lse,
                     void* stream, char* error, size_t error_len) {
  return guarded(error, error_len, [&] {
    const auto p = gpu_check::make_problem(shape_of(*a), nullptr, nullptr);
    gpu_check::flash_forward_gpu(p, q, k, v, out, lse, stream);
  });
}

int pe_flash_backward(const PeFlashArgs* a, const void* q, const void* k, const void* v, const void* out,
                      const void* dout, const float* lse, void* dq, void* dk, void* dv, void* workspace, void* stream,
                      char* error, size_t error_len) {
  return guarded(error, error_len, [&] {
    const auto p = gpu_check::make_problem(shape_of(*a), nullptr, nullptr);
    gpu_check::flash_backward_gpu(p, q, k, v, out, dout, lse, dq, dk, dv, workspace, stream);
  });
}

}  // extern "C"
