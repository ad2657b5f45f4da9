// The CUDA backend: cudaHostAlloc'd pinned memory and cudaEvent events. Host
// code only (compiled by the C++ compiler against cuda_runtime.h, linked with
// cudart_static); built into _C where CMake finds a CUDA toolkit and by the
// cuda compile leg.
#include <cuda_runtime.h>

#include "backends/gpu_backend.h"
#include "core/registry.h"

namespace paddle_ext::runtime {
namespace {

struct CudaRuntime {
  using Error = cudaError_t;
  using Event = cudaEvent_t;
  using StreamT = cudaStream_t;
  static constexpr const char* kName = "cuda";
  static constexpr Error kSuccess = cudaSuccess;
  static constexpr Error kNotReady = cudaErrorNotReady;
  static constexpr Error kOutOfMemory = cudaErrorMemoryAllocation;
  static constexpr unsigned kDisableTiming = cudaEventDisableTiming;
  static constexpr unsigned kBlockingSync = cudaEventBlockingSync;
  static constexpr unsigned kInterprocess = cudaEventInterprocess;

  static const char* error_name(Error e) { return cudaGetErrorName(e); }
  static const char* error_string(Error e) { return cudaGetErrorString(e); }
  static Error get_last_error() { return cudaGetLastError(); }
  static Error device_count(int* n) { return cudaGetDeviceCount(n); }
  static Error get_device(int* d) { return cudaGetDevice(d); }
  static Error set_device(int d) { return cudaSetDevice(d); }
  // Portable: usable by every device of the process, as Paddle's pinned memory is.
  static Error host_alloc(void** p, size_t n) { return cudaHostAlloc(p, n, cudaHostAllocPortable); }
  static Error host_free(void* p) { return cudaFreeHost(p); }
  static Error device_synchronize() { return cudaDeviceSynchronize(); }
  static Error event_create(Event* e, unsigned flags) { return cudaEventCreateWithFlags(e, flags); }
  static Error event_record(Event e, StreamT s) { return cudaEventRecord(e, s); }
  static Error event_query(Event e) { return cudaEventQuery(e); }
  static Error event_synchronize(Event e) { return cudaEventSynchronize(e); }
  static Error stream_wait_event(StreamT s, Event e) { return cudaStreamWaitEvent(s, e, 0); }
  static Error event_elapsed(float* ms, Event a, Event b) { return cudaEventElapsedTime(ms, a, b); }
  static Error event_destroy(Event e) { return cudaEventDestroy(e); }
};

const Registrar registrar({"cuda", 3,
                           [] { return std::static_pointer_cast<HostBackend>(std::make_shared<gpu::HostBackendImpl<CudaRuntime>>()); },
                           [] { return gpu::EventBackendImpl<CudaRuntime>::instance(); },
                           [] { return gpu::unavailable<CudaRuntime>(); }});

}  // namespace
}  // namespace paddle_ext::runtime
