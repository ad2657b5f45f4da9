// The kernels' DType (common/float_io.h) of a Paddle tensor, for the op
// registrations (*_op.cc): one mapping of Paddle's dtypes for every op.
#pragma once

#include "common/float_io.h"
#include "paddle/extension.h"

namespace paddle_ext {

// who names the tensor in the error, with its op: "pe_rms_norm: x". float64
// only where the op takes it (with_float64).
inline DType dtype_of(const paddle::Tensor& t, const char* who, bool with_float64 = false) {
  switch (t.dtype()) {
    case paddle::DataType::FLOAT32:
      return DType::kFloat32;
    case paddle::DataType::FLOAT16:
      return DType::kFloat16;
    case paddle::DataType::BFLOAT16:
      return DType::kBFloat16;
    case paddle::DataType::FLOAT64:
      if (with_float64) return DType::kFloat64;
      break;
    default:
      break;
  }
  PD_THROW(who, with_float64 ? " must be float32, float16, bfloat16 or float64"
                             : " must be float32, float16 or bfloat16");
}

}  // namespace paddle_ext
