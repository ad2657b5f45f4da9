// See flash_attn_tc_emulated.h. A plain C++ translation unit (g++): the
// emulator's primitives first, then the kernels exactly as nvcc compiles them.
#include "flash_attn_tc_emulated.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "warp_emulator.h"
// (after the emulator, which defines the primitives the kernels call)
#include "gpu/flash_attn_tc_kernels.cuh"

namespace gpu_check {
namespace tc = paddle_ext::flash_attn::tc;

namespace {

struct EmulatedLauncher {
  template <class... Params, class... Args>
  void operator()(void (*kernel)(Params...), tc::Grid g, int smem, Args... args) const {
    tc::emu::launch(g.x, g.y, g.z, tc::kThreads, smem, [&] { kernel(args...); });
  }
};

}  // namespace

bool tc_kernels_take(const paddle_ext::flash_attn::Problem& p) {
  return p.kind != paddle_ext::DType::kFloat32 && p.startend == nullptr && tc::smem_bytes_needed(p.head_dim) > 0;
}

void tc_emulated_forward(const paddle_ext::flash_attn::Problem& p, const void* q, const void* k, const void* v,
                         void* out, float* lse) {
  tc::run_forward(p, q, k, v, out, lse, EmulatedLauncher{});
}

void tc_emulated_backward(const paddle_ext::flash_attn::Problem& p, const void* q, const void* k, const void* v,
                          const void* out, const void* dout, const float* lse, void* dq, void* dk, void* dv,
                          bool deterministic) {
  const tc::DqMode mode = deterministic ? tc::DqMode::kDeterministic : tc::DqMode::kAtomic;
  std::vector<float> workspace(static_cast<size_t>(std::max<int64_t>(1, tc::backward_workspace_floats(p, mode))),
                               NAN);
  tc::run_backward(p, q, k, v, out, dout, lse, dq, dk, dv, workspace.data(), mode, EmulatedLauncher{});
}

}  // namespace gpu_check
