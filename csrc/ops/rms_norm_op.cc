// Paddle registration of RMS normalisation: pe_rms_norm (y and inv_var) with
// its grad op (dx and dweight), and pe_rms_norm_backward, the same backward as
// a plain op, for callers that have the forward from elsewhere (Paddle's own
// float32 CPU kernel of fused_rms_norm) and need only the gradients. The rows
// are everything before the last weight.numel() elements of x (x is [rows,
// cols] flattened, any rank). The Python wrapper (paddle_ext/ops/rms_norm.py)
// checks the arguments with messages that name them; the checks here guard
// direct calls.
#include <vector>

#include "paddle/extension.h"
#include "common/tensor_kind.h"
#include "rms_norm.h"

namespace {

namespace rn = paddle_ext::rms_norm;
using paddle_ext::dtype_of;
using OptTensor = paddle::optional<paddle::Tensor>;
using Shape = std::vector<int64_t>;
using OptShape = paddle::optional<Shape>;
using OptDtype = paddle::optional<paddle::DataType>;

rn::Problem describe(const paddle::Tensor& x, const paddle::Tensor& weight, float epsilon) {
  PD_CHECK(x.is_cpu() && weight.is_cpu(), "pe_rms_norm: x and weight must be CPU tensors (no GPU kernel)");
  rn::Problem p;
  p.x_kind = dtype_of(x, "pe_rms_norm: x");
  p.weight_kind = dtype_of(weight, "pe_rms_norm: weight");
  p.cols = weight.numel();
  PD_CHECK(p.cols > 0, "pe_rms_norm: weight must not be empty");
  PD_CHECK(x.numel() % p.cols == 0, "pe_rms_norm: x's trailing elements must match weight (", p.cols, ")");
  p.rows = x.numel() / p.cols;
  p.epsilon = epsilon;
  p.x = x.data();
  p.weight = weight.data();
  return p;
}

std::vector<paddle::Tensor> RmsNormForward(const paddle::Tensor& x, const paddle::Tensor& weight, float epsilon) {
  const rn::Problem p = describe(x, weight, epsilon);
  paddle::Tensor y = paddle::empty(x.shape(), weight.dtype(), x.place());
  paddle::Tensor inv_var = paddle::empty({p.rows}, paddle::DataType::FLOAT32, x.place());
  rn::forward_cpu(p, y.data(), inv_var.data<float>());
  return {y, inv_var};
}

std::vector<paddle::Tensor> backward(const paddle::Tensor& x, const paddle::Tensor& weight, const float* inv_var,
                                     const paddle::Tensor& y_grad, float epsilon) {
  const rn::Problem p = describe(x, weight, epsilon);
  PD_CHECK(y_grad.shape() == x.shape() && y_grad.dtype() == weight.dtype(),
           "pe_rms_norm: y_grad must have x's shape and weight's dtype");
  paddle::Tensor x_grad = paddle::empty(x.shape(), x.dtype(), x.place());
  paddle::Tensor weight_grad = paddle::empty(weight.shape(), weight.dtype(), weight.place());
  rn::backward_cpu(p, y_grad.data(), inv_var, x_grad.data(), weight_grad.data());
  return {x_grad, weight_grad};
}

std::vector<paddle::Tensor> RmsNormGrad(const paddle::Tensor& x, const paddle::Tensor& weight,
                                        const paddle::Tensor& inv_var, const paddle::Tensor& y_grad,
                                        float epsilon) {
  PD_CHECK(inv_var.dtype() == paddle::DataType::FLOAT32, "pe_rms_norm: inv_var must be float32");
  return backward(x, weight, inv_var.data<float>(), y_grad, epsilon);
}

// inv_var recomputed from x when not given.
std::vector<paddle::Tensor> RmsNormBackward(const paddle::Tensor& x, const paddle::Tensor& weight,
                                            const OptTensor& inv_var, const paddle::Tensor& y_grad,
                                            float epsilon) {
  return inv_var ? RmsNormGrad(x, weight, *inv_var, y_grad, epsilon)
                 : backward(x, weight, nullptr, y_grad, epsilon);
}

std::vector<Shape> RmsNormInferShape(const Shape& x, const Shape& weight) {
  int64_t cols = 1, numel = 1;
  for (int64_t d : weight) cols *= d;
  for (int64_t d : x) numel *= d;
  return {x, {cols > 0 && numel >= 0 ? numel / cols : -1}};
}
std::vector<paddle::DataType> RmsNormInferDtype(const paddle::DataType&, const paddle::DataType& weight) {
  return {weight, paddle::DataType::FLOAT32};
}
std::vector<Shape> RmsNormGradInferShape(const Shape& x, const Shape& weight, const Shape&, const Shape&) {
  return {x, weight};
}
std::vector<paddle::DataType> RmsNormGradInferDtype(const paddle::DataType& x, const paddle::DataType& weight,
                                                    const paddle::DataType&, const paddle::DataType&) {
  return {x, weight};
}
std::vector<Shape> RmsNormBackwardInferShape(const Shape& x, const Shape& weight, const OptShape&, const Shape&) {
  return {x, weight};
}
std::vector<paddle::DataType> RmsNormBackwardInferDtype(const paddle::DataType& x, const paddle::DataType& weight,
                                                        const OptDtype&, const paddle::DataType&) {
  return {x, weight};
}

}  // namespace

PD_BUILD_OP(pe_rms_norm)
    .Inputs({"X", "Weight"})
    .Outputs({"Y", "InvVar"})
    .Attrs({"epsilon: float"})
    .SetKernelFn(PD_KERNEL(RmsNormForward))
    .SetInferShapeFn(PD_INFER_SHAPE(RmsNormInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RmsNormInferDtype));

PD_BUILD_GRAD_OP(pe_rms_norm)
    .Inputs({"X", "Weight", "InvVar", paddle::Grad("Y")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Weight")})
    .Attrs({"epsilon: float"})
    .SetKernelFn(PD_KERNEL(RmsNormGrad))
    .SetInferShapeFn(PD_INFER_SHAPE(RmsNormGradInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RmsNormGradInferDtype));

PD_BUILD_OP(pe_rms_norm_backward)
    .Inputs({"X", "Weight", paddle::Optional("InvVar"), "YGrad"})
    .Outputs({"XGrad", "WeightGrad"})
    .Attrs({"epsilon: float"})
    .SetKernelFn(PD_KERNEL(RmsNormBackward))
    .SetInferShapeFn(PD_INFER_SHAPE(RmsNormBackwardInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RmsNormBackwardInferDtype));
