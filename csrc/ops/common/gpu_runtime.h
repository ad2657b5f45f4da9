// The few GPU runtime calls the kernels and tools use, mapped to CUDA or HIP,
// so that one source serves both: nvcc / a host compiler with cuda_runtime.h,
// or hipcc (-x hip) / g++ -D__HIP_PLATFORM_AMD__ with hip_runtime.h.
// No Paddle header here or in any file that includes this one.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_runtime.h>
#define PADDLE_EXT_GPU_HIP 1
#else
#include <cuda_runtime.h>
#define PADDLE_EXT_GPU_CUDA 1
#endif

namespace paddle_ext::gpu {

// PE_GPU(Name): the runtime's spelling of Name (hipName or cudaName). The two
// APIs name nearly everything alike; the few exceptions are spelled out here.
#if defined(PADDLE_EXT_GPU_HIP)
#define PE_GPU(name) hip##name
using DeviceProp = hipDeviceProp_t;
inline constexpr auto kAttrMemoryPoolsSupported = hipDeviceAttributeMemoryPoolsSupported;
inline constexpr const char* kPlatform = "hip";
#else
#define PE_GPU(name) cuda##name
using DeviceProp = cudaDeviceProp;
inline constexpr auto kAttrMemoryPoolsSupported = cudaDevAttrMemoryPoolsSupported;
inline constexpr const char* kPlatform = "cuda";
#endif

using Stream = PE_GPU(Stream_t);
using Error = PE_GPU(Error_t);
inline constexpr Error kSuccess = PE_GPU(Success);

inline const char* error_name(Error e) { return PE_GPU(GetErrorName)(e); }
inline const char* error_string(Error e) { return PE_GPU(GetErrorString)(e); }
inline Error get_last_error() { return PE_GPU(GetLastError)(); }
inline Error device_count(int* n) { return PE_GPU(GetDeviceCount)(n); }
inline Error get_device(int* device) { return PE_GPU(GetDevice)(device); }
inline Error set_device(int device) { return PE_GPU(SetDevice)(device); }
inline Error device_name(int device, std::string* name) {
  DeviceProp prop;
  const Error e = PE_GPU(GetDeviceProperties)(&prop, device);
  if (e == kSuccess) name->assign(prop.name);
  return e;
}
inline Error memory_pools_supported(int device, int* value) {
  return PE_GPU(DeviceGetAttribute)(value, kAttrMemoryPoolsSupported, device);
}
inline Error malloc_device(void** ptr, size_t bytes) { return PE_GPU(Malloc)(ptr, bytes); }
inline Error free_device(void* ptr) { return PE_GPU(Free)(ptr); }
inline Error malloc_async(void** ptr, size_t bytes, Stream s) { return PE_GPU(MallocAsync)(ptr, bytes, s); }
inline Error free_async(void* ptr, Stream s) { return PE_GPU(FreeAsync)(ptr, s); }
inline Error memset_async(void* ptr, int value, size_t bytes, Stream s) {
  return PE_GPU(MemsetAsync)(ptr, value, bytes, s);
}
inline Error memcpy_to_host_async(void* dst, const void* src, size_t bytes, Stream s) {
  return PE_GPU(MemcpyAsync)(dst, src, bytes, PE_GPU(MemcpyDeviceToHost), s);
}
inline Error memcpy_to_device_async(void* dst, const void* src, size_t bytes, Stream s) {
  return PE_GPU(MemcpyAsync)(dst, src, bytes, PE_GPU(MemcpyHostToDevice), s);
}
inline Error stream_synchronize(Stream s) { return PE_GPU(StreamSynchronize)(s); }
#undef PE_GPU

// "cuda error cudaErrorNoDevice (100): no CUDA-capable device is detected"
inline std::string describe(Error e) {
  return std::string(kPlatform) + " error " + error_name(e) + " (" + std::to_string(static_cast<int>(e)) +
         "): " + error_string(e);
}

[[noreturn]] inline void throw_error(Error e, const char* expr, const char* file, int line) {
  throw std::runtime_error(describe(e) + " [" + expr + " at " + file + ":" + std::to_string(line) + "]");
}

}  // namespace paddle_ext::gpu

// Throws std::runtime_error naming the error, the call and the place.
#define PADDLE_EXT_GPU_CHECK(expr)                                                 \
  do {                                                                             \
    const ::paddle_ext::gpu::Error pe_gpu_err_ = (expr);                           \
    if (pe_gpu_err_ != ::paddle_ext::gpu::kSuccess)                                \
      ::paddle_ext::gpu::throw_error(pe_gpu_err_, #expr, __FILE__, __LINE__);      \
  } while (0)
