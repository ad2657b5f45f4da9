// rms_norm: RMS normalisation of rows (Paddle's fused_rms_norm_ext and the
// plain case of fused_rms_norm), declared on raw pointers so each backend lives
// in its own file: cpu/rms_norm_cpu.cc, and the Paddle op registration in
// rms_norm_op.cc. No Paddle header here.
//
// Semantics (Paddle 3.3.1's GPU kernel fused_rms_norm_ext, RMSLnFwd / RMSLnBwd):
// x is [rows, cols] (contiguous), weight [cols]; for each row r
//
//   inv_var[r] = 1 / sqrt(mean_j x[r, j]^2 + epsilon)          (float32)
//   y[r, j]    = weight[j] * inv_var[r] * x[r, j]               (weight's dtype)
//
// and the backward pass, from dy (weight's dtype):
//
//   dot[r]     = sum_j dy[r, j] * weight[j] * x[r, j]
//   dx[r, j]   = inv_var[r] * weight[j] * dy[r, j] - inv_var[r]^3 * dot[r] / cols * x[r, j]
//   dweight[j] = sum_r dy[r, j] * x[r, j] * inv_var[r]
//
// x and weight may have different dtypes (Paddle's GPU kernel takes a float32
// weight with bfloat16 x); y and dweight take weight's, dx takes x's.
//
// Arithmetic is float32, also for float16 / bfloat16 data. Row sums add in
// float32 lanes within blocks of kSumBlock elements and the blocks in double,
// column sums (dweight) add rows in double per fixed part of rows: results do
// not depend on the number of threads.
#pragma once

#include <cstdint>

#include "common/float_io.h"

namespace paddle_ext::rms_norm {

struct Problem {
  DType x_kind = DType::kFloat32;
  DType weight_kind = DType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;  // > 0
  float epsilon = 1e-5f;
  const void* x = nullptr;       // [rows, cols], x_kind
  const void* weight = nullptr;  // [cols], weight_kind
};

// y: [rows, cols] of weight_kind; inv_var: [rows].
void forward_cpu(const Problem& p, void* y, float* inv_var);

// dy: [rows, cols] of weight_kind. inv_var: the forward's, or null to have it
// recomputed from x (same value). dx: [rows, cols] of x_kind; dweight: [cols]
// of weight_kind, or null when not wanted.
void backward_cpu(const Problem& p, const void* dy, const float* inv_var, void* dx, void* dweight);

}  // namespace paddle_ext::rms_norm
