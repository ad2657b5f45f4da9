// The HIP (ROCm) backend: hipHostMalloc'd pinned memory and hipEvent events. Host
// code only (compiled by the C++ compiler with -D__HIP_PLATFORM_AMD__ against
// hip_runtime.h, linked with amdhip64); built into _C where CMake finds HIP
// and by the rocm compile leg.
#include <hip/hip_runtime.h>

#include "backends/gpu_backend.h"
#include "core/registry.h"

namespace paddle_ext::runtime {
namespace {

struct HipRuntime {
  using Error = hipError_t;
  using Event = hipEvent_t;
  using StreamT = hipStream_t;
  static constexpr const char* kName = "hip";
  static constexpr Error kSuccess = hipSuccess;
  static constexpr Error kNotReady = hipErrorNotReady;
  static constexpr Error kOutOfMemory = hipErrorOutOfMemory;
  static constexpr unsigned kDisableTiming = hipEventDisableTiming;
  static constexpr unsigned kBlockingSync = hipEventBlockingSync;
  static constexpr unsigned kInterprocess = hipEventInterprocess;

  static const char* error_name(Error e) { return hipGetErrorName(e); }
  static const char* error_string(Error e) { return hipGetErrorString(e); }
  static Error get_last_error() { return hipGetLastError(); }
  static Error device_count(int* n) { return hipGetDeviceCount(n); }
  static Error get_device(int* d) { return hipGetDevice(d); }
  static Error set_device(int d) { return hipSetDevice(d); }
  // Portable: usable by every device of the process, as Paddle's pinned memory is.
  static Error host_alloc(void** p, size_t n) { return hipHostMalloc(p, n, hipHostMallocPortable); }
  static Error host_free(void* p) { return hipHostFree(p); }
  static Error device_synchronize() { return hipDeviceSynchronize(); }
  static Error event_create(Event* e, unsigned flags) { return hipEventCreateWithFlags(e, flags); }
  static Error event_record(Event e, StreamT s) { return hipEventRecord(e, s); }
  static Error event_query(Event e) { return hipEventQuery(e); }
  static Error event_synchronize(Event e) { return hipEventSynchronize(e); }
  static Error stream_wait_event(StreamT s, Event e) { return hipStreamWaitEvent(s, e, 0); }
  static Error event_elapsed(float* ms, Event a, Event b) { return hipEventElapsedTime(ms, a, b); }
  static Error event_destroy(Event e) { return hipEventDestroy(e); }
};

const Registrar registrar({"hip", 4,
                           [] { return std::static_pointer_cast<HostBackend>(std::make_shared<gpu::HostBackendImpl<HipRuntime>>()); },
                           [] { return gpu::EventBackendImpl<HipRuntime>::instance(); },
                           [] { return gpu::unavailable<HipRuntime>(); }});

}  // namespace
}  // namespace paddle_ext::runtime
