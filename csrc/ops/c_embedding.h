// c_embedding: the vocabulary-parallel embedding lookup (upstream #55621),
// declared on raw pointers so each backend lives in its own file:
// cpu/c_embedding_cpu.cc, gpu/c_embedding.cu (CUDA and HIP), and the Paddle
// op registration in c_embedding_op.cc.
//
// Semantics (Paddle's c_embedding): row r of this rank's table slice holds
// vocabulary id start + r; ids in [start, start + rows) take that row, all
// other ids give zeros. The check (Paddle's GPU kernel's, `id >= 0 &&
// (vocab_size < 0 || id < vocab_size)`): every id must be >= 0, and < vocab_size
// when vocab_size >= 0; start + rows may exceed vocab_size.
//
// Tables: every dtype Paddle's c_embedding kernels take (float32, float64,
// float16, bfloat16, complex64, complex128). The forward copies raw row bytes,
// so it needs only the row size; the backward sums in the precision of its
// DType (common/float_io.h's Value). A complex table is passed to the backward as its real kind with twice
// the width: complex addition is componentwise, so the sums are the same bits.
#pragma once

#include <cstdint>

#include "common/float_io.h"

namespace paddle_ext::c_embedding {

struct BadId {
  int64_t position = -1;  // -1: all ids in range
  int64_t id = 0;
};

// The exclusive upper bound of valid ids: vocab_size, or none (INT64_MAX) for a
// negative vocab_size, which lifts only the upper bound (ids stay >= 0).
inline int64_t id_limit(int64_t vocab_size) { return vocab_size < 0 ? INT64_MAX : vocab_size; }

template <typename IdT>
BadId find_out_of_range_cpu(const IdT* ids, int64_t n, int64_t vocab_size);

// out[i, :] = table[ids[i] - start, :] or zeros; row_bytes = width * sizeof(T).
template <typename IdT>
void forward_cpu(const char* table, int64_t rows, int64_t row_bytes, const IdT* ids, int64_t n,
                 int64_t start, char* out);

// table_grad = zeros, then table_grad[ids[i] - start, :] += out_grad[i, :] for
// in-range ids, summed from +0 in the order of i (so float32 and float64 results
// equal Paddle's sequential scatter-add, bit for bit), written once per row.
// width counts elements of `kind` (twice the columns of a complex table).
template <typename IdT>
void backward_cpu(DType kind, const void* out_grad, const IdT* ids, int64_t n, int64_t rows,
                  int64_t width, int64_t start, void* table_grad);

#if defined(PADDLE_EXT_WITH_GPU)
// GPU versions; `stream` is a cudaStream_t / hipStream_t. The check copies one
// small result back to the host, so it synchronises the stream.
template <typename IdT>
BadId find_out_of_range_gpu(const IdT* ids, int64_t n, int64_t vocab_size, void* stream);

template <typename IdT>
void forward_gpu(const char* table, int64_t rows, int64_t row_bytes, const IdT* ids, int64_t n,
                 int64_t start, char* out, void* stream);

template <typename IdT>
void backward_gpu(DType kind, const void* out_grad, const IdT* ids, int64_t n, int64_t rows,
                  int64_t width, int64_t start, void* table_grad, void* stream);
#endif

}  // namespace paddle_ext::c_embedding
