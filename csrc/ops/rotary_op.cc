// Paddle registration of the fused rotary position embedding: pe_rotary
// rotates one tensor (q, k or v: the Python wrapper calls it once for each)
// with optional sin / cos tables and position ids; its grad op applies the
// transposed rotation to the output grad. One tensor per op because a custom
// op whose output goes unused in the loss gets an undefined grad, which
// Paddle's custom-op runner dereferences (a multi-output version crashed in
// egr::run_custom_op_impl on 3.3.1). The Python wrapper
// (paddle_ext/ops/rotary.py) checks the arguments with messages that name
// them; the checks here guard direct calls, and the position-id range check
// needs the data.
#include <string>
#include <vector>

#include "common/tensor_kind.h"
#include "paddle/extension.h"
#include "rotary.h"

namespace {

namespace rt = paddle_ext::rotary;
using OptTensor = paddle::optional<paddle::Tensor>;
using Shape = std::vector<int64_t>;
using OptShape = paddle::optional<Shape>;
using OptDtype = paddle::optional<paddle::DataType>;

std::string shape_text(const Shape& s) {
  std::string text = "[";
  for (size_t i = 0; i < s.size(); ++i) text += (i ? ", " : "") + std::to_string(s[i]);
  return text + "]";
}

void check_positions(const paddle::Tensor& ids, int64_t rows) {
  rt::BadPosition bad;
  const int64_t n = ids.numel();
  if (ids.is_cpu()) {
    bad = rt::find_bad_position_cpu(ids.data<int64_t>(), n, rows);
  }
#if defined(PADDLE_EXT_WITH_GPU)
  else {
    bad = rt::find_bad_position_gpu(ids.data<int64_t>(), n, rows, reinterpret_cast<void*>(ids.stream()));
  }
#endif
  // The Python wrapper parses this exact prefix into an IndexError.
  PD_CHECK(bad.index < 0, "paddle_ext.rotary: position id ", bad.value, " at index ", bad.index,
           " of position_ids is out of range [0, ", rows, ") (the rows of sin and cos)");
}

// Checks the tensors and fills everything of the problem but in/out.
rt::Problem describe(const paddle::Tensor& x, const OptTensor& sin, const OptTensor& cos,
                     const OptTensor& position_ids, bool use_neox_rotary_style, bool time_major,
                     float rotary_emb_base, bool check_position_ids) {
  const Shape xs = x.shape();
  PD_CHECK(xs.size() == 4, "pe_rotary: x must be 4-D, got shape ", shape_text(xs));
  rt::Problem p;
  p.dtype = paddle_ext::dtype_of(x, "pe_rotary: q, k and v", /*with_float64=*/true);
  p.batch = time_major ? xs[1] : xs[0];
  p.seq = time_major ? xs[0] : xs[1];
  p.heads = xs[2];
  p.head_dim = xs[3];
  p.time_major = time_major;
  p.adjacent_pairs = use_neox_rotary_style;
  p.base = rotary_emb_base;
  PD_CHECK(p.head_dim % 2 == 0, "pe_rotary: head_dim must be even, got ", p.head_dim);
  PD_CHECK(static_cast<bool>(sin) == static_cast<bool>(cos), "pe_rotary: sin and cos go together");
  if (sin) {
    const Shape ss = sin->shape();
    PD_CHECK(cos->shape() == ss, "pe_rotary: sin and cos must have the same shape");
    PD_CHECK(sin->dtype() == x.dtype() && cos->dtype() == x.dtype(), "pe_rotary: sin and cos must have x's dtype");
    PD_CHECK(sin->place() == x.place() && cos->place() == x.place(), "pe_rotary: sin and cos must be on x's device");
    PD_CHECK((ss.size() == 2 && ss[1] == p.head_dim) ||
                 (ss.size() == 4 && ss[0] == 1 && ss[2] == 1 && ss[3] == p.head_dim),
             "pe_rotary: sin and cos must be [rows, head_dim] or [1, rows, 1, head_dim], got ", shape_text(ss));
    p.table_rows = ss.size() == 2 ? ss[0] : ss[1];
    p.sin = sin->data();
    p.cos = cos->data();
  } else {
    PD_CHECK(!position_ids, "pe_rotary: position_ids need sin and cos");
    p.table_rows = p.seq;
  }
  if (position_ids) {
    PD_CHECK(position_ids->dtype() == paddle::DataType::INT64, "pe_rotary: position_ids must be int64");
    PD_CHECK(position_ids->shape() == Shape({p.batch, p.seq}), "pe_rotary: position_ids must be [batch, seq] = ",
             shape_text({p.batch, p.seq}), ", got ", shape_text(position_ids->shape()));
    PD_CHECK(position_ids->place() == x.place(), "pe_rotary: position_ids must be on x's device");
    // On the CPU the scan is cheap next to the rotation: always done, so no call
    // reads outside the tables. On a GPU it synchronises: once per API call.
    if (check_position_ids || x.is_cpu()) check_positions(*position_ids, p.table_rows);
    p.position_ids = position_ids->data<int64_t>();
  } else {
    PD_CHECK(p.table_rows == p.seq, "pe_rotary: without position_ids sin and cos need seq = ", p.seq,
             " rows, got ", p.table_rows);
  }
  return p;
}

paddle::Tensor rotate(const paddle::Tensor& x, const OptTensor& sin, const OptTensor& cos,
                      const OptTensor& position_ids, bool use_neox_rotary_style, bool time_major,
                      float rotary_emb_base, bool check_position_ids, bool backward) {
  rt::Problem p = describe(x, sin, cos, position_ids, use_neox_rotary_style, time_major, rotary_emb_base,
                           check_position_ids);
  paddle::Tensor out = paddle::empty(x.shape(), x.dtype(), x.place());
  if (x.numel() == 0) return out;
  p.in = x.data();
  p.out = out.data();
  if (x.is_cpu()) {
    backward ? rt::backward_cpu(p) : rt::forward_cpu(p);
  }
#if defined(PADDLE_EXT_WITH_GPU)
  else {
    void* stream = reinterpret_cast<void*>(x.stream());
    backward ? rt::backward_gpu(p, stream) : rt::forward_gpu(p, stream);
  }
#else
  else {
    PD_THROW("pe_rotary: this paddle_ext build has no GPU kernels; reinstall it against a GPU build of Paddle");
  }
#endif
  return out;
}

std::vector<paddle::Tensor> RotaryForward(const paddle::Tensor& x, const OptTensor& sin, const OptTensor& cos,
                                          const OptTensor& position_ids, bool use_neox_rotary_style,
                                          bool time_major, float rotary_emb_base, bool check_position_ids) {
  return {rotate(x, sin, cos, position_ids, use_neox_rotary_style, time_major, rotary_emb_base,
                 check_position_ids, false)};
}

// On a GPU the forward pass checked the positions (see describe).
std::vector<paddle::Tensor> RotaryBackward(const OptTensor& sin, const OptTensor& cos, const OptTensor& position_ids,
                                           const paddle::Tensor& out_grad, bool use_neox_rotary_style,
                                           bool time_major, float rotary_emb_base, bool check_position_ids) {
  (void)check_position_ids;
  return {rotate(out_grad, sin, cos, position_ids, use_neox_rotary_style, time_major, rotary_emb_base, false,
                 true)};
}

// Shapes and dtypes pass through (for static graphs; eager mode takes the
// kernel's tensors as they are).
std::vector<Shape> RotaryInferShape(const Shape& x, const OptShape&, const OptShape&, const OptShape&) {
  return {x};
}
std::vector<Shape> RotaryGradInferShape(const OptShape&, const OptShape&, const OptShape&, const Shape& g) {
  return {g};
}
std::vector<paddle::DataType> RotaryInferDtype(const paddle::DataType& x, const OptDtype&, const OptDtype&,
                                               const OptDtype&) {
  return {x};
}
std::vector<paddle::DataType> RotaryGradInferDtype(const OptDtype&, const OptDtype&, const OptDtype&,
                                                   const paddle::DataType& g) {
  return {g};
}

}  // namespace

PD_BUILD_OP(pe_rotary)
    .Inputs({"X", paddle::Optional("Sin"), paddle::Optional("Cos"), paddle::Optional("PositionIds")})
    .Outputs({"Out"})
    .Attrs({"use_neox_rotary_style: bool", "time_major: bool", "rotary_emb_base: float",
            "check_position_ids: bool"})
    .SetKernelFn(PD_KERNEL(RotaryForward))
    .SetInferShapeFn(PD_INFER_SHAPE(RotaryInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RotaryInferDtype));

PD_BUILD_GRAD_OP(pe_rotary)
    .Inputs({paddle::Optional("Sin"), paddle::Optional("Cos"), paddle::Optional("PositionIds"), paddle::Grad("Out")})
    .Outputs({paddle::Grad("X")})
    .Attrs({"use_neox_rotary_style: bool", "time_major: bool", "rotary_emb_base: float",
            "check_position_ids: bool"})
    .SetKernelFn(PD_KERNEL(RotaryBackward))
    .SetInferShapeFn(PD_INFER_SHAPE(RotaryGradInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RotaryGradInferDtype));
