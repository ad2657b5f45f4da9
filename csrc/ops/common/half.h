// float16 / bfloat16 <-> float conversions for the CPU and GPU kernels, kept
// free of Paddle headers so the kernels build (and are tested) on their own.
// The same bit-level code runs on host and device, so a GPU kernel rounds
// exactly as the CPU one does.
#pragma once

#include <cstdint>
#include <cstring>

// __host__ __device__ under nvcc / hipcc, nothing for a plain C++ compiler.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define PADDLE_EXT_HOST_DEVICE __host__ __device__
#else
#define PADDLE_EXT_HOST_DEVICE
#endif

namespace paddle_ext {

// The bits of `from` as a To of the same size: memcpy, which every compiler
// here (g++, nvcc's device pass, clang's HIP device pass, where
// hip_runtime.h need not be included yet) turns into a register move.
template <class To, class From>
PADDLE_EXT_HOST_DEVICE inline To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast: the types differ in size");
  To to;
  __builtin_memcpy(&to, &from, sizeof to);
  return to;
}

PADDLE_EXT_HOST_DEVICE inline uint32_t float_to_bits(float f) { return bit_cast<uint32_t>(f); }

PADDLE_EXT_HOST_DEVICE inline float bits_to_float(uint32_t bits) { return bit_cast<float>(bits); }

PADDLE_EXT_HOST_DEVICE inline float bf16_to_float(uint16_t h) {
  return bits_to_float(static_cast<uint32_t>(h) << 16);
}

PADDLE_EXT_HOST_DEVICE inline uint16_t float_to_bf16(float f) {
  uint32_t bits = float_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // NaN stays NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

PADDLE_EXT_HOST_DEVICE inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return bits_to_float(bits);
}

PADDLE_EXT_HOST_DEVICE inline uint16_t float_to_fp16(float f) {
  const uint32_t bits = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;             // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;            // overflow -> inf
  if (abs < 0x38800000u) {                                  // subnormal or zero
    if (abs < 0x33000000u) return sign;
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;                       // 14..24
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t half = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

}  // namespace paddle_ext
