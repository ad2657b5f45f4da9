// The kernels' FloatKind of a Paddle tensor, for the op registrations
// (*_op.cc): one mapping of Paddle's dtypes for every op.
#pragma once

#include "common/half.h"
#include "paddle/extension.h"

namespace paddle_ext {

// who names the tensor in the error, with its op: "pe_rms_norm: x".
inline FloatKind float_kind(const paddle::Tensor& t, const char* who) {
  switch (t.dtype()) {
    case paddle::DataType::FLOAT32:
      return FloatKind::kFloat32;
    case paddle::DataType::FLOAT16:
      return FloatKind::kFloat16;
    case paddle::DataType::BFLOAT16:
      return FloatKind::kBFloat16;
    default:
      PD_THROW(who, " must be float32, float16 or bfloat16");
  }
}

}  // namespace paddle_ext
