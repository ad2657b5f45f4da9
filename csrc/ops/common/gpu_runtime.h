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

#if defined(PADDLE_EXT_GPU_HIP)
using Stream = hipStream_t;
using Error = hipError_t;
inline constexpr Error kSuccess = hipSuccess;
inline constexpr const char* kPlatform = "hip";

inline const char* error_name(Error e) { return hipGetErrorName(e); }
inline const char* error_string(Error e) { return hipGetErrorString(e); }
inline Error get_last_error() { return hipGetLastError(); }
inline Error device_count(int* n) { return hipGetDeviceCount(n); }
inline Error get_device(int* device) { return hipGetDevice(device); }
inline Error set_device(int device) { return hipSetDevice(device); }
inline Error device_name(int device, std::string* name) {
  hipDeviceProp_t prop;
  const Error e = hipGetDeviceProperties(&prop, device);
  if (e == kSuccess) name->assign(prop.name);
  return e;
}
inline Error memory_pools_supported(int device, int* value) {
  return hipDeviceGetAttribute(value, hipDeviceAttributeMemoryPoolsSupported, device);
}
inline Error malloc_device(void** ptr, size_t bytes) { return hipMalloc(ptr, bytes); }
inline Error free_device(void* ptr) { return hipFree(ptr); }
inline Error malloc_async(void** ptr, size_t bytes, Stream s) { return hipMallocAsync(ptr, bytes, s); }
inline Error free_async(void* ptr, Stream s) { return hipFreeAsync(ptr, s); }
inline Error memset_async(void* ptr, int value, size_t bytes, Stream s) {
  return hipMemsetAsync(ptr, value, bytes, s);
}
inline Error memcpy_to_host_async(void* dst, const void* src, size_t bytes, Stream s) {
  return hipMemcpyAsync(dst, src, bytes, hipMemcpyDeviceToHost, s);
}
inline Error memcpy_to_device_async(void* dst, const void* src, size_t bytes, Stream s) {
  return hipMemcpyAsync(dst, src, bytes, hipMemcpyHostToDevice, s);
}
inline Error stream_synchronize(Stream s) { return hipStreamSynchronize(s); }
#else
using Stream = cudaStream_t;
using Error = cudaError_t;
inline constexpr Error kSuccess = cudaSuccess;
inline constexpr const char* kPlatform = "cuda";

inline const char* error_name(Error e) { return cudaGetErrorName(e); }
inline const char* error_string(Error e) { return cudaGetErrorString(e); }
inline Error get_last_error() { return cudaGetLastError(); }
inline Error device_count(int* n) { return cudaGetDeviceCount(n); }
inline Error get_device(int* device) { return cudaGetDevice(device); }
inline Error set_device(int device) { return cudaSetDevice(device); }
inline Error device_name(int device, std::string* name) {
  cudaDeviceProp prop;
  const Error e = cudaGetDeviceProperties(&prop, device);
  if (e == kSuccess) name->assign(prop.name);
  return e;
}
inline Error memory_pools_supported(int device, int* value) {
  return cudaDeviceGetAttribute(value, cudaDevAttrMemoryPoolsSupported, device);
}
inline Error malloc_device(void** ptr, size_t bytes) { return cudaMalloc(ptr, bytes); }
inline Error free_device(void* ptr) { return cudaFree(ptr); }
inline Error malloc_async(void** ptr, size_t bytes, Stream s) { return cudaMallocAsync(ptr, bytes, s); }
inline Error free_async(void* ptr, Stream s) { return cudaFreeAsync(ptr, s); }
inline Error memset_async(void* ptr, int value, size_t bytes, Stream s) {
  return cudaMemsetAsync(ptr, value, bytes, s);
}
inline Error memcpy_to_host_async(void* dst, const void* src, size_t bytes, Stream s) {
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s);
}
inline Error memcpy_to_device_async(void* dst, const void* src, size_t bytes, Stream s) {
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s);
}
inline Error stream_synchronize(Stream s) { return cudaStreamSynchronize(s); }
#endif

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
