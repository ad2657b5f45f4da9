// The CUDA backend: cudaHostAlloc'd pinned memory and cudaEvent events. Host
// code only (compiled by the C++ compiler against cuda_runtime.h, linked with
// cudart_static); built into _C where CMake finds a CUDA toolkit and by the
// cuda compile leg.
#include <cuda_runtime.h>

#include "backends/gpu_backend.h"
#include "core/registry.h"

namespace paddle_ext::runtime {
namespace {

// What CUDA spells unlike HIP; the rest of the traits: gpu_runtime_traits.inc.
struct CudaSpelling {
  static constexpr const char* kName = "cuda";
  static constexpr cudaError_t kOutOfMemory = cudaErrorMemoryAllocation;
  // Portable: usable by every device of the process, as Paddle's pinned memory is.
  static cudaError_t host_alloc(void** p, size_t n) { return cudaHostAlloc(p, n, cudaHostAllocPortable); }
  static cudaError_t host_free(void* p) { return cudaFreeHost(p); }
};

#define PE_GPU(name) cuda##name
#define PE_GPU_SPELLING CudaSpelling
#include "backends/gpu_runtime_traits.inc"

const Registrar registrar({"cuda", 3, gpu::host_backend<Runtime>, gpu::event_backend<Runtime>,
                           gpu::unavailable<Runtime>});

}  // namespace
}  // namespace paddle_ext::runtime
