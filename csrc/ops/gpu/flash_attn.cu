// GPU backend of FlashAttention-2 (declared in flash_attn.h): one source for
// CUDA (nvcc) and HIP (hipcc -x hip). Built with -DPADDLE_EXT_WITH_GPU
// -I csrc/ops; no Paddle header, so it also compiles standalone in the ci/ legs.
//
// The same algorithm as the CPU kernels, in float32 for every input dtype:
// an online softmax over key tiles, the per-row log-sum-exp saved, and a
// backward pass that recomputes the probabilities from it. A "group" is 32
// lanes (a CUDA warp, half an AMD wavefront: shuffles take width 32), four
// groups to a block; no shared memory and no block barrier, so groups may
// leave early.
//   forward / softmax: a group per query row; lanes take the keys of a tile
//     of 32 (one score each, the query row broadcast by shuffles), then the
//     group accumulates P V with each lane owning head_dim / 32 columns.
//   backward: (1) a group per query row computes D = rowsum(dO * O) (kept in
//     the workspace) and dQ, lanes as keys; (2) a group per key row of a kv
//     head computes dK and dV over every query of the heads that share it,
//     lanes as queries. Each gradient row is written by one group: no atomics,
//     deterministic.
// Dropout uses keep_element() of flash_attn.h, bit-identical to the CPU.
//
// These kernels favour simplicity over speed (no tensor cores). On CUDA
// sm_80+, forward_gpu and backward_gpu hand the bf16 / fp16 calls that
// gpu/flash_attn_tc.h takes (head dims 32, 64, 96, 128) to the tensor-core
// kernels; the rest, float32, and the softmax output, stay here.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/gpu_runtime.h"
#include "flash_attn.h"
#if defined(PADDLE_EXT_GPU_CUDA)
#include "gpu/flash_attn_tc.h"
#endif

#if defined(PADDLE_EXT_GPU_HIP)
#define PE_FA_SHFL(v, src) __shfl((v), (src), 32)
#define PE_FA_SHFL_XOR(v, mask) __shfl_xor((v), (mask), 32)
#else
#define PE_FA_SHFL(v, src) __shfl_sync(0xffffffffu, (v), (src), 32)
#define PE_FA_SHFL_XOR(v, mask) __shfl_xor_sync(0xffffffffu, (v), (mask), 32)
#endif

namespace paddle_ext::flash_attn {
namespace {

constexpr int kLanes = 32;
constexpr int kGroups = 4;
constexpr int kThreads = kLanes * kGroups;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

gpu::Stream as_stream(void* stream) { return static_cast<gpu::Stream>(stream); }

void check_launch() { PADDLE_EXT_GPU_CHECK(gpu::get_last_error()); }

__device__ inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

__device__ inline float group_sum(float v) {
  for (int m = kLanes / 2; m > 0; m >>= 1) v += PE_FA_SHFL_XOR(v, m);
  return v;
}

__device__ inline float group_max(float v) {
  for (int m = kLanes / 2; m > 0; m >>= 1) v = fmaxf(v, PE_FA_SHFL_XOR(v, m));
  return v;
}

// A row of head_dim values spread over the lanes: lane l holds columns l + 32 t.
template <int DV>
struct LaneRow {
  float x[DV];
  __device__ void load_row(DType kind, const void* base, int64_t off, int64_t D, int lane, float f) {
#pragma unroll
    for (int t = 0; t < DV; ++t) {
      const int64_t d = lane + kLanes * t;
      x[t] = d < D ? load_float<false>(kind, base, off + d) * f : 0.f;
    }
  }
  __device__ void store_row(DType kind, void* base, int64_t off, int64_t D, int lane, float f) const {
#pragma unroll
    for (int t = 0; t < DV; ++t) {
      const int64_t d = lane + kLanes * t;
      if (d < D) store_float<false>(kind, base, off + d, x[t] * f);
    }
  }
  // The dot product of this (distributed) row with the row each lane reads at
  // base + off_lane: every lane gets its own row's result.
  __device__ float dot_with_own(DType kind, const void* base, int64_t off_lane, bool valid, int64_t D) const {
    float acc = 0.f;
#pragma unroll
    for (int t = 0; t < DV; ++t) {
      for (int l = 0; l < kLanes; ++l) {
        const int64_t d = kLanes * t + l;
        const float xd = PE_FA_SHFL(x[t], l);
        if (valid && d < D) acc += xd * load_float<false>(kind, base, off_lane + d);
      }
    }
    return acc;
  }
  // this += sum over jj < n of w(jj) * row jj, where lane jj holds w(jj) in
  // w_lane and row jj starts at base + off0 + jj * rs.
  __device__ void add_weighted_rows(DType kind, const void* base, int64_t off0, int64_t rs, int64_t n, float w_lane,
                                    int64_t D, int lane) {
    for (int64_t jj = 0; jj < n; ++jj) {
      const float w = PE_FA_SHFL(w_lane, static_cast<int>(jj));
      const int64_t off = off0 + jj * rs;
#pragma unroll
      for (int t = 0; t < DV; ++t) {
        const int64_t d = lane + kLanes * t;
        if (d < D) x[t] += w * load_float<false>(kind, base, off + d);
      }
    }
  }
};

__device__ inline bool visible(const Problem& p, const Sequence& s, int64_t i, int64_t j) {
  return j < s.lk && (!p.causal || j <= i + causal_shift(p, s.lq, s.lk));
}

__device__ inline float dropout_scale(const Problem& p, uint64_t sub, int64_t i, int64_t j) {
  if (p.dropout <= 0.f) return 1.f;
  return keep_element(p.seed, sub, dropout_threshold(p.dropout), i, j) ? 1.f / (1.f - p.dropout) : 0.f;
}

// ---- forward -----------------------------------------------------------------

template <int DV>
__global__ void forward_kernel(Problem p, const void* q, const void* k, const void* v, void* out, float* lse) {
  const int lane = threadIdx.x % kLanes, group = threadIdx.x / kLanes;
  const int64_t b = blockIdx.z, h = blockIdx.y, i = int64_t{blockIdx.x} * kGroups + group;
  const Sequence s = sequence_of(p, b);
  if (i >= s.lq) return;
  const int64_t D = p.head_dim, kvh = h / (p.heads_q / p.heads_k);
  const int64_t q_rs = p.heads_q * D, k_rs = p.heads_k * D;
  const uint64_t sub = dropout_subsequence(p.offset, b, p.heads_q, h);
  LaneRow<DV> qrow, acc;
  qrow.load_row(p.kind, q, (s.q0 + i) * q_rs + h * D, D, lane, p.scale * kLog2e);
#pragma unroll
  for (int t = 0; t < DV; ++t) acc.x[t] = 0.f;
  float m = -INFINITY, l = 0.f;
  const int64_t kv_end = p.causal ? imin(s.lk, imax(0, i + 1 + causal_shift(p, s.lq, s.lk))) : s.lk;
  for (int64_t j0 = 0; j0 < kv_end; j0 += kLanes) {
    const int64_t j = j0 + lane;
    const bool ok = visible(p, s, i, j);
    const float score = qrow.dot_with_own(p.kind, k, (s.k0 + j) * k_rs + kvh * D, ok, D);
    const float sc = ok ? score : -INFINITY;
    const float mnew = fmaxf(m, group_max(sc));
    const float mref = mnew == -INFINITY ? 0.f : mnew;
    const float pj = ok ? exp2f(sc - mref) : 0.f;
    const float alpha = exp2f(m - mref);
    l = l * alpha + group_sum(pj);
    m = mnew;
    const float pz = ok ? pj * dropout_scale(p, sub, i, j) : 0.f;
#pragma unroll
    for (int t = 0; t < DV; ++t) acc.x[t] *= alpha;
    acc.add_weighted_rows(p.kind, v, (s.k0 + j0) * k_rs + kvh * D, k_rs, imin(kLanes, kv_end - j0), pz, D, lane);
  }
  acc.store_row(p.kind, out, (s.q0 + i) * q_rs + h * D, D, lane, l > 0.f ? 1.f / l : 0.f);
  if (lane == 0) lse[lse_index(p, s, h, i)] = l > 0.f ? (m + log2f(l)) * kLn2 : INFINITY;
}

template <int DV>
__global__ void softmax_kernel(Problem p, const void* q, const void* k, const float* lse, void* softmax) {
  const int lane = threadIdx.x % kLanes, group = threadIdx.x / kLanes;
  const int64_t b = blockIdx.z, h = blockIdx.y, i = int64_t{blockIdx.x} * kGroups + group;
  const Sequence s = sequence_of(p, b);
  if (i >= s.lq) return;
  const int64_t D = p.head_dim, kvh = h / (p.heads_q / p.heads_k);
  const int64_t q_rs = p.heads_q * D, k_rs = p.heads_k * D;
  const uint64_t sub = dropout_subsequence(p.offset, b, p.heads_q, h);
  LaneRow<DV> qrow;
  qrow.load_row(p.kind, q, (s.q0 + i) * q_rs + h * D, D, lane, p.scale * kLog2e);
  const float lse2 = lse[lse_index(p, s, h, i)] * kLog2e;
  const int64_t row = ((b * p.heads_q + h) * p.seqlen_q + i) * p.seqlen_k;
  for (int64_t j0 = 0; j0 < s.lk; j0 += kLanes) {
    const int64_t j = j0 + lane;
    const bool ok = visible(p, s, i, j) && lse2 != INFINITY;
    const float score = qrow.dot_with_own(p.kind, k, (s.k0 + j) * k_rs + kvh * D, ok, D);
    if (j < s.lk) {
      float pj = ok ? exp2f(score - lse2) : 0.f;
      if (p.dropout > 0.f && dropout_scale(p, sub, i, j) == 0.f) pj = -pj;
      store_float<false>(p.kind, softmax, row + j, pj);
    }
  }
}

// ---- backward ------------------------------------------------------------------

// dQ rows, and D = rowsum(dO * O) into di[h * total_q + token].
template <int DV>
__global__ void backward_dq_kernel(Problem p, const void* q, const void* k, const void* v, const void* out,
                                   const void* dout, const float* lse, void* dq, float* di) {
  const int lane = threadIdx.x % kLanes, group = threadIdx.x / kLanes;
  const int64_t b = blockIdx.z, h = blockIdx.y, i = int64_t{blockIdx.x} * kGroups + group;
  const Sequence s = sequence_of(p, b);
  if (i >= s.lq) return;
  const int64_t D = p.head_dim, kvh = h / (p.heads_q / p.heads_k);
  const int64_t q_rs = p.heads_q * D, k_rs = p.heads_k * D;
  const int64_t qoff = (s.q0 + i) * q_rs + h * D;
  const uint64_t sub = dropout_subsequence(p.offset, b, p.heads_q, h);
  LaneRow<DV> qrow, dorow, orow, acc;
  qrow.load_row(p.kind, q, qoff, D, lane, p.scale * kLog2e);
  dorow.load_row(p.kind, dout, qoff, D, lane, 1.f);
  orow.load_row(p.kind, out, qoff, D, lane, 1.f);
  float part = 0.f;
#pragma unroll
  for (int t = 0; t < DV; ++t) {
    part += dorow.x[t] * orow.x[t];
    acc.x[t] = 0.f;
  }
  const float Di = group_sum(part);
  if (lane == 0) di[h * p.total_q + s.q0 + i] = Di;
  const float lse2 = lse[lse_index(p, s, h, i)] * kLog2e;
  const int64_t kv_end = p.causal ? imin(s.lk, imax(0, i + 1 + causal_shift(p, s.lq, s.lk))) : s.lk;
  for (int64_t j0 = 0; j0 < kv_end; j0 += kLanes) {
    const int64_t j = j0 + lane;
    const bool ok = visible(p, s, i, j) && lse2 != INFINITY;
    const int64_t koff = (s.k0 + j) * k_rs + kvh * D;
    const float score = qrow.dot_with_own(p.kind, k, koff, ok, D);
    const float dpv = dorow.dot_with_own(p.kind, v, koff, ok, D);
    const float pj = ok ? exp2f(score - lse2) : 0.f;
    const float ds = ok ? pj * (dpv * dropout_scale(p, sub, i, j) - Di) * p.scale : 0.f;
    acc.add_weighted_rows(p.kind, k, (s.k0 + j0) * k_rs + kvh * D, k_rs, imin(kLanes, kv_end - j0), ds, D, lane);
  }
  acc.store_row(p.kind, dq, qoff, D, lane, 1.f);
}

// dK and dV rows of key j, kv head kvh: sums over every query of the group's heads.
template <int DV>
__global__ void backward_dkv_kernel(Problem p, const void* q, const void* k, const void* v, const void* dout,
                                    const float* lse, const float* di, void* dk, void* dv) {
  const int lane = threadIdx.x % kLanes, group = threadIdx.x / kLanes;
  const int64_t b = blockIdx.z, kvh = blockIdx.y, j = int64_t{blockIdx.x} * kGroups + group;
  const Sequence s = sequence_of(p, b);
  if (j >= s.lk) return;
  const int64_t D = p.head_dim, G = p.heads_q / p.heads_k;
  const int64_t q_rs = p.heads_q * D, k_rs = p.heads_k * D;
  const int64_t koff = (s.k0 + j) * k_rs + kvh * D;
  LaneRow<DV> krow, vrow, dkacc, dvacc;
  krow.load_row(p.kind, k, koff, D, lane, p.scale * kLog2e);
  vrow.load_row(p.kind, v, koff, D, lane, 1.f);
#pragma unroll
  for (int t = 0; t < DV; ++t) dkacc.x[t] = dvacc.x[t] = 0.f;
  // Queries that see key j: all, or causal i >= j - (lk - lq).
  const int64_t i_begin = p.causal ? imax(0, j - causal_shift(p, s.lq, s.lk)) : 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t h = kvh * G + g;
    const uint64_t sub = dropout_subsequence(p.offset, b, p.heads_q, h);
    for (int64_t i0 = i_begin; i0 < s.lq; i0 += kLanes) {
      const int64_t i = i0 + lane;
      const bool in = i < s.lq;
      const int64_t qoff = (s.q0 + i) * q_rs + h * D;
      const float lse2 = in ? lse[lse_index(p, s, h, i)] * kLog2e : INFINITY;
      const bool ok = in && visible(p, s, i, j) && lse2 != INFINITY;
      const float score = krow.dot_with_own(p.kind, q, qoff, ok, D);
      const float dpv = vrow.dot_with_own(p.kind, dout, qoff, ok, D);
      const float pj = ok ? exp2f(score - lse2) : 0.f;
      const float z = ok ? dropout_scale(p, sub, i, j) : 0.f;
      const float ds = ok ? pj * (dpv * z - di[h * p.total_q + s.q0 + i]) * p.scale : 0.f;
      const float pz = pj * z;
      const int64_t n = imin(kLanes, s.lq - i0), off0 = (s.q0 + i0) * q_rs + h * D;
      dkacc.add_weighted_rows(p.kind, q, off0, q_rs, n, ds, D, lane);
      dvacc.add_weighted_rows(p.kind, dout, off0, q_rs, n, pz, D, lane);
    }
  }
  dkacc.store_row(p.kind, dk, koff, D, lane, 1.f);
  dvacc.store_row(p.kind, dv, koff, D, lane, 1.f);
}

dim3 grid_for(int64_t rows, int64_t heads, int64_t batch) {
  return dim3(static_cast<unsigned>(std::max<int64_t>(1, (rows + kGroups - 1) / kGroups)),
              static_cast<unsigned>(heads), static_cast<unsigned>(batch));
}

// Runs LAUNCH (a statement using the constant DV) with DV = head_dim / 32
// rounded up, 1..8 (head_dim <= 256).
#define PE_FA_WITH_DV(head_dim, LAUNCH)                          \
  switch (((head_dim) + kLanes - 1) / kLanes) {                  \
    case 1: { constexpr int DV = 1; LAUNCH; } break;             \
    case 2: { constexpr int DV = 2; LAUNCH; } break;             \
    case 3: { constexpr int DV = 3; LAUNCH; } break;             \
    case 4: { constexpr int DV = 4; LAUNCH; } break;             \
    case 5: { constexpr int DV = 5; LAUNCH; } break;             \
    case 6: { constexpr int DV = 6; LAUNCH; } break;             \
    case 7: { constexpr int DV = 7; LAUNCH; } break;             \
    default: { constexpr int DV = 8; LAUNCH; } break;            \
  }

bool empty(const Problem& p) { return p.batch == 0 || p.heads_q == 0 || p.seqlen_q == 0; }

}  // namespace

void forward_gpu(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                 void* stream) {
  if (empty(p)) return;
#if defined(PADDLE_EXT_GPU_CUDA)
  if (tc::takes(p, {q, k, v, out})) return tc::forward(p, q, k, v, out, lse, stream);
#endif
  const dim3 grid = grid_for(p.seqlen_q, p.heads_q, p.batch);
  PE_FA_WITH_DV(p.head_dim, (forward_kernel<DV><<<grid, kThreads, 0, as_stream(stream)>>>(p, q, k, v, out, lse)))
  check_launch();
}

void softmax_gpu(const Problem& p, const void* q, const void* k, const float* lse, void* softmax, void* stream) {
  if (empty(p)) return;
  const size_t bytes = static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q * p.seqlen_k) *
                       dtype_bytes(p.kind);
  PADDLE_EXT_GPU_CHECK(gpu::memset_async(softmax, 0, bytes, as_stream(stream)));
  const dim3 grid = grid_for(p.seqlen_q, p.heads_q, p.batch);
  PE_FA_WITH_DV(p.head_dim, (softmax_kernel<DV><<<grid, kThreads, 0, as_stream(stream)>>>(p, q, k, lse, softmax)))
  check_launch();
}

int64_t backward_gpu_workspace_bytes(const Problem& p) {
  const int64_t simple = std::max<int64_t>(1, p.heads_q * p.total_q) * static_cast<int64_t>(sizeof(float));
#if defined(PADDLE_EXT_GPU_CUDA)
  return std::max(simple, tc::backward_workspace_bytes(p));  // whether they take it is known at the call
#endif
  return simple;
}

void backward_gpu(const Problem& p, const void* q, const void* k, const void* v, const void* out,
                  const void* dout, const float* lse, void* dq, void* dk, void* dv, void* workspace,
                  void* stream) {
  const int64_t esize = dtype_bytes(p.kind);
  if (p.total_k > 0) {  // keys no query sees (and every key when there is no query) get zero grads
    const size_t bytes = static_cast<size_t>(p.total_k * p.heads_k * p.head_dim * esize);
    PADDLE_EXT_GPU_CHECK(gpu::memset_async(dk, 0, bytes, as_stream(stream)));
    PADDLE_EXT_GPU_CHECK(gpu::memset_async(dv, 0, bytes, as_stream(stream)));
  }
  if (empty(p)) return;
#if defined(PADDLE_EXT_GPU_CUDA)
  if (tc::takes(p, {q, k, v, out, dout, dq, dk, dv, workspace})) {
    return tc::backward(p, q, k, v, out, dout, lse, dq, dk, dv, workspace, stream);
  }
#endif
  float* di = static_cast<float*>(workspace);
  const dim3 qgrid = grid_for(p.seqlen_q, p.heads_q, p.batch);
  PE_FA_WITH_DV(p.head_dim, (backward_dq_kernel<DV><<<qgrid, kThreads, 0, as_stream(stream)>>>(
                                p, q, k, v, out, dout, lse, dq, di)))
  check_launch();
  if (p.seqlen_k == 0) return;
  const dim3 kgrid = grid_for(p.seqlen_k, p.heads_k, p.batch);
  PE_FA_WITH_DV(p.head_dim, (backward_dkv_kernel<DV><<<kgrid, kThreads, 0, as_stream(stream)>>>(
                                p, q, k, v, dout, lse, di, dk, dv)))
  check_launch();
}

}  // namespace paddle_ext::flash_attn
