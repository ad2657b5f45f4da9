// Prepared GPU check of the FlashAttention kernels, without Paddle: runs
// forward_gpu / softmax_gpu / backward_gpu of csrc/ops/gpu/flash_attn.cu and
// the CPU kernels on the same random inputs and prints, per case, the largest
// relative difference of out, lse, dq, dk, dv (and whether the dropout masks
// are identical), plus GPU timings. Exit status 1 when a difference exceeds
// 1e-4 (float32) / 2e-2 (float16, bfloat16) or a mask differs.
// Built and run by tests/gpu/flash_attn_gpu_check.sh (nvcc, or hipcc).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/gpu_runtime.h"
#include "flash_attn.h"

namespace fa = paddle_ext::flash_attn;
using paddle_ext::FloatKind;

namespace {

struct Case {
  const char* name;
  int64_t batch, sq, sk, hq, hk, d;
  bool causal;
  float dropout;
  FloatKind kind;
  bool varlen;
};

std::vector<uint16_t> to_half(const std::vector<float>& x, FloatKind kind) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    h[i] = kind == FloatKind::kFloat16 ? paddle_ext::float_to_fp16(x[i]) : paddle_ext::float_to_bf16(x[i]);
  return h;
}

std::vector<float> from_bytes(const std::vector<char>& b, FloatKind kind, size_t n) {
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) {
    if (kind == FloatKind::kFloat32) {
      f[i] = reinterpret_cast<const float*>(b.data())[i];
    } else {
      const uint16_t h = reinterpret_cast<const uint16_t*>(b.data())[i];
      f[i] = kind == FloatKind::kFloat16 ? paddle_ext::fp16_to_float(h) : paddle_ext::bf16_to_float(h);
    }
  }
  return f;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) && std::isinf(b[i])) continue;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

struct Device {
  void* ptr = nullptr;
  explicit Device(size_t bytes) { PADDLE_EXT_GPU_CHECK(paddle_ext::gpu::malloc_device(&ptr, bytes ? bytes : 1)); }
  ~Device() { paddle_ext::gpu::free_device(ptr); }
};

void upload(Device& d, const void* src, size_t bytes) {
  PADDLE_EXT_GPU_CHECK(paddle_ext::gpu::memcpy_to_device_async(d.ptr, src, bytes, nullptr));
}
std::vector<char> download(const Device& d, size_t bytes) {
  std::vector<char> out(bytes);
  PADDLE_EXT_GPU_CHECK(paddle_ext::gpu::memcpy_to_host_async(out.data(), d.ptr, bytes, nullptr));
  PADDLE_EXT_GPU_CHECK(paddle_ext::gpu::stream_synchronize(nullptr));
  return out;
}

bool run_case(const Case& c, std::mt19937& rng) {
  fa::Problem p;
  p.kind = c.kind;
  p.batch = c.batch;
  p.heads_q = c.hq;
  p.heads_k = c.hk;
  p.head_dim = c.d;
  p.causal = c.causal;
  p.scale = 1.f / std::sqrt(static_cast<float>(c.d));
  p.dropout = c.dropout;
  p.seed = 1234;
  p.offset = 64;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  if (c.varlen) {  // lengths sq, 1, sq / 2 ... with the maximum sq
    for (int64_t b = 0; b < c.batch; ++b) {
      cu_q.push_back(cu_q.back() + static_cast<int32_t>(b == 1 ? 1 : c.sq / (b + 1)));
      cu_k.push_back(cu_k.back() + static_cast<int32_t>(b == 1 ? 1 : c.sk / (b + 1)));
    }
    p.total_q = cu_q.back();
    p.total_k = cu_k.back();
    p.lse_head_stride = p.total_q;
    p.lse_token_mult = 1;
  } else {
    p.total_q = c.batch * c.sq;
    p.total_k = c.batch * c.sk;
    p.lse_head_stride = c.sq;
    p.lse_token_mult = c.hq;
  }
  p.seqlen_q = c.sq;
  p.seqlen_k = c.sk;
  const size_t nq = p.total_q * c.hq * c.d, nk = p.total_k * c.hk * c.d, nl = c.hq * p.total_q;
  const size_t nsm = c.batch * c.hq * c.sq * c.sk;
  const size_t es = c.kind == FloatKind::kFloat32 ? 4 : 2;
  std::normal_distribution<float> normal;
  auto fill = [&](size_t n) {
    std::vector<float> x(n);
    for (auto& v : x) v = normal(rng);
    return x;
  };
  std::vector<float> q = fill(nq), k = fill(nk), v = fill(nk), dout = fill(nq);
  auto bytes_of = [&](const std::vector<float>& x) {
    std::vector<char> b(x.size() * es);
    if (c.kind == FloatKind::kFloat32) {
      std::memcpy(b.data(), x.data(), b.size());
    } else {
      const auto h = to_half(x, c.kind);
      std::memcpy(b.data(), h.data(), b.size());
    }
    return b;
  };
  const auto qb = bytes_of(q), kb = bytes_of(k), vb = bytes_of(v), db = bytes_of(dout);

  // CPU
  std::vector<char> out_c(nq * es), sm_c(nsm * es), dq_c(nq * es), dk_c(nk * es), dv_c(nk * es);
  std::vector<float> lse_c(nl);
  fa::Problem pc = p;
  if (c.varlen) {
    pc.cu_q = cu_q.data();
    pc.cu_k = cu_k.data();
  }
  fa::forward_cpu(pc, qb.data(), kb.data(), vb.data(), out_c.data(), lse_c.data());
  fa::softmax_cpu(pc, qb.data(), kb.data(), lse_c.data(), sm_c.data());
  fa::backward_cpu(pc, qb.data(), kb.data(), vb.data(), out_c.data(), db.data(), lse_c.data(), dq_c.data(),
                   dk_c.data(), dv_c.data());

  // GPU
  Device dq_(nq * es), dk_(nk * es), dv_(nk * es), dd(nq * es), dout_(nq * es), dlse(nl * 4), dsm(nsm * es);
  Device gdq(nq * es), gdk(nk * es), gdv(nk * es), dcq(cu_q.size() * 4), dck(cu_k.size() * 4);
  Device ws(static_cast<size_t>(fa::backward_gpu_workspace_bytes(p)));
  upload(dq_, qb.data(), qb.size());
  upload(dk_, kb.data(), kb.size());
  upload(dv_, vb.data(), vb.size());
  upload(dd, db.data(), db.size());
  fa::Problem pg = p;
  if (c.varlen) {
    upload(dcq, cu_q.data(), cu_q.size() * 4);
    upload(dck, cu_k.data(), cu_k.size() * 4);
    pg.cu_q = static_cast<const int32_t*>(dcq.ptr);
    pg.cu_k = static_cast<const int32_t*>(dck.ptr);
  }
  auto t0 = std::chrono::steady_clock::now();
  fa::forward_gpu(pg, dq_.ptr, dk_.ptr, dv_.ptr, dout_.ptr, static_cast<float*>(dlse.ptr), nullptr);
  PADDLE_EXT_GPU_CHECK(paddle_ext::gpu::stream_synchronize(nullptr));
  auto t1 = std::chrono::steady_clock::now();
  fa::backward_gpu(pg, dq_.ptr, dk_.ptr, dv_.ptr, dout_.ptr, dd.ptr, static_cast<float*>(dlse.ptr), gdq.ptr,
                   gdk.ptr, gdv.ptr, ws.ptr, nullptr);
  PADDLE_EXT_GPU_CHECK(paddle_ext::gpu::stream_synchronize(nullptr));
  auto t2 = std::chrono::steady_clock::now();
  fa::softmax_gpu(pg, dq_.ptr, dk_.ptr, static_cast<const float*>(dlse.ptr), dsm.ptr, nullptr);

  const auto out_g = download(dout_, nq * es), sm_g = download(dsm, nsm * es);
  const auto lse_g_bytes = download(dlse, nl * 4);
  std::vector<float> lse_g(nl);
  std::memcpy(lse_g.data(), lse_g_bytes.data(), nl * 4);
  const auto dq_g = download(gdq, nq * es), dk_g = download(gdk, nk * es), dv_g = download(gdv, nk * es);

  const double tol = c.kind == FloatKind::kFloat32 ? 1e-4 : 2e-2;
  const double e_out = max_rel(from_bytes(out_g, c.kind, nq), from_bytes(out_c, c.kind, nq));
  const double e_lse = max_rel(lse_g, lse_c);
  const double e_dq = max_rel(from_bytes(dq_g, c.kind, nq), from_bytes(dq_c, c.kind, nq));
  const double e_dk = max_rel(from_bytes(dk_g, c.kind, nk), from_bytes(dk_c, c.kind, nk));
  const double e_dv = max_rel(from_bytes(dv_g, c.kind, nk), from_bytes(dv_c, c.kind, nk));
  const auto smg = from_bytes(sm_g, c.kind, nsm), smc = from_bytes(sm_c, c.kind, nsm);
  size_t mask_diff = 0;
  for (size_t i = 0; i < nsm; ++i) mask_diff += std::signbit(smg[i]) != std::signbit(smc[i]);
  const bool ok = e_out < tol && e_lse < tol && e_dq < tol && e_dk < tol && e_dv < tol && mask_diff == 0;
  std::printf("%-28s out %.1e lse %.1e dq %.1e dk %.1e dv %.1e mask-diff %zu | fwd %.2f ms bwd %.2f ms  %s\n",
              c.name, e_out, e_lse, e_dq, e_dk, e_dv, mask_diff,
              std::chrono::duration<double, std::milli>(t1 - t0).count(),
              std::chrono::duration<double, std::milli>(t2 - t1).count(), ok ? "ok" : "FAIL");
  return ok;
}

}  // namespace

int main() {
  int devices = 0;
  const auto err = paddle_ext::gpu::device_count(&devices);
  if (err != paddle_ext::gpu::kSuccess || devices < 1) {
    std::printf("flash_attn_gpu_check: no GPU (%s)\n", paddle_ext::gpu::describe(err).c_str());
    return 2;
  }
  std::string name;
  paddle_ext::gpu::device_name(0, &name);
  std::printf("flash_attn_gpu_check on %s (%s), CPU kernels: %s\n", name.c_str(), paddle_ext::gpu::kPlatform,
              fa::cpu_isa());
  const Case cases[] = {
      {"f32 B2 S17 H2 D32", 2, 17, 17, 2, 2, 32, false, 0.f, FloatKind::kFloat32, false},
      {"f32 B1 S1 H2/1 D64", 1, 1, 1, 2, 1, 64, false, 0.f, FloatKind::kFloat32, false},
      {"f32 causal GQA S127", 1, 127, 127, 4, 2, 64, true, 0.f, FloatKind::kFloat32, false},
      {"f32 causal Sq100 Sk37 MQA", 2, 100, 37, 4, 1, 128, true, 0.f, FloatKind::kFloat32, false},
      {"f32 causal Sq37 Sk100 D256", 1, 37, 100, 2, 2, 256, true, 0.f, FloatKind::kFloat32, false},
      {"f32 dropout 0.3 causal", 2, 200, 200, 2, 2, 64, true, 0.3f, FloatKind::kFloat32, false},
      {"f32 varlen causal GQA", 3, 70, 50, 4, 2, 64, true, 0.f, FloatKind::kFloat32, true},
      {"f32 varlen dropout D40", 3, 70, 70, 2, 2, 40, false, 0.2f, FloatKind::kFloat32, true},
      {"f16 causal S256", 1, 256, 256, 4, 4, 64, true, 0.f, FloatKind::kFloat16, false},
      {"bf16 S256 dropout", 1, 256, 256, 4, 2, 128, false, 0.1f, FloatKind::kBFloat16, false},
      {"f32 B1 H8 S2048 D64 causal", 1, 2048, 2048, 8, 8, 64, true, 0.f, FloatKind::kFloat32, false},
  };
  std::mt19937 rng(7);
  int failed = 0;
  for (const Case& c : cases) failed += run_case(c, rng) ? 0 : 1;
  std::printf("flash_attn_gpu_check: %d of %zu cases failed\n", failed, sizeof(cases) / sizeof(cases[0]));
  return failed ? 1 : 0;
}
