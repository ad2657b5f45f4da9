// Paddle registration of pe_c_embedding and its grad: argument checks that
// need the data, then dispatch to the backend of the tensor's place.
#include <string>
#include <vector>

#include "c_embedding.h"
#include "common/tensor_kind.h"
#include "paddle/extension.h"

namespace {

using paddle_ext::c_embedding::BadId;
using paddle_ext::DType;

// How the backward sums a table of this dtype: its kind and how many of its
// elements make one table entry (2 for complex: real and imaginary parts).
struct GradLayout {
  DType kind;
  int64_t elements_per_entry;
};

GradLayout grad_layout(const paddle::Tensor& t) {
  switch (t.dtype()) {
    case paddle::DataType::FLOAT32:
      return {DType::kFloat32, 1};
    case paddle::DataType::FLOAT16:
      return {DType::kFloat16, 1};
    case paddle::DataType::BFLOAT16:
      return {DType::kBFloat16, 1};
    case paddle::DataType::FLOAT64:
      return {DType::kFloat64, 1};
    case paddle::DataType::COMPLEX64:
      return {DType::kFloat32, 2};
    case paddle::DataType::COMPLEX128:
      return {DType::kFloat64, 2};
    default:
      PD_THROW("pe_c_embedding: weight dtype must be float32, float64, float16, bfloat16, complex64 or complex128");
  }
}

void check_ids(const paddle::Tensor& ids, int64_t vocab_size) {
  BadId bad;
  const int64_t n = ids.numel();
  const bool is64 = ids.dtype() == paddle::DataType::INT64;
  if (ids.is_cpu()) {
    bad = is64 ? paddle_ext::c_embedding::find_out_of_range_cpu(ids.data<int64_t>(), n, vocab_size)
               : paddle_ext::c_embedding::find_out_of_range_cpu(ids.data<int32_t>(), n, vocab_size);
  }
#if defined(PADDLE_EXT_WITH_GPU)
  else {
    void* stream = reinterpret_cast<void*>(ids.stream());
    bad = is64 ? paddle_ext::c_embedding::find_out_of_range_gpu(ids.data<int64_t>(), n, vocab_size, stream)
               : paddle_ext::c_embedding::find_out_of_range_gpu(ids.data<int32_t>(), n, vocab_size, stream);
  }
#endif
  // The Python wrapper parses this exact prefix into an IndexError.
  PD_CHECK(bad.position < 0, "paddle_ext.c_embedding: id ", bad.id, " at position ", bad.position,
           " of ids is out of range [0, ", vocab_size, ") (vocab_size=", vocab_size, ")");
}

std::vector<paddle::Tensor> CEmbeddingForward(const paddle::Tensor& weight, const paddle::Tensor& ids,
                                              int64_t start_index, int64_t vocab_size) {
  PD_CHECK(weight.shape().size() == 2, "pe_c_embedding: weight must be 2-D");
  PD_CHECK(ids.dtype() == paddle::DataType::INT32 || ids.dtype() == paddle::DataType::INT64,
           "pe_c_embedding: ids must be int32 or int64");
  grad_layout(weight);
  check_ids(ids, vocab_size);

  const int64_t rows = weight.shape()[0];
  const int64_t width = weight.shape()[1];
  std::vector<int64_t> out_shape = ids.shape();
  out_shape.push_back(width);
  auto out = paddle::empty(out_shape, weight.dtype(), weight.place());
  const int64_t n = ids.numel();
  const int64_t row_bytes = width * phi::SizeOf(weight.dtype());
  const char* table = static_cast<const char*>(weight.data());
  char* dst = static_cast<char*>(out.data());
  const bool is64 = ids.dtype() == paddle::DataType::INT64;
  if (weight.is_cpu()) {
    if (is64) {
      paddle_ext::c_embedding::forward_cpu(table, rows, row_bytes, ids.data<int64_t>(), n, start_index, dst);
    } else {
      paddle_ext::c_embedding::forward_cpu(table, rows, row_bytes, ids.data<int32_t>(), n, start_index, dst);
    }
  }
#if defined(PADDLE_EXT_WITH_GPU)
  else {
    void* stream = reinterpret_cast<void*>(weight.stream());
    if (is64) {
      paddle_ext::c_embedding::forward_gpu(table, rows, row_bytes, ids.data<int64_t>(), n, start_index, dst, stream);
    } else {
      paddle_ext::c_embedding::forward_gpu(table, rows, row_bytes, ids.data<int32_t>(), n, start_index, dst, stream);
    }
  }
#else
  else {
    PD_THROW("pe_c_embedding: this paddle_ext build has no GPU kernels; reinstall it against a GPU build of Paddle");
  }
#endif
  return {out};
}

std::vector<paddle::Tensor> CEmbeddingBackward(const paddle::Tensor& weight, const paddle::Tensor& ids,
                                               const paddle::Tensor& out_grad, int64_t start_index,
                                               int64_t vocab_size) {
  const GradLayout layout = grad_layout(weight);
  const DType kind = layout.kind;
  const int64_t rows = weight.shape()[0];
  const int64_t width = weight.shape()[1] * layout.elements_per_entry;
  const int64_t n = ids.numel();
  auto grad = paddle::empty(weight.shape(), weight.dtype(), weight.place());
  const bool is64 = ids.dtype() == paddle::DataType::INT64;
  if (weight.is_cpu()) {
    if (is64) {
      paddle_ext::c_embedding::backward_cpu(kind, out_grad.data(), ids.data<int64_t>(), n, rows, width, start_index, grad.data());
    } else {
      paddle_ext::c_embedding::backward_cpu(kind, out_grad.data(), ids.data<int32_t>(), n, rows, width, start_index, grad.data());
    }
  }
#if defined(PADDLE_EXT_WITH_GPU)
  else {
    void* stream = reinterpret_cast<void*>(weight.stream());
    if (is64) {
      paddle_ext::c_embedding::backward_gpu(kind, out_grad.data(), ids.data<int64_t>(), n, rows, width, start_index, grad.data(), stream);
    } else {
      paddle_ext::c_embedding::backward_gpu(kind, out_grad.data(), ids.data<int32_t>(), n, rows, width, start_index, grad.data(), stream);
    }
  }
#else
  else {
    PD_THROW("pe_c_embedding: this paddle_ext build has no GPU kernels");
  }
#endif
  return {grad};
}

std::vector<std::vector<int64_t>> CEmbeddingInferShape(const std::vector<int64_t>& weight_shape,
                                                       const std::vector<int64_t>& ids_shape) {
  std::vector<int64_t> out = ids_shape;
  out.push_back(weight_shape.back());
  return {out};
}

std::vector<paddle::DataType> CEmbeddingInferDtype(const paddle::DataType& weight_dtype,
                                                   const paddle::DataType& ids_dtype) {
  return {weight_dtype};
}

}  // namespace

PD_BUILD_OP(pe_c_embedding)
    .Inputs({"Weight", "Ids"})
    .Outputs({"Out"})
    .Attrs({"start_index: int64_t", "vocab_size: int64_t"})
    .SetKernelFn(PD_KERNEL(CEmbeddingForward))
    .SetInferShapeFn(PD_INFER_SHAPE(CEmbeddingInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(CEmbeddingInferDtype));

PD_BUILD_GRAD_OP(pe_c_embedding)
    .Inputs({"Weight", "Ids", paddle::Grad("Out")})
    .Outputs({paddle::Grad("Weight")})
    .Attrs({"start_index: int64_t", "vocab_size: int64_t"})
    .SetKernelFn(PD_KERNEL(CEmbeddingBackward));
