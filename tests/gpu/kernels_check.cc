// The kernel half of tests/gpu/device_check.sh, without Paddle: every case
// runs the CPU kernel against a float64 reference computed here from the same
// (rounded) inputs, and, where a GPU is there, the GPU kernel against the CPU
// kernel. One table row per case:
//
//   kernel  case  cpu-vs-f64  gpu-vs-cpu  notes  status
//
// Errors are ||x - ref|| / ||ref|| over every output of the case (the largest
// one is printed); tolerances 1e-5 (float32), 5e-3 (float16), 1e-2 (bfloat16).
// Flash attention: forward (out, lse), backward (dq, dk, dv), causal masks in
// both alignments (causal-tl: top-left, causal-br: bottom-right), the dropout mask
// (the sign bits of softmax_*) against the reference's keep_element() bits,
// the same on the GPU as on the CPU, and replayed bit for bit by a second run;
// GPU outputs are poisoned (NaN) before each run, so an unwritten element fails.
// Rotary: forward and backward, tables or computed angles, position ids, both
// pairings, time-major, every dtype; the position check. c_embedding: the CPU
// kernels against a gather / float64 scatter-add and the id check (the GPU
// kernels against these CPU ones: csrc/tools/device_probe.cc).
//
// Exit status: 1 when a check fails, else 0 with a GPU and 77 without one
// (the CPU half passed, the GPU half was skipped).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <chrono>

#include "c_embedding.h"
#include "flash_attn_tc_emulated.h"
#include "kernel_calls.h"
#include "rotary.h"

namespace {

using namespace gpu_check;
namespace gpu = paddle_ext::gpu;
namespace ro = paddle_ext::rotary;
namespace ce = paddle_ext::c_embedding;

bool have_gpu = false;
// --flash PART[,PART...]: only the flash cases whose name contains a part,
// without the emulated rows, rotary and c_embedding (what compute-sanitizer runs).
std::string only_flash;

bool selected(const std::string& name) {
  if (only_flash.empty()) return true;
  size_t begin = 0;
  for (;;) {
    const size_t end = only_flash.find(',', begin);
    if (name.find(only_flash.substr(begin, end - begin)) != std::string::npos) return true;
    if (end == std::string::npos) return false;
    begin = end + 1;
  }
}
int checks = 0, failures = 0, todos = 0;
std::mt19937 rng(20261202);

double tolerance(DType kind) {
  return kind == DType::kFloat32 ? 1e-5 : kind == DType::kFloat16 ? 5e-3 : 1e-2;
}

std::string fmt_error(double e) {
  if (std::isnan(e)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1e", e);
  return b;
}

void row(const char* kernel, const std::string& name, double cpu_ref, double gpu_cpu, const std::string& notes,
         const char* status) {
  std::printf("%-9s %-36s %10s %10s  %-34s %s\n", kernel, name.c_str(), fmt_error(cpu_ref).c_str(),
              fmt_error(gpu_cpu).c_str(), notes.c_str(), status);
  std::fflush(stdout);
}

void result(const char* kernel, const std::string& name, double cpu_ref, double gpu_cpu, const std::string& notes,
            bool ok) {
  ++checks;
  if (!ok) ++failures;
  row(kernel, name, cpu_ref, gpu_cpu, notes, ok ? "ok" : "FAIL");
}

// Runs one case; an exception is that case's failure.
void guarded(const char* kernel, const std::string& name, const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    result(kernel, name, NAN, NAN, std::string("error: ") + e.what(), false);
  }
}

std::vector<float> normal_values(int64_t n, float stddev = 1.f) {
  std::normal_distribution<float> normal(0.f, stddev);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = normal(rng);
  return x;
}

// ---- flash attention ----------------------------------------------------------

struct FlashReference {
  std::vector<double> out, lse, dq, dk, dv;
  // Softmax layout [B, Hq, Sq, Sk]: 1 kept, 0 dropped, 2 not visible.
  std::vector<uint8_t> kept;
};

// The definition of flash_attn.h's semantics, in float64 from the rounded inputs.
FlashReference flash_reference(const FlashShape& s, const std::vector<float>& q, const std::vector<float>& k,
                               const std::vector<float>& v, const std::vector<float>& dout) {
  const int64_t D = s.head_dim, Hq = s.heads_q, Hk = s.heads_k, group = Hq / Hk;
  FlashReference r;
  r.out.assign(q.size(), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(k.size(), 0.0);
  r.lse.assign(static_cast<size_t>(s.lse_elems()), 0.0);
  r.kept.assign(static_cast<size_t>(s.softmax_elems()), 2);
  const double scale = s.scale();
  const uint32_t threshold = fa::dropout_threshold(s.dropout);
  std::vector<double> p, z, dp;
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t q0 = s.q_begin(b), lq = s.q_len(b), k0 = s.k_begin(b), lk = s.k_len(b);
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / group;
      const uint64_t sub = fa::dropout_subsequence(s.offset, b, Hq, h);
      for (int64_t i = 0; i < lq; ++i) {
        const float* qi = &q[((q0 + i) * Hq + h) * D];
        const float* doi = &dout[((q0 + i) * Hq + h) * D];
        p.assign(lk, 0.0);
        z.assign(lk, 0.0);
        dp.assign(lk, 0.0);
        double m = -INFINITY;
        for (int64_t j = 0; j < lk; ++j) {
          if (!visible(s, lq, lk, i, j)) continue;
          const float* kj = &k[((k0 + j) * Hk + kvh) * D];
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(qi[d]) * kj[d];
          p[j] = dot * scale;
          m = std::max(m, p[j]);
        }
        double l = 0;
        for (int64_t j = 0; j < lk; ++j)
          if (visible(s, lq, lk, i, j)) l += std::exp(p[j] - m);
        const double lse = l > 0 ? m + std::log(l) : INFINITY;
        r.lse[s.lse_index(b, h, i)] = lse;
        const int64_t sm_row = ((b * Hq + h) * s.seqlen_q + i) * s.seqlen_k;
        for (int64_t j = 0; j < lk; ++j) {
          if (!visible(s, lq, lk, i, j)) {
            p[j] = 0;
            continue;
          }
          p[j] = std::exp(p[j] - lse);
          const bool keep = s.dropout <= 0.f || fa::keep_element(s.seed, sub, threshold, i, j);
          z[j] = keep ? 1.0 / (1.0 - s.dropout) : 0.0;
          r.kept[sm_row + j] = keep ? 1 : 0;
        }
        double di = 0;
        for (int64_t j = 0; j < lk; ++j) {
          if (p[j] == 0) continue;
          const float* vj = &v[((k0 + j) * Hk + kvh) * D];
          double o = 0;
          for (int64_t d = 0; d < D; ++d) {
            r.out[((q0 + i) * Hq + h) * D + d] += p[j] * z[j] * vj[d];
            o += double(doi[d]) * vj[d];
          }
          dp[j] = o;
          di += p[j] * z[j] * o;
        }
        for (int64_t j = 0; j < lk; ++j) {
          if (p[j] == 0) continue;
          const double ds = p[j] * (z[j] * dp[j] - di) * scale;
          const float* kj = &k[((k0 + j) * Hk + kvh) * D];
          for (int64_t d = 0; d < D; ++d) {
            r.dq[((q0 + i) * Hq + h) * D + d] += ds * kj[d];
            r.dk[((k0 + j) * Hk + kvh) * D + d] += ds * qi[d];
            r.dv[((k0 + j) * Hk + kvh) * D + d] += p[j] * z[j] * doi[d];
          }
        }
      }
    }
  }
  return r;
}

struct FlashOutputs {
  std::vector<char> out, sm, dq, dk, dv;
  std::vector<float> lse;
};

FlashOutputs flash_cpu(const FlashShape& s, const std::vector<char>& q, const std::vector<char>& k,
                       const std::vector<char>& v, const std::vector<char>& dout) {
  const int64_t es = dtype_bytes(s.kind);
  FlashOutputs o;
  o.out.resize(s.q_elems() * es);
  o.dq.resize(s.q_elems() * es);
  o.dk.resize(s.k_elems() * es);
  o.dv.resize(s.k_elems() * es);
  o.sm.resize(s.softmax_elems() * es);
  o.lse.resize(s.lse_elems());
  const fa::Problem p = make_problem(s, s.cu_q.data(), s.cu_k.data());
  flash_forward_cpu(p, q.data(), k.data(), v.data(), o.out.data(), o.lse.data());
  flash_softmax_cpu(p, q.data(), k.data(), o.lse.data(), o.sm.data());
  flash_backward_cpu(p, q.data(), k.data(), v.data(), o.out.data(), dout.data(), o.lse.data(), o.dq.data(),
                     o.dk.data(), o.dv.data());
  return o;
}

// Forward, softmax and backward on the GPU, every output poisoned first.
FlashOutputs flash_gpu(const FlashShape& s, uint64_t offset, const DeviceBuffer& q, const DeviceBuffer& k,
                       const DeviceBuffer& v, const DeviceBuffer& dout, const DeviceBuffer& cu_q,
                       const DeviceBuffer& cu_k) {
  const int64_t es = dtype_bytes(s.kind);
  FlashShape shifted = s;
  shifted.offset = offset;
  const fa::Problem p = make_problem(shifted, cu_q.get<const int32_t>(), cu_k.get<const int32_t>());
  DeviceBuffer out(s.q_elems() * es), lse(s.lse_elems() * 4), sm(s.softmax_elems() * es);
  DeviceBuffer dq(s.q_elems() * es), dk(s.k_elems() * es), dv(s.k_elems() * es);
  DeviceBuffer ws(static_cast<size_t>(flash_backward_workspace_bytes(p)));
  for (const DeviceBuffer* b : {&out, &lse, &sm, &dq, &dk, &dv}) b->poison();
  flash_forward_gpu(p, q.get(), k.get(), v.get(), out.get(), lse.get<float>(), nullptr);
  flash_softmax_gpu(p, q.get(), k.get(), lse.get<const float>(), sm.get(), nullptr);
  flash_backward_gpu(p, q.get(), k.get(), v.get(), out.get(), dout.get(), lse.get<const float>(), dq.get(),
                     dk.get(), dv.get(), ws.get(), nullptr);
  PADDLE_EXT_GPU_CHECK(gpu::stream_synchronize(nullptr));
  FlashOutputs o;
  o.out = out.bytes();
  o.sm = sm.bytes();
  o.dq = dq.bytes();
  o.dk = dk.bytes();
  o.dv = dv.bytes();
  o.lse = lse.values<float>();
  return o;
}

// The largest error over out, lse, dq, dk, dv of `a` against `ref`.
template <class Ref>
double flash_error(const FlashShape& s, const FlashOutputs& a, const Ref& out, const Ref& lse, const Ref& dq,
                   const Ref& dk, const Ref& dv) {
  const DType kind = s.kind;
  return std::max({rel_error(to_floats(a.out, kind), out), rel_error(a.lse, lse), rel_error(to_floats(a.dq, kind), dq),
                   rel_error(to_floats(a.dk, kind), dk), rel_error(to_floats(a.dv, kind), dv)});
}

// Entries whose sign bit (the dropout mask) differs, over visible entries.
size_t mask_differences(const std::vector<float>& sm, const std::vector<uint8_t>& kept) {
  size_t n = 0;
  for (size_t i = 0; i < sm.size(); ++i)
    if (kept[i] != 2 && (kept[i] == 1) == std::signbit(sm[i])) ++n;
  return n;
}

struct FlashCase {
  std::string name;
  FlashShape shape;
  bool reference = true;  // false: too large for the float64 reference (GPU against CPU only)
};

// Variable lengths (maxima seqlen_q / seqlen_k are the largest given).
FlashShape varlen(FlashShape s, const std::vector<int32_t>& lq, const std::vector<int32_t>& lk) {
  s.batch = static_cast<int64_t>(lq.size());
  s.cu_q = {0};
  s.cu_k = {0};
  for (size_t b = 0; b < lq.size(); ++b) {
    s.cu_q.push_back(s.cu_q.back() + lq[b]);
    s.cu_k.push_back(s.cu_k.back() + lk[b]);
  }
  s.seqlen_q = *std::max_element(lq.begin(), lq.end());
  s.seqlen_k = *std::max_element(lk.begin(), lk.end());
  return s;
}

// The tensor-core kernels (the code a CUDA sm_80+ GPU runs for bf16 / fp16 at
// head dims 32-128) under the CPU warp emulator, every output poisoned first:
// against the CPU kernels (the pass criterion) and the float64 reference. One
// forward; the backward with each way of computing dQ (rows flash-tc: atomics,
// the GPU's default; flash-tc-det: the deterministic recomputing kernel).
void run_flash_tc_emulated(const FlashCase& c, const std::vector<char>& qb, const std::vector<char>& kb,
                           const std::vector<char>& vb, const std::vector<char>& db, const FlashOutputs& cpu,
                           const FlashReference& r) {
  const FlashShape& s = c.shape;
  const fa::Problem p = make_problem(s, s.cu_q.data(), s.cu_k.data());
  if (!tc_kernels_take(p)) return;
  const int64_t es = dtype_bytes(s.kind);
  FlashOutputs e;
  e.out.assign(s.q_elems() * es, static_cast<char>(0xFF));
  e.lse.assign(s.lse_elems(), NAN);
  auto as_double = [&](const std::vector<char>& b) {
    const std::vector<float> f = to_floats(b, s.kind);
    return std::vector<double>(f.begin(), f.end());
  };
  const std::vector<double> cpu_lse(cpu.lse.begin(), cpu.lse.end());
  const auto t0 = std::chrono::steady_clock::now();
  tc_emulated_forward(p, qb.data(), kb.data(), vb.data(), e.out.data(), e.lse.data());
  const double forward_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const bool deterministic : {false, true}) {
    e.dq.assign(s.q_elems() * es, static_cast<char>(0xFF));
    e.dk.assign(s.k_elems() * es, static_cast<char>(0xFF));
    e.dv.assign(s.k_elems() * es, static_cast<char>(0xFF));
    const auto t1 = std::chrono::steady_clock::now();
    tc_emulated_backward(p, qb.data(), kb.data(), vb.data(), e.out.data(), db.data(), e.lse.data(), e.dq.data(),
                         e.dk.data(), e.dv.data(), deterministic);
    const double seconds = forward_s + std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    const double vs_cpu = flash_error(s, e, as_double(cpu.out), cpu_lse, as_double(cpu.dq), as_double(cpu.dk),
                                      as_double(cpu.dv));
    const double vs_f64 = flash_error(s, e, r.out, r.lse, r.dq, r.dk, r.dv);
    char notes[112];
    std::snprintf(notes, sizeof notes, "emulated tensor cores, dQ by %s, vs f64 %s, %.1f s",
                  deterministic ? "recompute" : "atomics", fmt_error(vs_f64).c_str(), seconds);
    result(deterministic ? "flash-tc-det" : "flash-tc", c.name, NAN, vs_cpu, notes,
           vs_cpu < tolerance(s.kind) && vs_f64 < tolerance(s.kind));
  }
}

void run_flash_case(const FlashCase& c) {
  const FlashShape& s = c.shape;
  if (s.causal && s.align == CausalAlign::kTopLeft && s.seqlen_q != s.seqlen_k && !kHasTopLeftCausal) {
    ++todos;
    row("flash", c.name, NAN, NAN, "TODO: the kernels have no top-left mask", "todo");
    return;
  }
  if (!c.reference && !have_gpu) {
    row("flash", c.name, NAN, NAN, "GPU against CPU only: no GPU", "skip");
    return;
  }
  const DType kind = s.kind;
  const std::vector<char> qb = to_bytes(normal_values(s.q_elems()), kind), kb = to_bytes(normal_values(s.k_elems()), kind),
                          vb = to_bytes(normal_values(s.k_elems()), kind),
                          db = to_bytes(normal_values(s.q_elems()), kind);
  const FlashOutputs cpu = flash_cpu(s, qb, kb, vb, db);
  const double tol = tolerance(kind);
  bool ok = true;
  std::string notes;
  double cpu_ref = NAN, gpu_cpu = NAN;
  std::vector<uint8_t> kept;
  if (c.reference) {
    const FlashReference r = flash_reference(s, to_floats(qb, kind), to_floats(kb, kind), to_floats(vb, kind),
                                             to_floats(db, kind));
    cpu_ref = flash_error(s, cpu, r.out, r.lse, r.dq, r.dk, r.dv);
    ok &= cpu_ref < tol;
    kept = r.kept;
    const size_t diff = mask_differences(to_floats(cpu.sm, kind), kept);
    ok &= diff == 0;
    if (s.dropout > 0.f) {
      size_t visible_n = 0, dropped = 0;
      for (uint8_t x : kept) {
        visible_n += x != 2;
        dropped += x == 0;
      }
      char b[64];
      std::snprintf(b, sizeof b, "mask cpu %zu diff, dropped %.3f", diff, double(dropped) / std::max<size_t>(visible_n, 1));
      notes = b;
      // CPU replay: the same call again gives the same bytes.
      const FlashOutputs again = flash_cpu(s, qb, kb, vb, db);
      if (again.out != cpu.out || again.dq != cpu.dq || again.dk != cpu.dk || again.dv != cpu.dv) {
        ok = false;
        notes += ", CPU replay differs";
      }
    }
    if (only_flash.empty()) guarded("flash-tc", c.name, [&] { run_flash_tc_emulated(c, qb, kb, vb, db, cpu, r); });
  }
  if (have_gpu) {
    DeviceBuffer q(qb), k(kb), v(vb), dout(db), cu_q(s.cu_q), cu_k(s.cu_k);
    const FlashOutputs g = flash_gpu(s, s.offset, q, k, v, dout, cu_q, cu_k);
    std::vector<double> cpu_lse(cpu.lse.begin(), cpu.lse.end());
    auto as_double = [&](const std::vector<char>& b) {
      const std::vector<float> f = to_floats(b, kind);
      return std::vector<double>(f.begin(), f.end());
    };
    gpu_cpu = flash_error(s, g, as_double(cpu.out), cpu_lse, as_double(cpu.dq), as_double(cpu.dk), as_double(cpu.dv));
    ok &= gpu_cpu < tol;
    size_t diff = 0;
    const std::vector<float> smg = to_floats(g.sm, kind), smc = to_floats(cpu.sm, kind);
    for (size_t i = 0; i < smg.size(); ++i) diff += std::signbit(smg[i]) != std::signbit(smc[i]);
    ok &= diff == 0;
    char b[96];
    std::snprintf(b, sizeof b, "%smask gpu %zu diff", notes.empty() ? "" : "; ", diff);
    notes += b;
    // Replay: the same inputs, seed and offset give the same bytes (mask
    // included); another offset gives another mask.
    // The tensor-core kernels' default dQ sums by atomics, in no fixed order: its
    // replay is checked bitwise under their deterministic mode below.
    const bool tc = tc_kernels_take(make_problem(s, nullptr, nullptr));
    const FlashOutputs again = flash_gpu(s, s.offset, q, k, v, dout, cu_q, cu_k);
    const bool replay = again.out == g.out && again.sm == g.sm && (tc || again.dq == g.dq) && again.dk == g.dk &&
                        again.dv == g.dv;
    ok &= replay;
    notes += replay ? (tc ? ", replay same (dQ: below)" : ", replay same") : ", REPLAY DIFFERS";
    if (tc) {
      // The call went to the tensor-core kernels: their deterministic dQ (twice,
      // bitwise) and the simple kernels, forced, too.
      setenv("PADDLE_EXT_FLASH_ATTN_GPU_KERNEL", "deterministic", 1);
      const FlashOutputs det = flash_gpu(s, s.offset, q, k, v, dout, cu_q, cu_k);
      const FlashOutputs det2 = flash_gpu(s, s.offset, q, k, v, dout, cu_q, cu_k);
      const double de = flash_error(s, det, as_double(cpu.out), cpu_lse, as_double(cpu.dq), as_double(cpu.dk),
                                    as_double(cpu.dv));
      const bool same = det.out == det2.out && det.dq == det2.dq && det.dk == det2.dk && det.dv == det2.dv;
      ok &= de < tol && same;
      notes += ", deterministic " + fmt_error(de) + (same ? " replay same" : " REPLAY DIFFERS");
      setenv("PADDLE_EXT_FLASH_ATTN_GPU_KERNEL", "simple", 1);
      const FlashOutputs simple = flash_gpu(s, s.offset, q, k, v, dout, cu_q, cu_k);
      unsetenv("PADDLE_EXT_FLASH_ATTN_GPU_KERNEL");
      const double e = flash_error(s, simple, as_double(cpu.out), cpu_lse, as_double(cpu.dq), as_double(cpu.dk),
                                   as_double(cpu.dv));
      ok &= e < tol;
      notes += ", simple kernels " + fmt_error(e);
    }
    if (s.dropout > 0.f) {
      const FlashOutputs other = flash_gpu(s, s.offset + fa::kOffsetPerHead * s.batch * s.heads_q, q, k, v, dout,
                                           cu_q, cu_k);
      const bool differs = other.sm != g.sm;
      ok &= differs;
      notes += differs ? ", new offset new mask" : ", SAME MASK AT NEW OFFSET";
    }
  }
  result("flash", c.name, cpu_ref, gpu_cpu, notes, ok);
}

std::vector<FlashCase> flash_cases() {
  using F = DType;
  const auto TL = CausalAlign::kTopLeft;
  return {
      {"f32 B2 S17 H2 D32", flash_shape(F::kFloat32, 2, 17, 17, 2, 2, 32, false)},
      {"f32 B1 S1 H2/1 D64 (MQA)", flash_shape(F::kFloat32, 1, 1, 1, 2, 1, 64, false)},
      {"f32 causal GQA S127 D64", flash_shape(F::kFloat32, 1, 127, 127, 4, 2, 64, true)},
      {"f32 causal-br Sq100 Sk37 MQA D128", flash_shape(F::kFloat32, 2, 100, 37, 4, 1, 128, true)},
      {"f32 causal-br Sq37 Sk100 D256", flash_shape(F::kFloat32, 1, 37, 100, 2, 2, 256, true)},
      {"f32 causal-tl Sq100 Sk37 MQA D128", flash_shape(F::kFloat32, 2, 100, 37, 4, 1, 128, true, 0.f, TL)},
      {"f32 causal-tl Sq37 Sk100 D256", flash_shape(F::kFloat32, 1, 37, 100, 2, 2, 256, true, 0.f, TL)},
      {"f32 S300 D40", flash_shape(F::kFloat32, 1, 300, 300, 2, 2, 40, false)},
      {"f32 causal-tl Sq50 Sk70 GQA D59", flash_shape(F::kFloat32, 2, 50, 70, 4, 2, 59, true, 0.f, TL)},
      {"bf16 causal-tl Sq192 Sk64 D128", flash_shape(F::kBFloat16, 1, 192, 64, 2, 2, 128, true, 0.f, TL)},
      {"f32 dropout 0.3 causal S200", flash_shape(F::kFloat32, 2, 200, 200, 2, 2, 64, true, 0.3f)},
      {"f32 varlen causal GQA", varlen(flash_shape(F::kFloat32, 0, 0, 0, 4, 2, 64, true), {70, 1, 23}, {50, 1, 23})},
      {"f32 varlen dropout D40", varlen(flash_shape(F::kFloat32, 0, 0, 0, 2, 2, 40, false, 0.2f), {70, 1, 35}, {70, 9, 35})},
      {"f32 varlen causal-tl", varlen(flash_shape(F::kFloat32, 0, 0, 0, 2, 2, 64, true, 0.f, TL), {40, 9}, {20, 30})},
      {"f16 causal S256 D64", flash_shape(F::kFloat16, 1, 256, 256, 4, 4, 64, true)},
      {"f16 varlen dropout GQA D128", varlen(flash_shape(F::kFloat16, 0, 0, 0, 4, 2, 128, false, 0.1f), {90, 33}, {64, 33})},
      {"bf16 S256 dropout GQA D128", flash_shape(F::kBFloat16, 1, 256, 256, 4, 2, 128, false, 0.1f)},
      {"bf16 varlen causal GQA D128", varlen(flash_shape(F::kBFloat16, 0, 0, 0, 4, 1, 128, true), {128, 65, 7}, {128, 65, 7})},
      {"bf16 causal-br Sq64 Sk192 D128", flash_shape(F::kBFloat16, 1, 64, 192, 2, 2, 128, true)},
      // For the tensor-core kernels (bf16 / fp16, D 32-128): tile edges, every
      // supported head dim, rows that see no key, dropout with varlen.
      {"bf16 S130 H2 D32", flash_shape(F::kBFloat16, 1, 130, 130, 2, 2, 32, false)},
      {"f16 causal-tl Sq100 Sk37 GQA D96", flash_shape(F::kFloat16, 2, 100, 37, 4, 2, 96, true, 0.f, TL)},
      {"bf16 causal-br Sq37 Sk100 MQA D64", flash_shape(F::kBFloat16, 1, 37, 100, 2, 1, 64, true)},
      {"bf16 causal-br Sq100 Sk37 D64", flash_shape(F::kBFloat16, 1, 100, 37, 2, 2, 64, true)},
      {"bf16 varlen causal-tl dropout D64", varlen(flash_shape(F::kBFloat16, 0, 0, 0, 2, 2, 64, true, 0.2f, TL), {70, 1, 35}, {20, 9, 100})},
      {"f16 causal-br dropout Sq80 Sk150 D128", flash_shape(F::kFloat16, 1, 80, 150, 2, 2, 128, true, 0.3f)},
      {"f32 B1 H8 S2048 D64 causal", flash_shape(F::kFloat32, 1, 2048, 2048, 8, 8, 64, true), false},
      {"bf16 B2 H8/2 S1024 D128 causal", flash_shape(F::kBFloat16, 2, 1024, 1024, 8, 2, 128, true), false},
  };
}

// ---- rotary -------------------------------------------------------------------

std::vector<char> rotary_bytes(const std::vector<double>& x, DType t) {
  std::vector<char> b(x.size() * paddle_ext::dtype_bytes(t));
  for (size_t i = 0; i < x.size(); ++i) {
    if (t == DType::kFloat64) {
      std::memcpy(b.data() + 8 * i, &x[i], 8);
    } else if (t == DType::kFloat32) {
      const float f = static_cast<float>(x[i]);
      std::memcpy(b.data() + 4 * i, &f, 4);
    } else {
      const float f = static_cast<float>(x[i]);
      const uint16_t h = t == DType::kFloat16 ? paddle_ext::float_to_fp16(f) : paddle_ext::float_to_bf16(f);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}

std::vector<double> rotary_values(const std::vector<char>& b, DType t) {
  const size_t n = b.size() / paddle_ext::dtype_bytes(t);
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::kFloat64) {
      std::memcpy(&x[i], b.data() + 8 * i, 8);
    } else if (t == DType::kFloat32) {
      float f;
      std::memcpy(&f, b.data() + 4 * i, 4);
      x[i] = f;
    } else {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      x[i] = t == DType::kFloat16 ? paddle_ext::fp16_to_float(h) : paddle_ext::bf16_to_float(h);
    }
  }
  return x;
}

double rotary_tolerance(DType t) {
  return t == DType::kFloat64 ? 1e-12 : t == DType::kFloat32 ? 1e-6 : t == DType::kFloat16 ? 5e-3 : 1e-2;
}

struct RotaryCase {
  std::string name;
  DType dtype;
  int64_t batch, seq, heads, head_dim;
  bool time_major, adjacent, tables, position_ids;
};

// rotary.h's formula in float64 (tables read as stored, angles computed).
std::vector<double> rotary_reference(const RotaryCase& c, const std::vector<double>& x, const std::vector<double>& sin,
                                     const std::vector<double>& cos, const std::vector<int64_t>& pos, bool backward) {
  const int64_t D = c.head_dim, half = D / 2;
  std::vector<double> out(x.size()), cr(D), sr(D);
  auto partner = [&](int64_t i) { return c.adjacent ? i ^ 1 : (i < half ? i + half : i - half); };
  auto sigma = [&](int64_t i) { return (c.adjacent ? (i & 1) == 0 : i < half) ? -1.0 : 1.0; };
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t t = 0; t < c.seq; ++t) {
      const int64_t p = c.position_ids ? pos[b * c.seq + t] : t;
      for (int64_t i = 0; i < D; ++i) {
        if (c.tables) {
          cr[i] = cos[p * D + i];
          sr[i] = sin[p * D + i];
        } else {
          const double angle = double(p) / std::pow(10000.0, double(2 * (i / 2)) / double(D));
          cr[i] = std::cos(angle);
          sr[i] = std::sin(angle);
        }
      }
      const int64_t token = c.time_major ? t * c.batch + b : b * c.seq + t;
      for (int64_t h = 0; h < c.heads; ++h) {
        const int64_t base = (token * c.heads + h) * D;
        for (int64_t i = 0; i < D; ++i) {
          const int64_t j = partner(i);
          out[base + i] = backward ? x[base + i] * cr[i] - sigma(i) * x[base + j] * sr[j]
                                   : x[base + i] * cr[i] + sigma(i) * x[base + j] * sr[i];
        }
      }
    }
  }
  return out;
}

void run_rotary_case(const RotaryCase& c) {
  const int64_t n = c.batch * c.seq * c.heads * c.head_dim, rows = c.seq + 5;
  std::vector<double> x(n), sin(rows * c.head_dim), cos(rows * c.head_dim);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> angle(-3.2, 3.2);
  for (auto& e : x) e = normal(rng);
  const int64_t half = c.head_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < half; ++j) {  // a pair shares its angle, as real tables do
      const double a = angle(rng);
      for (int64_t i : {c.adjacent ? 2 * j : j, c.adjacent ? 2 * j + 1 : j + half}) {
        cos[r * c.head_dim + i] = std::cos(a);
        sin[r * c.head_dim + i] = std::sin(a);
      }
    }
  }
  std::vector<int64_t> pos(c.batch * c.seq);
  std::uniform_int_distribution<int64_t> any_row(0, rows - 1);
  for (auto& p : pos) p = any_row(rng);
  const std::vector<char> xb = rotary_bytes(x, c.dtype), sb = rotary_bytes(sin, c.dtype), cb = rotary_bytes(cos, c.dtype);
  const std::vector<double> xr = rotary_values(xb, c.dtype), sr = rotary_values(sb, c.dtype), cr = rotary_values(cb, c.dtype);
  ro::Problem p;
  p.dtype = c.dtype;
  p.batch = c.batch;
  p.seq = c.seq;
  p.heads = c.heads;
  p.head_dim = c.head_dim;
  p.time_major = c.time_major;
  p.adjacent_pairs = c.adjacent;
  if (c.tables) {
    p.sin = sb.data();
    p.cos = cb.data();
    p.table_rows = rows;
    if (c.position_ids) p.position_ids = pos.data();
  }
  const double tol = rotary_tolerance(c.dtype);
  double cpu_ref = 0, gpu_cpu = NAN;
  std::vector<char> fwd(xb.size()), bwd(xb.size());
  p.in = xb.data();
  p.out = fwd.data();
  ro::forward_cpu(p);
  p.out = bwd.data();
  ro::backward_cpu(p);
  cpu_ref = std::max(rel_error(rotary_values(fwd, c.dtype), rotary_reference(c, xr, sr, cr, pos, false)),
                     rel_error(rotary_values(bwd, c.dtype), rotary_reference(c, xr, sr, cr, pos, true)));
  bool ok = cpu_ref < tol;
  if (have_gpu) {
    DeviceBuffer dx(xb), ds(sb), dc(cb), dpos(pos), dout(xb.size()), dgrad(xb.size());
    ro::Problem g = p;
    g.in = dx.get();
    if (c.tables) {
      g.sin = ds.get();
      g.cos = dc.get();
      if (c.position_ids) g.position_ids = dpos.get<const int64_t>();
    }
    dout.poison();
    dgrad.poison();
    g.out = dout.get();
    ro::forward_gpu(g, nullptr);
    g.out = dgrad.get();
    ro::backward_gpu(g, nullptr);
    PADDLE_EXT_GPU_CHECK(gpu::stream_synchronize(nullptr));
    gpu_cpu = std::max(rel_error(rotary_values(dout.bytes(), c.dtype), rotary_values(fwd, c.dtype)),
                       rel_error(rotary_values(dgrad.bytes(), c.dtype), rotary_values(bwd, c.dtype)));
    ok &= gpu_cpu < tol;
  }
  result("rotary", c.name, cpu_ref, gpu_cpu, "forward + backward", ok);
}

void run_rotary_position_check() {
  const int64_t n = 5000, rows = 64;
  std::vector<int64_t> ids(n);
  std::uniform_int_distribution<int64_t> any_row(0, rows - 1);
  for (auto& id : ids) id = any_row(rng);
  bool ok = ro::find_bad_position_cpu(ids.data(), n, rows).index == -1;
  ids[3001] = rows;
  ids[4000] = -2;
  const ro::BadPosition cpu = ro::find_bad_position_cpu(ids.data(), n, rows);
  ok &= cpu.index == 3001 && cpu.value == rows;
  std::string notes = "first bad: cpu " + std::to_string(cpu.index);
  if (have_gpu) {
    DeviceBuffer d(ids);
    const ro::BadPosition g = ro::find_bad_position_gpu(d.get<const int64_t>(), n, rows, nullptr);
    ok &= g.index == cpu.index && g.value == cpu.value;
    ids[3001] = 0;
    ids[4000] = 0;
    DeviceBuffer good(ids);
    ok &= ro::find_bad_position_gpu(good.get<const int64_t>(), n, rows, nullptr).index == -1;
    notes += ", gpu " + std::to_string(g.index);
  }
  result("rotary", "position ids in [0, rows) check", NAN, NAN, notes, ok);
}

std::vector<RotaryCase> rotary_cases() {
  using T = DType;
  return {
      {"f32 tables+ids adjacent", T::kFloat32, 2, 33, 3, 64, false, true, true, true},
      {"f32 tables rotate-half time-major", T::kFloat32, 3, 17, 2, 128, true, false, true, false},
      {"f32 computed angles rotate-half", T::kFloat32, 2, 40, 4, 96, false, false, false, false},
      {"f64 computed angles adjacent", T::kFloat64, 1, 50, 2, 64, false, true, false, false},
      {"f16 tables+ids rotate-half", T::kFloat16, 2, 31, 4, 128, false, false, true, true},
      {"bf16 tables adjacent time-major", T::kBFloat16, 2, 64, 8, 128, true, true, true, false},
      {"bf16 computed angles adjacent", T::kBFloat16, 1, 300, 2, 64, false, true, false, false},
  };
}

// ---- c_embedding --------------------------------------------------------------

template <class IdT>
void run_c_embedding_case(DType kind, int64_t rows, int64_t width, int64_t start, int64_t vocab, int64_t n) {
  const std::string name = std::string(kind_name(kind)) + (sizeof(IdT) == 8 ? " int64" : " int32") + " rows " +
                           std::to_string(rows) + " width " + std::to_string(width) + " n " + std::to_string(n);
  std::uniform_int_distribution<int64_t> any_id(0, vocab - 1);
  std::vector<IdT> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<IdT>(i % 5 == 0 ? start : any_id(rng));  // duplicates
  const std::vector<char> table = to_bytes(normal_values(rows * width), kind);
  const std::vector<char> grad_out = to_bytes(normal_values(n * width), kind);
  const int64_t row_bytes = width * dtype_bytes(kind);
  std::vector<char> out(n * row_bytes), expect(n * row_bytes, 0);
  ce::forward_cpu(table.data(), rows, row_bytes, ids.data(), n, start, out.data());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = static_cast<int64_t>(ids[i]) - start;
    if (r >= 0 && r < rows) std::memcpy(expect.data() + i * row_bytes, table.data() + r * row_bytes, row_bytes);
  }
  bool ok = out == expect;
  std::vector<char> grad(rows * row_bytes);
  ce::backward_cpu(kind, grad_out.data(), ids.data(), n, rows, width, start, grad.data());
  const std::vector<float> g = to_floats(grad_out, kind);
  std::vector<double> ref(rows * width, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = static_cast<int64_t>(ids[i]) - start;
    if (r < 0 || r >= rows) continue;
    for (int64_t w = 0; w < width; ++w) ref[r * width + w] += g[i * width + w];
  }
  const double err = rel_error(to_floats(grad, kind), ref);
  ok &= err < tolerance(kind);
  ok &= ce::find_out_of_range_cpu(ids.data(), n, vocab).position == -1;
  ids[n / 2] = static_cast<IdT>(-7);
  ids[n - 1] = static_cast<IdT>(vocab);
  const ce::BadId bad = ce::find_out_of_range_cpu(ids.data(), n, vocab);
  ok &= bad.position == n / 2 && bad.id == -7;
  // a negative vocab_size lifts only the upper bound (Paddle's GPU kernel's check)
  const ce::BadId negative = ce::find_out_of_range_cpu(ids.data(), n, int64_t{-1});
  ok &= negative.position == n / 2 && negative.id == -7;
  result("c_embed", name, err, NAN,
         std::string("fwd ") + (out == expect ? "exact" : "DIFFERS") + ", id check at " + std::to_string(bad.position) +
             (have_gpu ? "; gpu: device_probe" : ""),
         ok);
}

// ---- element conversions ----------------------------------------------------

// common/float_io.h's DTypeIo<kFloat16> on the host (half_simd.h's branch-free
// conversions, which the CPU kernels vectorise) against half.h's, which the GPU
// kernels use: every float16 loads to the same float (a signalling NaN to its
// quiet twin), every float32 stores to the same float16.
void run_float16_io_check() {
  using Io = paddle_ext::DTypeIo<DType::kFloat16>;
  int64_t load_diffs = 0, store_diffs = 0;
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const uint32_t want = paddle_ext::float_to_bits(paddle_ext::fp16_to_float(static_cast<uint16_t>(h)));
    const bool signalling = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0 && (h & 0x200u) == 0;
    load_diffs += paddle_ext::float_to_bits(Io::load(static_cast<uint16_t>(h))) != (signalling ? want | 0x400000u : want);
  }
  uint32_t bits = 0;
  do {
    const float f = paddle_ext::bits_to_float(bits);
    store_diffs += Io::store(f) != paddle_ext::float_to_fp16(f);
  } while (++bits != 0);
  result("dtype_io", "f16 host vs half.h, every input", NAN, NAN,
         std::to_string(load_diffs) + " loads, " + std::to_string(store_diffs) + " stores differ",
         load_diffs == 0 && store_diffs == 0);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--flash" && i + 1 < argc) {
      only_flash = argv[++i];
    } else {
      std::fprintf(stderr, "usage: kernels_check [--flash NAME-PART[,NAME-PART...]]\n");
      return 2;
    }
  }
  int devices = 0;
  const gpu::Error err = gpu::device_count(&devices);
  have_gpu = err == gpu::kSuccess && devices > 0;
  if (have_gpu) {
    std::string name;
    PADDLE_EXT_GPU_CHECK(gpu::device_name(0, &name));
    PADDLE_EXT_GPU_CHECK(gpu::set_device(0));
    std::printf("kernels_check: GPU %s (%s); CPU kernels: flash attention %s\n", name.c_str(), gpu::kPlatform,
                fa::cpu_isa());
  } else {
    std::printf("kernels_check: no GPU (%s): the CPU half only (CPU kernels against float64)\n",
                err != gpu::kSuccess ? gpu::describe(err).c_str() : "the runtime reports 0 devices");
    (void)gpu::get_last_error();
  }
  std::printf("%-9s %-36s %10s %10s  %-34s %s\n", "kernel", "case", "cpu-vs-f64", "gpu-vs-cpu", "notes", "status");
  for (const FlashCase& c : flash_cases()) {
    if (!selected(c.name)) continue;
    guarded("flash", c.name, [&] { run_flash_case(c); });
  }
  if (!only_flash.empty()) {
    std::printf("kernels_check: %d checks (flash cases matching \"%s\"), %d failed\n", checks, only_flash.c_str(),
                failures);
    return failures ? 1 : have_gpu ? 0 : 77;
  }
  guarded("dtype_io", "f16 every input", [] { run_float16_io_check(); });
  for (const RotaryCase& c : rotary_cases()) guarded("rotary", c.name, [&] { run_rotary_case(c); });
  guarded("rotary", "position check", [] { run_rotary_position_check(); });
  for (DType kind : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    guarded("c_embed", kind_name(kind), [&] { run_c_embedding_case<int64_t>(kind, 37, 8, 5, 60, 1000); });
    guarded("c_embed", kind_name(kind), [&] { run_c_embedding_case<int32_t>(kind, 37, 3, 0, 37, 1000); });
  }
  guarded("c_embed", "f32 70000 rows", [] { run_c_embedding_case<int64_t>(DType::kFloat32, 70000, 5, 1000, 140000, 6161); });
  std::printf("kernels_check: %d checks, %d failed, %d todo%s\n", checks, failures, todos,
              have_gpu ? "" : " (GPU half skipped: no GPU)");
  if (failures) return 1;
  return have_gpu ? 0 : 77;
}
