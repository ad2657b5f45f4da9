// CUDA launcher of the tensor-core flash-attention kernels
// (gpu/flash_attn_tc_kernels.cuh) behind gpu/flash_attn_tc.h. CUDA only: under
// hipcc this file compiles to nothing and gpu/flash_attn.cu keeps every call.
#include "common/gpu_runtime.h"

#if defined(PADDLE_EXT_GPU_CUDA)
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "gpu/flash_attn_tc.h"
#include "gpu/warp_mma.cuh"
#include "gpu/flash_attn_tc_kernels.cuh"

namespace paddle_ext::flash_attn::tc {
namespace {

constexpr int kMaxDevices = 64;

// Compute capability (major * 10 + minor) and opt-in shared memory per block
// of a device, read once.
struct DeviceInfo {
  int arch = -1;
  int smem_optin = 0;
};

const DeviceInfo& device_info(int device) {
  static DeviceInfo info[kMaxDevices];
  DeviceInfo& d = info[device];
  if (d.arch < 0) {
    int major = 0, minor = 0, smem = 0;
    PADDLE_EXT_GPU_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    PADDLE_EXT_GPU_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    PADDLE_EXT_GPU_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    d.smem_optin = smem;
    d.arch = major * 10 + minor;
  }
  return d;
}

bool env_is(const char* name, std::initializer_list<const char*> values) {
  const char* value = std::getenv(name);
  if (value == nullptr) return false;
  for (const char* v : values)
    if (std::strcmp(value, v) == 0) return true;
  return false;
}

bool forced_simple() { return env_is("PADDLE_EXT_FLASH_ATTN_GPU_KERNEL", {"simple"}); }

DqMode dq_mode() {
  const bool deterministic = env_is("PADDLE_EXT_FLASH_ATTN_GPU_KERNEL", {"deterministic"}) ||
                             env_is("FLAGS_cudnn_deterministic", {"1", "true", "True", "TRUE"});
  return deterministic ? DqMode::kDeterministic : DqMode::kAtomic;
}

// Launches on `stream`, raising the kernel's dynamic shared memory limit first.
struct Launcher {
  cudaStream_t stream;
  template <class... Params, class... Args>
  void operator()(void (*kernel)(Params...), Grid g, int smem, Args... args) const {
    if (smem > 48 * 1024) {
      PADDLE_EXT_GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    }
    kernel<<<dim3(static_cast<unsigned>(g.x), static_cast<unsigned>(g.y), static_cast<unsigned>(g.z)), kThreads,
             smem, stream>>>(args...);
    PADDLE_EXT_GPU_CHECK(cudaGetLastError());
  }
};

}  // namespace

bool takes(const Problem& p, std::initializer_list<const void*> tensors) {
  if (p.kind == DType::kFloat32 || p.startend != nullptr || forced_simple()) return false;
  const int need = smem_bytes_needed(p.head_dim);
  if (need == 0) return false;
  for (const void* t : tensors)
    if (reinterpret_cast<uintptr_t>(t) % 16 != 0) return false;
  int device = 0;
  PADDLE_EXT_GPU_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) return false;
  const DeviceInfo& d = device_info(device);
  return d.arch >= 80 && d.smem_optin >= need;
}

void forward(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse, void* stream) {
  run_forward(p, q, k, v, out, lse, Launcher{static_cast<cudaStream_t>(stream)});
}

int64_t backward_workspace_bytes(const Problem& p) {
  if (p.kind == DType::kFloat32 || smem_bytes_needed(p.head_dim) == 0) return 0;
  return backward_workspace_floats(p, DqMode::kAtomic) * static_cast<int64_t>(sizeof(float));
}

void backward(const Problem& p, const void* q, const void* k, const void* v, const void* out, const void* dout,
              const float* lse, void* dq, void* dk, void* dv, void* workspace, void* stream) {
  run_backward(p, q, k, v, out, dout, lse, dq, dk, dv, workspace, dq_mode(),
               Launcher{static_cast<cudaStream_t>(stream)});
}

}  // namespace paddle_ext::flash_attn::tc
#endif  // PADDLE_EXT_GPU_CUDA
