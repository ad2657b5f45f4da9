// rotary: fused rotary position embedding (upstream #54351, rotate-half
// #56401, time-major #61417), declared on raw pointers so each backend lives
// in its own file: cpu/rotary_cpu.cc, gpu/rotary.cu (CUDA and HIP), and the
// Paddle op registration in rotary_op.cc. No Paddle header here.
//
// Semantics (Paddle 3.3.1's fused_rotary_position_embedding, GPU kernel
// fused_rope): a tensor is [batch, seq, heads, head_dim] or, time-major,
// [seq, batch, heads, head_dim], contiguous (q, k and v go one at a time, so
// their head counts may differ: GQA). For the token (b, s) the
// position is p = position_ids[b, s], or s without position_ids, and with
// cos = cos_table[p, :], sin = sin_table[p, :] (full head_dim rows):
//
//   out[i] = x[i] * cos[i] + sigma(i) * x[partner(i)] * sin[i]
//
// where adjacent_pairs (use_neox_rotary_style=True) pairs (0,1), (2,3), ...
// and otherwise (rotate-half) pairs i with i + head_dim/2; sigma is -1 for
// the first element of a pair and +1 for the second. Without tables,
// sin/cos[p, i] = sin/cos(p * base^(-2*(i/2)/head_dim)) (adjacent pairs share
// a frequency), evaluated in double precision.
//
// The backward pass applies the transpose of that map to the output grads:
//   grad_x[i] = g[i] * cos[i] - sigma(i) * g[partner(i)] * sin[partner(i)]
// (the inverse rotation when a pair shares one angle, as real tables do).
//
// Arithmetic: double for float32 and float64 (so a float32 result is the
// correctly rounded value of the exact one), float for float16 / bfloat16.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/float_io.h"

namespace paddle_ext::rotary {

// The arithmetic type for elements of DType K (see "Arithmetic" above):
// double for float32 and float64, float for float16 and bfloat16.
template <DType K>
using Compute = std::conditional_t<K == DType::kFloat16 || K == DType::kBFloat16, float, double>;

// One call rotates one tensor (q, k or v).
struct Problem {
  DType dtype = DType::kFloat32;  // of the tensor and of the tables
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;  // even
  bool time_major = false;
  bool adjacent_pairs = true;  // use_neox_rotary_style
  // sin / cos: [table_rows, head_dim] in dtype, or both null: computed from
  // base (then position_ids must be null too).
  const void* sin = nullptr;
  const void* cos = nullptr;
  int64_t table_rows = 0;
  const int64_t* position_ids = nullptr;  // [batch, seq], each in [0, table_rows)
  double base = 10000.0;
  const void* in = nullptr;
  void* out = nullptr;
};

// Forward: out = rotate(in). Backward: in holds the output grads, out gets the
// input grads. Outputs must not overlap the inputs.
void forward_cpu(const Problem& p);
void backward_cpu(const Problem& p);

struct BadPosition {
  int64_t index = -1;  // -1: every position id lies in [0, rows)
  int64_t value = 0;
};

// The first position id outside [0, rows), in index order.
BadPosition find_bad_position_cpu(const int64_t* ids, int64_t n, int64_t rows);

#if defined(PADDLE_EXT_WITH_GPU)
// GPU versions; `stream` is a cudaStream_t / hipStream_t. The position check
// copies its answer back to the host, so it synchronises the stream.
void forward_gpu(const Problem& p, void* stream);
void backward_gpu(const Problem& p, void* stream);
BadPosition find_bad_position_gpu(const int64_t* ids, int64_t n, int64_t rows, void* stream);
#endif

}  // namespace paddle_ext::rotary
