// Element access by FloatKind for the CPU kernels: float32 as is, float16 and
// bfloat16 through common/half.h's conversions (so every CPU op rounds the
// same way). One copy here instead of one per op file.
#pragma once

#include <cstdint>

#include "common/half.h"

namespace paddle_ext {

inline int64_t element_bytes(FloatKind kind) { return kind == FloatKind::kFloat32 ? 4 : 2; }

// Element i of an array of `kind`, as float.
inline float load_float(FloatKind kind, const void* base, int64_t i) {
  switch (kind) {
    case FloatKind::kFloat32:
      return static_cast<const float*>(base)[i];
    case FloatKind::kFloat16:
      return fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    case FloatKind::kBFloat16:
      return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
  }
  return 0.f;
}

// v rounded to `kind` into element i.
inline void store_float(FloatKind kind, void* base, int64_t i, float v) {
  switch (kind) {
    case FloatKind::kFloat32:
      static_cast<float*>(base)[i] = v;
      return;
    case FloatKind::kFloat16:
      static_cast<uint16_t*>(base)[i] = float_to_fp16(v);
      return;
    case FloatKind::kBFloat16:
      static_cast<uint16_t*>(base)[i] = float_to_bf16(v);
      return;
  }
}

}  // namespace paddle_ext
