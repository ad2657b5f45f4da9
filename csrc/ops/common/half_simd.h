// float16 <-> float conversions for vectorised CPU loops (rotary, rms_norm):
// common/half.h's versions branch per element, which keeps a loop scalar.
// Host only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/half.h"

namespace paddle_ext {

// float16 <-> float without branches or loops, so the rotation loops stay
// vectorisable; bit for bit the conversions of common/half.h (checked over
// every float16 and every float32 input, with and without FMA contraction),
// except that the 1022 signalling-NaN float16s load as the quiet NaN of the
// same payload, which any arithmetic on them would give too.
// Normal numbers are rebiased by exponent arithmetic and a power-of-two
// scaling; float16 subnormals go through a float with a magic exponent; on the
// way down, adding a power of two chosen from the input's exponent makes the
// float adder round the mantissa to float16 precision (nearest even).
inline float fp16_to_float_branchless(uint16_t h) {
  const uint32_t two_w = static_cast<uint32_t>(h) << 17;  // exponent and mantissa, sign dropped
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const float normal = bits_to_float((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float subnormal = bits_to_float((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t is_subnormal = 0u - static_cast<uint32_t>(two_w < (1u << 27));  // a mask, not a branch
  return bits_to_float(sign | (float_to_bits(subnormal) & is_subnormal) | (float_to_bits(normal) & ~is_subnormal));
}

inline uint16_t float_to_fp16_branchless(float f) {
  const uint32_t w = float_to_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = (w >> 16) & 0x8000u;
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;  // overflows to inf above float16's range
  const uint32_t bias = std::max(shl1_w & 0xFF000000u, 0x71000000u);
  base = bits_to_float((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = float_to_bits(base);
  const uint32_t magnitude = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
  const uint32_t is_nan = 0u - static_cast<uint32_t>(shl1_w > 0xFF000000u);  // NaN -> quiet NaN
  return static_cast<uint16_t>(sign | (0x7E00u & is_nan) | (magnitude & ~is_nan));
}

}  // namespace paddle_ext
