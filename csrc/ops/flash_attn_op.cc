// Paddle registration of FlashAttention-2: pe_flash_attn (padded [B, S, H, D])
// and pe_flash_attn_varlen ([total, H, D] with int32 cumulative lengths), each
// with its grad op. Outputs: Out, Softmax (the probabilities when
// return_softmax, else an empty tensor), SoftmaxLse (float32, [B, Hq, Sq] or
// [Hq, total_q]) and SeedOffset (int64 [2] on the CPU: the dropout seed and
// offset this call used, so that a recompute can replay it).
//
// Dropout randomness (upstream #52902): with FixedSeedOffset the call uses it
// as is; otherwise, when dropout is on, it takes `batch * heads_q * 32` from
// the offset of a Paddle generator (rng_name's, else the default one of the
// device), as flash-attention does; with dropout off nothing is drawn.
//
// The Python wrapper (paddle_ext/ops/flash_attention.py) checks the arguments
// with messages naming them; the checks here guard direct calls and those
// that need the data (cumulative lengths). Messages start with
// "paddle_ext.flash_attention: " so the wrapper can turn them into ValueError.
#include <atomic>
#include <exception>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/tensor_kind.h"
#include "flash_attn.h"
#include "paddle/extension.h"
#include "paddle/phi/core/generator.h"

namespace {

namespace fa = paddle_ext::flash_attn;
using paddle_ext::DType;
using paddle_ext::dtype_of;
using OptTensor = paddle::optional<paddle::Tensor>;
using Shape = std::vector<int64_t>;
using OptShape = paddle::optional<Shape>;
using OptDtype = paddle::optional<paddle::DataType>;

#define FA_CHECK(cond, ...) PD_CHECK(cond, "paddle_ext.flash_attention: ", __VA_ARGS__)

std::string shape_text(const Shape& s) {
  std::string text = "[";
  for (size_t i = 0; i < s.size(); ++i) text += (i ? ", " : "") + std::to_string(s[i]);
  return text + "]";
}

// ---- generator offsets -----------------------------------------------------
// Paddle 3.x names the state fields seed / offset, 2.6 current_seed / thread_offset.
template <typename S>
auto state_seed(S& s, int) -> decltype((s.seed)) { return s.seed; }
template <typename S>
auto state_seed(S& s, long) -> decltype((s.current_seed)) { return s.current_seed; }
template <typename S>
auto state_offset(S& s, int) -> decltype((s.offset)) { return s.offset; }
template <typename S>
auto state_offset(S& s, long) -> decltype((s.thread_offset)) { return s.thread_offset; }

// (seed, offset) before advancing the generator's offset by `increment`.
// Generator::IncrementOffset throws on CPU-only Paddle builds ("only support
// in CUDA place"): there the state is read, advanced and written back.
std::pair<uint64_t, uint64_t> take_offset(phi::Generator* gen, uint64_t increment) {
  static std::atomic<bool> increment_works{true};
  if (increment_works.load()) {
    try {
      return gen->IncrementOffset(increment);
    } catch (const std::exception&) {
      increment_works.store(false);
    }
  }
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto state = gen->GetState();
  const uint64_t seed = state_seed(state, 0);
  const uint64_t offset = state_offset(state, 0);
  state_offset(state, 0) = offset + increment;
  gen->SetState(state);
  return {seed, offset};
}

// The seed and offset this call uses, as an int64 [2] CPU tensor.
paddle::Tensor seed_offset(const paddle::Tensor& q, const OptTensor& fixed, bool dropout_on,
                           const std::string& rng_name, int64_t batch, int64_t heads_q) {
  auto result = paddle::empty({2}, paddle::DataType::INT64, paddle::CPUPlace());
  int64_t* so = result.data<int64_t>();
  so[0] = so[1] = 0;
  if (fixed) {
    FA_CHECK(fixed->dtype() == paddle::DataType::INT64 && fixed->numel() == 2,
             "fixed_seed_offset must be an int64 tensor of 2 elements (seed, offset)");
    paddle::Tensor host = fixed->is_cpu() ? *fixed : fixed->copy_to(paddle::CPUPlace(), true);
    so[0] = host.data<int64_t>()[0];
    so[1] = host.data<int64_t>()[1];
  } else if (dropout_on) {
    std::shared_ptr<phi::Generator> gen;
    if (!rng_name.empty()) {
      gen = phi::GetRandomSeedGenerator(rng_name);
    } else if (q.is_cpu()) {
      gen = phi::DefaultCPUGenerator();
    } else {
#if defined(PADDLE_EXT_WITH_GPU)
      gen = phi::DefaultCUDAGenerator(q.place().GetDeviceId());
#else
      PD_THROW("paddle_ext.flash_attention: this paddle_ext build has no GPU kernels");
#endif
    }
    const auto taken = take_offset(gen.get(), static_cast<uint64_t>(batch * heads_q) * fa::kOffsetPerHead);
    so[0] = static_cast<int64_t>(taken.first);
    so[1] = static_cast<int64_t>(taken.second);
  }
  return result;
}

// ---- problem description ---------------------------------------------------

void check_qkv(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& v, size_t rank) {
  const Shape qs = q.shape(), ks = k.shape(), vs = v.shape();
  FA_CHECK(qs.size() == rank, "query must be ", rank, "-D, got shape ", shape_text(qs));
  FA_CHECK(ks.size() == rank, "key must be ", rank, "-D, got shape ", shape_text(ks));
  FA_CHECK(vs == ks, "value must have key's shape ", shape_text(ks), ", got ", shape_text(vs));
  dtype_of(q, "paddle_ext.flash_attention: query");
  FA_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), "key and value must have query's dtype");
  FA_CHECK(k.place() == q.place() && v.place() == q.place(), "key and value must be on query's device");
  const int64_t hq = qs[rank - 2], hk = ks[rank - 2], d = qs[rank - 1];
  FA_CHECK(ks[rank - 1] == d, "key's head_dim ", ks[rank - 1], " must equal query's ", d);
  FA_CHECK(hk > 0 && hq % hk == 0, "key/value heads (", hk, ") must divide query heads (", hq, ")");
  FA_CHECK(d > 0, "head_dim must be >= 1, got ", d);
  FA_CHECK(q.is_cpu() || d <= fa::kMaxHeadDim, "head_dim must be in [1, ", fa::kMaxHeadDim, "] on GPU, got ", d);
}

fa::Problem padded_problem(const paddle::Tensor& q, const paddle::Tensor& k, float scale, bool causal,
                           bool bottom_right) {
  check_qkv(q, k, k, 4);
  const Shape qs = q.shape(), ks = k.shape();
  FA_CHECK(ks[0] == qs[0], "key's batch ", ks[0], " must equal query's ", qs[0]);
  fa::Problem p;
  p.kind = dtype_of(q, "paddle_ext.flash_attention: query");
  p.batch = qs[0];
  p.seqlen_q = qs[1];
  p.seqlen_k = ks[1];
  p.heads_q = qs[2];
  p.heads_k = ks[2];
  p.head_dim = qs[3];
  p.total_q = p.batch * p.seqlen_q;
  p.total_k = p.batch * p.seqlen_k;
  p.scale = scale;
  p.causal = causal;
  p.causal_bottom_right = bottom_right;
  p.lse_head_stride = p.seqlen_q;
  p.lse_token_mult = p.heads_q;
  return p;
}

// Host copy of cumulative lengths, checked against the token count.
std::vector<int32_t> host_cu(const paddle::Tensor& cu, const char* name, int64_t total, int64_t max_len,
                             const char* max_name) {
  FA_CHECK(cu.dtype() == paddle::DataType::INT32, name, " must be int32");
  FA_CHECK(cu.shape().size() == 1 && cu.numel() >= 2, name, " must be 1-D with batch + 1 >= 2 entries, got shape ",
           shape_text(cu.shape()));
  paddle::Tensor host = cu.is_cpu() ? cu : cu.copy_to(paddle::CPUPlace(), true);
  const int32_t* c = host.data<int32_t>();
  std::vector<int32_t> out(c, c + cu.numel());
  FA_CHECK(out[0] == 0, name, " must start at 0, got ", out[0]);
  for (size_t i = 1; i < out.size(); ++i) {
    FA_CHECK(out[i] >= out[i - 1], name, " must not decrease, got ", out[i - 1], " then ", out[i], " at index ", i);
    FA_CHECK(out[i] - out[i - 1] <= max_len, "sequence ", i - 1, " has ", out[i] - out[i - 1], " tokens (", name,
             "), more than ", max_name, "=", max_len);
  }
  FA_CHECK(out.back() == total, name, " must end at the number of tokens ", total, ", got ", out.back());
  return out;
}

struct Varlen {
  fa::Problem p;
  std::vector<int32_t> cu_q, cu_k;  // host copies (the CPU kernels read these)
};

Varlen varlen_problem(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& cu_q,
                      const paddle::Tensor& cu_k, int64_t max_q, int64_t max_k, float scale, bool causal,
                      bool bottom_right) {
  check_qkv(q, k, k, 3);
  const Shape qs = q.shape(), ks = k.shape();
  Varlen r;
  r.cu_q = host_cu(cu_q, "cu_seqlens_q", qs[0], max_q, "max_seqlen_q");
  r.cu_k = host_cu(cu_k, "cu_seqlens_k", ks[0], max_k, "max_seqlen_k");
  FA_CHECK(r.cu_q.size() == r.cu_k.size(), "cu_seqlens_q and cu_seqlens_k must have the same length, got ",
           r.cu_q.size(), " and ", r.cu_k.size());
  FA_CHECK(cu_q.place() == q.place() && cu_k.place() == q.place(), "cu_seqlens_q and cu_seqlens_k must be on query's device");
  fa::Problem& p = r.p;
  p.kind = dtype_of(q, "paddle_ext.flash_attention: query");
  p.batch = static_cast<int64_t>(r.cu_q.size()) - 1;
  p.seqlen_q = max_q;
  p.seqlen_k = max_k;
  p.heads_q = qs[1];
  p.heads_k = ks[1];
  p.head_dim = qs[2];
  p.total_q = qs[0];
  p.total_k = ks[0];
  p.scale = scale;
  p.causal = causal;
  p.causal_bottom_right = bottom_right;
  p.lse_head_stride = p.total_q;
  p.lse_token_mult = 1;
  if (q.is_cpu()) {
    p.cu_q = r.cu_q.data();
    p.cu_k = r.cu_k.data();
  } else {
    p.cu_q = cu_q.data<int32_t>();
    p.cu_k = cu_k.data<int32_t>();
  }
  return r;
}

void set_dropout(fa::Problem* p, float dropout, bool is_test, const paddle::Tensor& so) {
  FA_CHECK(dropout >= 0.f && dropout < 1.f, "dropout must be in [0, 1), got ", dropout);
  p->dropout = is_test ? 0.f : dropout;
  p->seed = static_cast<uint64_t>(so.data<int64_t>()[0]);
  p->offset = static_cast<uint64_t>(so.data<int64_t>()[1]);
}

#if !defined(PADDLE_EXT_WITH_GPU)
[[noreturn]] void no_gpu() {
  PD_THROW("paddle_ext.flash_attention: this paddle_ext build has no GPU kernels; reinstall it against a GPU "
           "build of Paddle");
}
#endif

std::vector<paddle::Tensor> run_forward(const fa::Problem& p0, const paddle::Tensor& q, const paddle::Tensor& k,
                                        const paddle::Tensor& v, const OptTensor& fixed, float dropout,
                                        bool return_softmax, bool is_test, const std::string& rng_name,
                                        const Shape& lse_shape) {
  fa::Problem p = p0;
  const bool dropout_on = dropout > 0.f && !is_test;
  paddle::Tensor so = seed_offset(q, fixed, dropout_on, rng_name, p.batch, p.heads_q);
  set_dropout(&p, dropout, is_test, so);
  auto out = paddle::empty(q.shape(), q.dtype(), q.place());
  auto lse = paddle::empty(lse_shape, paddle::DataType::FLOAT32, q.place());
  // Without return_softmax a 1-element placeholder: Paddle 2.6 refuses outputs
  // that hold no memory ("output is not initialized"), zero-size ones included.
  const Shape sm_shape = return_softmax ? Shape{p.batch, p.heads_q, p.seqlen_q, p.seqlen_k} : Shape{1};
  auto softmax = paddle::empty(sm_shape, q.dtype(), q.place());
  if (q.is_cpu()) {
    fa::forward_cpu(p, q.data(), k.data(), v.data(), out.data(), lse.data<float>());
    if (return_softmax) fa::softmax_cpu(p, q.data(), k.data(), lse.data<float>(), softmax.data());
  } else {
#if defined(PADDLE_EXT_WITH_GPU)
    void* stream = reinterpret_cast<void*>(q.stream());
    fa::forward_gpu(p, q.data(), k.data(), v.data(), out.data(), lse.data<float>(), stream);
    if (return_softmax) fa::softmax_gpu(p, q.data(), k.data(), lse.data<float>(), softmax.data(), stream);
#else
    no_gpu();
#endif
  }
  return {out, softmax, lse, so};
}

std::vector<paddle::Tensor> run_backward(const fa::Problem& p0, const paddle::Tensor& q, const paddle::Tensor& k,
                                         const paddle::Tensor& v, const paddle::Tensor& out,
                                         const paddle::Tensor& lse, const paddle::Tensor& so,
                                         const paddle::Tensor& out_grad, float dropout, bool is_test) {
  fa::Problem p = p0;
  set_dropout(&p, dropout, is_test, so);
  auto dq = paddle::empty(q.shape(), q.dtype(), q.place());
  auto dk = paddle::empty(k.shape(), k.dtype(), k.place());
  auto dv = paddle::empty(v.shape(), v.dtype(), v.place());
  if (q.is_cpu()) {
    fa::backward_cpu(p, q.data(), k.data(), v.data(), out.data(), out_grad.data(), lse.data<float>(), dq.data(),
                     dk.data(), dv.data());
  } else {
#if defined(PADDLE_EXT_WITH_GPU)
    auto workspace = paddle::empty({fa::backward_gpu_workspace_bytes(p)}, paddle::DataType::UINT8, q.place());
    fa::backward_gpu(p, q.data(), k.data(), v.data(), out.data(), out_grad.data(), lse.data<float>(), dq.data(),
                     dk.data(), dv.data(), workspace.data(), reinterpret_cast<void*>(q.stream()));
#else
    no_gpu();
#endif
  }
  return {dq, dk, dv};
}

// ---- padded ----------------------------------------------------------------

std::vector<paddle::Tensor> FlashAttnForward(const paddle::Tensor& q, const paddle::Tensor& k,
                                             const paddle::Tensor& v, const OptTensor& fixed_seed_offset,
                                             float scale, float dropout, bool causal, bool return_softmax,
                                             bool is_test, const std::string& rng_name, bool causal_bottom_right) {
  check_qkv(q, k, v, 4);
  const fa::Problem p = padded_problem(q, k, scale, causal, causal_bottom_right);
  return run_forward(p, q, k, v, fixed_seed_offset, dropout, return_softmax, is_test, rng_name,
                     {p.batch, p.heads_q, p.seqlen_q});
}

std::vector<paddle::Tensor> FlashAttnBackward(const paddle::Tensor& q, const paddle::Tensor& k,
                                              const paddle::Tensor& v, const paddle::Tensor& out,
                                              const paddle::Tensor& lse, const paddle::Tensor& so,
                                              const paddle::Tensor& out_grad, float scale, float dropout,
                                              bool causal, bool return_softmax, bool is_test,
                                              const std::string& rng_name, bool causal_bottom_right) {
  (void)return_softmax;
  (void)rng_name;
  const fa::Problem p = padded_problem(q, k, scale, causal, causal_bottom_right);
  return run_backward(p, q, k, v, out, lse, so, out_grad, dropout, is_test);
}

std::vector<Shape> FlashAttnInferShape(const Shape& q, const Shape& k, const Shape& v, const OptShape& so,
                                       float scale, float dropout, bool causal, bool return_softmax, bool is_test,
                                       const std::string& rng_name, bool causal_bottom_right) {
  const Shape sm = return_softmax ? Shape{q[0], q[2], q[1], k[1]} : Shape{1};
  return {q, sm, {q[0], q[2], q[1]}, {2}};
}

std::vector<paddle::DataType> FlashAttnInferDtype(const paddle::DataType& q, const paddle::DataType& k,
                                                  const paddle::DataType& v, const OptDtype& so) {
  return {q, q, paddle::DataType::FLOAT32, paddle::DataType::INT64};
}

std::vector<Shape> FlashAttnGradInferShape(const Shape& q, const Shape& k, const Shape& v, const Shape& out,
                                           const Shape& lse, const Shape& so, const Shape& out_grad) {
  return {q, k, v};
}

// ---- variable length ---------------------------------------------------------

std::vector<paddle::Tensor> FlashAttnVarlenForward(const paddle::Tensor& q, const paddle::Tensor& k,
                                                   const paddle::Tensor& v, const paddle::Tensor& cu_q,
                                                   const paddle::Tensor& cu_k, const OptTensor& fixed_seed_offset,
                                                   int64_t max_seqlen_q, int64_t max_seqlen_k, float scale,
                                                   float dropout, bool causal, bool return_softmax, bool is_test,
                                                   const std::string& rng_name, bool causal_bottom_right) {
  check_qkv(q, k, v, 3);
  const Varlen r = varlen_problem(q, k, cu_q, cu_k, max_seqlen_q, max_seqlen_k, scale, causal, causal_bottom_right);
  return run_forward(r.p, q, k, v, fixed_seed_offset, dropout, return_softmax, is_test, rng_name,
                     {r.p.heads_q, r.p.total_q});
}

std::vector<paddle::Tensor> FlashAttnVarlenBackward(const paddle::Tensor& q, const paddle::Tensor& k,
                                                    const paddle::Tensor& v, const paddle::Tensor& cu_q,
                                                    const paddle::Tensor& cu_k, const paddle::Tensor& out,
                                                    const paddle::Tensor& lse, const paddle::Tensor& so,
                                                    const paddle::Tensor& out_grad, int64_t max_seqlen_q,
                                                    int64_t max_seqlen_k, float scale, float dropout, bool causal,
                                                    bool return_softmax, bool is_test, const std::string& rng_name,
                                                    bool causal_bottom_right) {
  (void)return_softmax;
  (void)rng_name;
  const Varlen r = varlen_problem(q, k, cu_q, cu_k, max_seqlen_q, max_seqlen_k, scale, causal, causal_bottom_right);
  return run_backward(r.p, q, k, v, out, lse, so, out_grad, dropout, is_test);
}

std::vector<Shape> FlashAttnVarlenInferShape(const Shape& q, const Shape& k, const Shape& v, const Shape& cu_q,
                                             const Shape& cu_k, const OptShape& so, int64_t max_seqlen_q,
                                             int64_t max_seqlen_k, float scale, float dropout, bool causal,
                                             bool return_softmax, bool is_test, const std::string& rng_name,
                                             bool causal_bottom_right) {
  const Shape sm = return_softmax ? Shape{cu_q[0] - 1, q[1], max_seqlen_q, max_seqlen_k} : Shape{1};
  return {q, sm, {q[1], q[0]}, {2}};
}

std::vector<paddle::DataType> FlashAttnVarlenInferDtype(const paddle::DataType& q, const paddle::DataType& k,
                                                        const paddle::DataType& v, const paddle::DataType& cu_q,
                                                        const paddle::DataType& cu_k, const OptDtype& so) {
  return {q, q, paddle::DataType::FLOAT32, paddle::DataType::INT64};
}

std::vector<Shape> FlashAttnVarlenGradInferShape(const Shape& q, const Shape& k, const Shape& v, const Shape& cu_q,
                                                 const Shape& cu_k, const Shape& out, const Shape& lse,
                                                 const Shape& so, const Shape& out_grad) {
  return {q, k, v};
}

// ---- FlashMask (CPU) ----------------------------------------------------------

fa::Problem flashmask_problem(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& se, float scale,
                              bool causal) {
  fa::Problem p = padded_problem(q, k, scale, causal, false);
  FA_CHECK(q.is_cpu() && se.is_cpu(), "flashmask attention runs on CPU tensors only (Paddle's kernel serves GPUs)");
  const Shape ss = se.shape();
  FA_CHECK(se.dtype() == paddle::DataType::INT32 && ss.size() == 4,
           "startend_row_indices must be int32 [batch, heads, seqlen_k, 1|2|4], got shape ", shape_text(ss));
  FA_CHECK(ss[0] == p.batch && ss[2] == p.seqlen_k && (ss[1] == 1 || ss[1] == p.heads_q || ss[1] == p.heads_k),
           "startend_row_indices shape ", shape_text(ss), " must be [", p.batch, ", 1 | ", p.heads_q, " | ", p.heads_k,
           ", ", p.seqlen_k, ", c]");
  const int64_t c = ss[3];
  FA_CHECK(causal ? (c == 1 || c == 2) : (c == 2 || c == 4), "startend_row_indices' last dim must be ",
           causal ? "1 or 2 (causal)" : "2 or 4 (not causal)", ", got ", c);
  p.startend = se.data<int32_t>();
  p.mask_heads = ss[1];
  p.mask_cols = c;
  return p;
}

std::vector<paddle::Tensor> FlashMaskForward(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& v,
                                             const paddle::Tensor& se, const OptTensor& fixed_seed_offset, float scale,
                                             float dropout, bool causal, bool is_test, const std::string& rng_name) {
  check_qkv(q, k, v, 4);
  const fa::Problem p = flashmask_problem(q, k, se, scale, causal);
  return run_forward(p, q, k, v, fixed_seed_offset, dropout, false, is_test, rng_name,
                     {p.batch, p.heads_q, p.seqlen_q});
}

std::vector<paddle::Tensor> FlashMaskBackward(const paddle::Tensor& q, const paddle::Tensor& k, const paddle::Tensor& v,
                                              const paddle::Tensor& se, const paddle::Tensor& out,
                                              const paddle::Tensor& lse, const paddle::Tensor& so,
                                              const paddle::Tensor& out_grad, float scale, float dropout, bool causal,
                                              bool is_test, const std::string& rng_name) {
  (void)rng_name;
  const fa::Problem p = flashmask_problem(q, k, se, scale, causal);
  return run_backward(p, q, k, v, out, lse, so, out_grad, dropout, is_test);
}

std::vector<Shape> FlashMaskInferShape(const Shape& q, const Shape& k, const Shape& v, const Shape& se,
                                       const OptShape& so, float scale, float dropout, bool causal, bool is_test,
                                       const std::string& rng_name) {
  return {q, {1}, {q[0], q[2], q[1]}, {2}};
}

std::vector<paddle::DataType> FlashMaskInferDtype(const paddle::DataType& q, const paddle::DataType& k,
                                                  const paddle::DataType& v, const paddle::DataType& se,
                                                  const OptDtype& so) {
  return {q, q, paddle::DataType::FLOAT32, paddle::DataType::INT64};
}

std::vector<Shape> FlashMaskGradInferShape(const Shape& q, const Shape& k, const Shape& v, const Shape& se,
                                           const Shape& out, const Shape& lse, const Shape& so, const Shape& out_grad) {
  return {q, k, v};
}

}  // namespace

PD_BUILD_OP(pe_flashmask_attn)
    .Inputs({"Q", "K", "V", "StartEndRowIndices", paddle::Optional("FixedSeedOffset")})
    .Outputs({"Out", "Softmax", "SoftmaxLse", "SeedOffset"})
    .Attrs({"scale: float", "dropout: float", "causal: bool", "is_test: bool", "rng_name: std::string"})
    .SetKernelFn(PD_KERNEL(FlashMaskForward))
    .SetInferShapeFn(PD_INFER_SHAPE(FlashMaskInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(FlashMaskInferDtype));

PD_BUILD_GRAD_OP(pe_flashmask_attn)
    .Inputs({"Q", "K", "V", "StartEndRowIndices", "Out", "SoftmaxLse", "SeedOffset", paddle::Grad("Out")})
    .Outputs({paddle::Grad("Q"), paddle::Grad("K"), paddle::Grad("V")})
    .Attrs({"scale: float", "dropout: float", "causal: bool", "is_test: bool", "rng_name: std::string"})
    .SetKernelFn(PD_KERNEL(FlashMaskBackward))
    .SetInferShapeFn(PD_INFER_SHAPE(FlashMaskGradInferShape));

PD_BUILD_OP(pe_flash_attn)
    .Inputs({"Q", "K", "V", paddle::Optional("FixedSeedOffset")})
    .Outputs({"Out", "Softmax", "SoftmaxLse", "SeedOffset"})
    .Attrs({"scale: float", "dropout: float", "causal: bool", "return_softmax: bool", "is_test: bool",
            "rng_name: std::string", "causal_bottom_right: bool"})
    .SetKernelFn(PD_KERNEL(FlashAttnForward))
    .SetInferShapeFn(PD_INFER_SHAPE(FlashAttnInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(FlashAttnInferDtype));

PD_BUILD_GRAD_OP(pe_flash_attn)
    .Inputs({"Q", "K", "V", "Out", "SoftmaxLse", "SeedOffset", paddle::Grad("Out")})
    .Outputs({paddle::Grad("Q"), paddle::Grad("K"), paddle::Grad("V")})
    .Attrs({"scale: float", "dropout: float", "causal: bool", "return_softmax: bool", "is_test: bool",
            "rng_name: std::string", "causal_bottom_right: bool"})
    .SetKernelFn(PD_KERNEL(FlashAttnBackward))
    .SetInferShapeFn(PD_INFER_SHAPE(FlashAttnGradInferShape));

PD_BUILD_OP(pe_flash_attn_varlen)
    .Inputs({"Q", "K", "V", "CuSeqlensQ", "CuSeqlensK", paddle::Optional("FixedSeedOffset")})
    .Outputs({"Out", "Softmax", "SoftmaxLse", "SeedOffset"})
    .Attrs({"max_seqlen_q: int64_t", "max_seqlen_k: int64_t", "scale: float", "dropout: float", "causal: bool",
            "return_softmax: bool", "is_test: bool", "rng_name: std::string", "causal_bottom_right: bool"})
    .SetKernelFn(PD_KERNEL(FlashAttnVarlenForward))
    .SetInferShapeFn(PD_INFER_SHAPE(FlashAttnVarlenInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(FlashAttnVarlenInferDtype));

PD_BUILD_GRAD_OP(pe_flash_attn_varlen)
    .Inputs({"Q", "K", "V", "CuSeqlensQ", "CuSeqlensK", "Out", "SoftmaxLse", "SeedOffset", paddle::Grad("Out")})
    .Outputs({paddle::Grad("Q"), paddle::Grad("K"), paddle::Grad("V")})
    .Attrs({"max_seqlen_q: int64_t", "max_seqlen_k: int64_t", "scale: float", "dropout: float", "causal: bool",
            "return_softmax: bool", "is_test: bool", "rng_name: std::string", "causal_bottom_right: bool"})
    .SetKernelFn(PD_KERNEL(FlashAttnVarlenBackward))
    .SetInferShapeFn(PD_INFER_SHAPE(FlashAttnVarlenGradInferShape));
