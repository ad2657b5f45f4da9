// The kernels' one element-type enum (DType) and one load / store trait set
// (DTypeIo), for every op and backend: CPU, CUDA and HIP. An op that takes
// fewer dtypes (flash attention, rms_norm: no float64) still names them here;
// its Paddle registration refuses the others (common/tensor_kind.h).
//
// Conversions are common/half.h's, so every kernel rounds the same way; on the
// host float16 goes through common/half_simd.h's branch-free versions (bit for
// bit the same results but for signalling NaNs, which load quiet) so loops
// over elements vectorise, on a device through half.h's own.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "common/half.h"
#include "common/half_simd.h"

namespace paddle_ext {

// The order is part of the ABI of tests/gpu/kernels_capi.cc (0 float32,
// 1 float16, 2 bfloat16): append, never reorder.
enum class DType { kFloat32, kFloat16, kBFloat16, kFloat64 };

PADDLE_EXT_HOST_DEVICE inline int64_t dtype_bytes(DType t) {
  return t == DType::kFloat64 ? 8 : t == DType::kFloat32 ? 4 : 2;
}

// half.h's float16 conversion `name` in device code, its branch-free twin
// from half_simd.h (name##_branchless) on the host.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define PADDLE_EXT_FP16(name) name
#else
#define PADDLE_EXT_FP16(name) name##_branchless
#endif

// Storage: the element as it lies in memory. Value: what load gives and store
// takes, float for every dtype but float64 (double); an op that computes
// wider (rotary: double for float32) converts the Value itself.
template <DType K>
struct DTypeIo {
  static constexpr DType kDType = K;
  using Storage = std::conditional_t<K == DType::kFloat64, double,
                                     std::conditional_t<K == DType::kFloat32, float, uint16_t>>;
  using Value = std::conditional_t<K == DType::kFloat64, double, float>;

  PADDLE_EXT_HOST_DEVICE static Value load(Storage v) {
    if constexpr (K == DType::kBFloat16) return bf16_to_float(v);
    else if constexpr (K == DType::kFloat16) return PADDLE_EXT_FP16(fp16_to_float)(v);
    else return v;
  }

  PADDLE_EXT_HOST_DEVICE static Storage store(Value v) {
    if constexpr (K == DType::kBFloat16) return float_to_bf16(v);
    else if constexpr (K == DType::kFloat16) return PADDLE_EXT_FP16(float_to_fp16)(v);
    else return v;
  }
};

// nvcc checks that a __host__ __device__ template calls no host-only function
// even in instantiations only host code uses (with_dtype's host lambdas);
// clang's HIP diagnoses only what device code really calls.
#if defined(__CUDACC__) && !defined(__clang__)
#define PADDLE_EXT_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#define PADDLE_EXT_EXEC_CHECK_DISABLE
#endif

// fn(DTypeIo<K>{}) for the K that `t` names, on host and device: the one
// switch from a run-time dtype to typed code. Without kWithFloat64 (ops that
// take only float32, float16 and bfloat16) fn is not built for float64; what
// is neither float16 nor bfloat16 (nor float64) counts as float32.
PADDLE_EXT_EXEC_CHECK_DISABLE
template <bool kWithFloat64 = true, class Fn>
PADDLE_EXT_HOST_DEVICE inline decltype(auto) visit_dtype(DType t, Fn&& fn) {
  if (t == DType::kFloat16) return fn(DTypeIo<DType::kFloat16>{});
  if (t == DType::kBFloat16) return fn(DTypeIo<DType::kBFloat16>{});
  if constexpr (kWithFloat64) {
    if (t == DType::kFloat64) return fn(DTypeIo<DType::kFloat64>{});
  }
  return fn(DTypeIo<DType::kFloat32>{});
}

// visit_dtype for the host's typed kernels, which refuse a dtype they do not
// take instead of reading it as float32.
template <bool kWithFloat64 = true, class Fn>
decltype(auto) with_dtype(DType t, Fn&& fn) {
  const int value = static_cast<int>(t);
  if (value < 0 || value > static_cast<int>(DType::kFloat64) || (!kWithFloat64 && t == DType::kFloat64)) {
    throw std::invalid_argument("paddle_ext: unsupported DType " + std::to_string(value));
  }
  return visit_dtype<kWithFloat64>(t, fn);
}

// Element i of an array of `t`, as float (float64 rounded to float): for
// kernels that switch per element. The two 16-bit dtypes share one load, the
// code the GPU flash-attention kernels were tuned with.
template <bool kWithFloat64 = true>
PADDLE_EXT_HOST_DEVICE inline float load_float(DType t, const void* base, int64_t i) {
  if (t == DType::kFloat32) return static_cast<const float*>(base)[i];
  if (kWithFloat64 && t == DType::kFloat64) return static_cast<float>(static_cast<const double*>(base)[i]);
  const uint16_t h = static_cast<const uint16_t*>(base)[i];
  return t == DType::kFloat16 ? DTypeIo<DType::kFloat16>::load(h) : DTypeIo<DType::kBFloat16>::load(h);
}

// v rounded to `t` into element i.
template <bool kWithFloat64 = true>
PADDLE_EXT_HOST_DEVICE inline void store_float(DType t, void* base, int64_t i, float v) {
  if (t == DType::kFloat32) {
    static_cast<float*>(base)[i] = v;
  } else if (kWithFloat64 && t == DType::kFloat64) {
    static_cast<double*>(base)[i] = v;
  } else {
    static_cast<uint16_t*>(base)[i] =
        t == DType::kFloat16 ? DTypeIo<DType::kFloat16>::store(v) : DTypeIo<DType::kBFloat16>::store(v);
  }
}

}  // namespace paddle_ext
