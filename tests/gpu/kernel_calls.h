// What tests/gpu/device_check.sh's two programs share: kernels_check.cc (the
// GPU kernels against the CPU kernels, the CPU kernels against float64
// references) and kernels_capi.cc (a C entry point per flash-attention call,
// for the torch timing through ctypes). No Paddle header.
//
// This file is the ONE place that uses csrc/ops/flash_attn.h's signatures and
// its Problem fields: when they change, adapt make_problem() and the flash_*
// wrappers below, nothing else.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/gpu_runtime.h"
#include "flash_attn.h"

namespace gpu_check {

namespace fa = paddle_ext::flash_attn;
using paddle_ext::DType;

// ---- flash attention: shapes, and the calls ---------------------------------

// Which corner the causal mask is aligned to: top-left (key j visible from
// query i iff j <= i: Paddle's FlashAttention-2 fork, its CPU math path and
// PyTorch's is_causal; flash_attn.h's default) or bottom-right (j <= i + Lk -
// Lq, flash-attention >= 2.1: Problem::causal_bottom_right). They differ only
// when Lq != Lk.
enum class CausalAlign { kBottomRight, kTopLeft };

// Whether the kernels of this tree take a top-left causal mask (Problem::
// causal_bottom_right = false); kernels_check prints its top-left cases as
// TODO rows where they do not.
inline constexpr bool kHasTopLeftCausal = true;

struct FlashShape {
  DType kind = DType::kFloat32;
  int64_t batch = 1, seqlen_q = 1, seqlen_k = 1, heads_q = 1, heads_k = 1, head_dim = 64;
  bool causal = false;
  CausalAlign align = CausalAlign::kBottomRight;
  float dropout = 0.f;
  uint64_t seed = 1234, offset = 64;
  // Variable length: sequence b holds cu_q[b + 1] - cu_q[b] query tokens (the
  // caller fills cu_q / cu_k); padded when empty.
  std::vector<int32_t> cu_q, cu_k;

  bool varlen() const { return !cu_q.empty(); }
  int64_t total_q() const { return varlen() ? cu_q.back() : batch * seqlen_q; }
  int64_t total_k() const { return varlen() ? cu_k.back() : batch * seqlen_k; }
  int64_t q_elems() const { return total_q() * heads_q * head_dim; }
  int64_t k_elems() const { return total_k() * heads_k * head_dim; }
  int64_t lse_elems() const { return heads_q * total_q(); }
  int64_t softmax_elems() const { return batch * heads_q * seqlen_q * seqlen_k; }
  // Sequence b's first token and length, in q and in k.
  int64_t q_begin(int64_t b) const { return varlen() ? cu_q[b] : b * seqlen_q; }
  int64_t q_len(int64_t b) const { return varlen() ? cu_q[b + 1] - cu_q[b] : seqlen_q; }
  int64_t k_begin(int64_t b) const { return varlen() ? cu_k[b] : b * seqlen_k; }
  int64_t k_len(int64_t b) const { return varlen() ? cu_k[b + 1] - cu_k[b] : seqlen_k; }
  // lse's index of query i of sequence b, head h: padded [B, Hq, Sq], varlen [Hq, total_q].
  int64_t lse_index(int64_t b, int64_t h, int64_t i) const {
    return varlen() ? h * total_q() + cu_q[b] + i : (b * heads_q + h) * seqlen_q + i;
  }
  float scale() const { return 1.f / std::sqrt(static_cast<float>(head_dim)); }
};

inline FlashShape flash_shape(DType kind, int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t d,
                       bool causal, float dropout = 0.f, CausalAlign align = CausalAlign::kBottomRight) {
  FlashShape s;
  s.kind = kind;
  s.batch = b;
  s.seqlen_q = sq;
  s.seqlen_k = sk;
  s.heads_q = hq;
  s.heads_k = hk;
  s.head_dim = d;
  s.causal = causal;
  s.dropout = dropout;
  s.align = align;
  return s;
}

// The kernels' problem; cu_q / cu_k point to host (CPU) or device (GPU) copies.
inline fa::Problem make_problem(const FlashShape& s, const int32_t* cu_q, const int32_t* cu_k) {
  fa::Problem p;
  p.kind = s.kind;
  p.batch = s.batch;
  p.heads_q = s.heads_q;
  p.heads_k = s.heads_k;
  p.head_dim = s.head_dim;
  p.seqlen_q = s.seqlen_q;
  p.seqlen_k = s.seqlen_k;
  p.total_q = s.total_q();
  p.total_k = s.total_k();
  p.scale = s.scale();
  p.causal = s.causal;
  p.causal_bottom_right = s.align == CausalAlign::kBottomRight;
  p.dropout = s.dropout;
  p.seed = s.seed;
  p.offset = s.offset;
  if (s.varlen()) {
    p.cu_q = cu_q;
    p.cu_k = cu_k;
    p.lse_head_stride = s.total_q();
    p.lse_token_mult = 1;
  } else {
    p.lse_head_stride = s.seqlen_q;
    p.lse_token_mult = s.heads_q;
  }
  return p;
}

inline void flash_forward_cpu(const fa::Problem& p, const void* q, const void* k, const void* v, void* out,
                              float* lse) {
  fa::forward_cpu(p, q, k, v, out, lse);
}
inline void flash_softmax_cpu(const fa::Problem& p, const void* q, const void* k, const float* lse, void* sm) {
  fa::softmax_cpu(p, q, k, lse, sm);
}
inline void flash_backward_cpu(const fa::Problem& p, const void* q, const void* k, const void* v, const void* out,
                               const void* dout, const float* lse, void* dq, void* dk, void* dv) {
  fa::backward_cpu(p, q, k, v, out, dout, lse, dq, dk, dv);
}
inline void flash_forward_gpu(const fa::Problem& p, const void* q, const void* k, const void* v, void* out,
                              float* lse, void* stream) {
  fa::forward_gpu(p, q, k, v, out, lse, stream);
}
inline void flash_softmax_gpu(const fa::Problem& p, const void* q, const void* k, const float* lse, void* sm,
                              void* stream) {
  fa::softmax_gpu(p, q, k, lse, sm, stream);
}
inline int64_t flash_backward_workspace_bytes(const fa::Problem& p) { return fa::backward_gpu_workspace_bytes(p); }
inline void flash_backward_gpu(const fa::Problem& p, const void* q, const void* k, const void* v, const void* out,
                               const void* dout, const float* lse, void* dq, void* dk, void* dv, void* workspace,
                               void* stream) {
  fa::backward_gpu(p, q, k, v, out, dout, lse, dq, dk, dv, workspace, stream);
}

// Whether query i of a sequence with lq queries and lk keys sees key j.
inline bool visible(const FlashShape& s, int64_t lq, int64_t lk, int64_t i, int64_t j) {
  if (j >= lk) return false;
  if (!s.causal) return true;
  return s.align == CausalAlign::kTopLeft ? j <= i : j <= i + lk - lq;
}

// ---- element types ------------------------------------------------------------

using paddle_ext::dtype_bytes;

inline const char* kind_name(DType kind) {
  return kind == DType::kFloat32 ? "f32" : kind == DType::kFloat16 ? "f16" : "bf16";
}

// float values -> their bytes in `kind` (rounded to nearest even).
inline std::vector<char> to_bytes(const std::vector<float>& x, DType kind) {
  std::vector<char> b(x.size() * dtype_bytes(kind));
  for (size_t i = 0; i < x.size(); ++i) {
    if (kind == DType::kFloat32) {
      std::memcpy(b.data() + 4 * i, &x[i], 4);
    } else {
      const uint16_t h = kind == DType::kFloat16 ? paddle_ext::float_to_fp16(x[i]) : paddle_ext::float_to_bf16(x[i]);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}

// Bytes in `kind` -> float values.
inline std::vector<float> to_floats(const std::vector<char>& b, DType kind) {
  const size_t n = b.size() / dtype_bytes(kind);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) {
    if (kind == DType::kFloat32) {
      std::memcpy(&f[i], b.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      f[i] = kind == DType::kFloat16 ? paddle_ext::fp16_to_float(h) : paddle_ext::bf16_to_float(h);
    }
  }
  return f;
}

// ||a - ref|| / ||ref|| over the entries finite in both; an entry infinite in
// one only (a row that sees keys in one and none in the other) gives +inf.
template <class A, class B>
double rel_error(const std::vector<A>& a, const std::vector<B>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(ref[i]);
    if (std::isinf(x) && std::isinf(y) && (x > 0) == (y > 0)) continue;
    if (std::isnan(x) || std::isnan(y) || std::isinf(x) || std::isinf(y)) return INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

// ---- device memory --------------------------------------------------------------

// A device buffer, freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    PADDLE_EXT_GPU_CHECK(paddle_ext::gpu::malloc_device(&ptr_, bytes_ ? bytes_ : 1));
  }
  template <class T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    if (bytes_ == 0) return;  // (an empty vector's data() may be null)
    PADDLE_EXT_GPU_CHECK(paddle_ext::gpu::memcpy_to_device_async(ptr_, host.data(), bytes_, nullptr));
    PADDLE_EXT_GPU_CHECK(paddle_ext::gpu::stream_synchronize(nullptr));
  }
  ~DeviceBuffer() { (void)paddle_ext::gpu::free_device(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <class T = void>
  T* get() const { return static_cast<T*>(ptr_); }
  // Fills with 0xFF bytes (NaN in every float kind): an element a kernel fails to write shows.
  void poison() const { PADDLE_EXT_GPU_CHECK(paddle_ext::gpu::memset_async(ptr_, 0xFF, bytes_, nullptr)); }
  std::vector<char> bytes() const {
    std::vector<char> host(bytes_);
    PADDLE_EXT_GPU_CHECK(paddle_ext::gpu::memcpy_to_host_async(host.data(), ptr_, bytes_, nullptr));
    PADDLE_EXT_GPU_CHECK(paddle_ext::gpu::stream_synchronize(nullptr));
    return host;
  }
  template <class T>
  std::vector<T> values() const {
    const std::vector<char> b = bytes();
    std::vector<T> out(b.size() / sizeof(T));
    std::memcpy(out.data(), b.data(), out.size() * sizeof(T));
    return out;
  }

 private:
  size_t bytes_;
  void* ptr_ = nullptr;
};

}  // namespace gpu_check
