// The HIP (ROCm) backend: hipHostMalloc'd pinned memory and hipEvent events. Host
// code only (compiled by the C++ compiler with -D__HIP_PLATFORM_AMD__ against
// hip_runtime.h, linked with amdhip64); built into _C where CMake finds HIP
// and by the rocm compile leg.
#include <hip/hip_runtime.h>

#include "backends/gpu_backend.h"
#include "core/registry.h"

namespace paddle_ext::runtime {
namespace {

// What HIP spells unlike CUDA; the rest of the traits: gpu_runtime_traits.inc.
struct HipSpelling {
  static constexpr const char* kName = "hip";
  static constexpr hipError_t kOutOfMemory = hipErrorOutOfMemory;
  // Portable: usable by every device of the process, as Paddle's pinned memory is.
  static hipError_t host_alloc(void** p, size_t n) { return hipHostMalloc(p, n, hipHostMallocPortable); }
  static hipError_t host_free(void* p) { return hipHostFree(p); }
};

#define PE_GPU(name) hip##name
#define PE_GPU_SPELLING HipSpelling
#include "backends/gpu_runtime_traits.inc"

const Registrar registrar({"hip", 4, gpu::host_backend<Runtime>, gpu::event_backend<Runtime>,
                           gpu::unavailable<Runtime>});

}  // namespace
}  // namespace paddle_ext::runtime
