// FlashAttention-2 (upstream #55758 / #56015, RNG control #52902), declared on
// raw pointers so each backend lives in its own file: cpu/flash_attn_cpu.cc,
// gpu/flash_attn.cu (CUDA and HIP), and the Paddle registration in
// flash_attn_op.cc. No Paddle header here.
//
// One problem description covers the padded layout ([B, S, H, D]) and the
// variable-length one ([total_tokens, H, D] with cumulative sequence lengths):
// sequence b's queries are tokens [q_begin(b), q_end(b)) of q / out, its keys
// and values tokens [k_begin(b), k_end(b)) of k / v; a token is a row of
// heads * head_dim contiguous elements (head-major within the row).
//
// Semantics, for query head h, kv head h / (heads_q / heads_k) (grouped-query
// and multi-query attention):
//   s[i, j] = scale * q[i] . k[j]
//   causal: key j is visible from query i iff j <= i + causal_shift(), where
//     the shift is 0 for the top-left alignment (Paddle's FlashAttention-2
//     fork and its CPU math path: query i sees keys j <= i) and Lk - Lq for
//     the bottom-right one (flash-attention >= 2.1, PyTorch); a query that
//     sees no key (bottom-right, Lq > Lk) gives out = 0 and lse = +inf.
//   p = softmax_j(s) over visible keys, lse[i] = log(sum_j exp(s[i, j]))
//   dropout p_drop > 0: out[i] = sum_j p[i, j] * z[i, j] * v[j] with
//     z = keep / (1 - p_drop), keep drawn by keep_element() below.
#pragma once

#include <cstdint>

#include "common/float_io.h"

namespace paddle_ext::flash_attn {

// Head dims: any on CPU (one not a multiple of kHeadDimMultiple, the vector
// width, runs on zero-padded float32 copies); up to kMaxHeadDim on GPU
// (flash-attention 2's range).
constexpr int64_t kMaxHeadDim = 256;
constexpr int64_t kHeadDimMultiple = 8;
// The generator offset one call consumes per (sequence, query head), as in
// flash-attention: each (b, h) draws from its own 32-wide offset slot.
constexpr uint64_t kOffsetPerHead = 32;

struct Problem {
  DType kind = DType::kFloat32;  // q, k, v, out, grads; lse is always float32
  int64_t batch = 0;
  int64_t heads_q = 0;
  int64_t heads_k = 0;
  int64_t head_dim = 0;
  // Cumulative token counts, batch + 1 entries each (CPU: host memory, GPU:
  // device memory), or null for the padded layout: then sequence b holds
  // tokens [b * seqlen, (b + 1) * seqlen).
  const int32_t* cu_q = nullptr;
  const int32_t* cu_k = nullptr;
  int64_t seqlen_q = 0;  // padded: every sequence's length; varlen: the maximum
  int64_t seqlen_k = 0;
  int64_t total_q = 0;   // tokens in q / k
  int64_t total_k = 0;
  float scale = 1.f;
  bool causal = false;
  bool causal_bottom_right = false;  // causal mask alignment: false = top-left (Paddle's)
  float dropout = 0.f;   // probability of dropping; 0 = no dropout
  uint64_t seed = 0;
  uint64_t offset = 0;
  // lse[h * lse_head_stride + q_begin(b) * lse_token_mult + i]: padded
  // [B, Hq, Sq] has (Sq, Hq); varlen [Hq, total_q] has (total_q, 1).
  int64_t lse_head_stride = 0;
  int64_t lse_token_mult = 1;
  // FlashMask (padded layout, CPU only): null, or int32 [batch, mask_heads,
  // seqlen_k, mask_cols] in host memory, Paddle's startend_row_indices. For
  // key column j the query rows it is hidden from: causal, 1 column (LTS):
  // rows >= LTS; causal, 2 (LTS, LTE): [LTS, LTE); not causal, 2 (LTS, UTE):
  // rows >= LTS and rows < UTE; not causal, 4: [LTS, LTE) and [UTS, UTE).
  // mask_heads is 1 (all heads), heads_q or heads_k.
  const int32_t* startend = nullptr;
  int64_t mask_heads = 0;
  int64_t mask_cols = 0;
};

// The causal diagonal's shift for a sequence of lq queries and lk keys: key j
// is visible from query i iff j <= i + shift.
PADDLE_EXT_HOST_DEVICE inline int64_t causal_shift(const Problem& p, int64_t lq, int64_t lk) {
  return p.causal_bottom_right ? lk - lq : 0;
}

// Where sequence b's queries and keys lie: tokens [q0, q0 + lq) of q / out and
// [k0, k0 + lk) of k / v (cu_q / cu_k must be readable where this runs).
struct Sequence {
  int64_t q0, lq, k0, lk;
};

PADDLE_EXT_HOST_DEVICE inline Sequence sequence_of(const Problem& p, int64_t b) {
  if (p.cu_q != nullptr) {
    return {p.cu_q[b], static_cast<int64_t>(p.cu_q[b + 1]) - p.cu_q[b], p.cu_k[b],
            static_cast<int64_t>(p.cu_k[b + 1]) - p.cu_k[b]};
  }
  return {b * p.seqlen_q, p.seqlen_q, b * p.seqlen_k, p.seqlen_k};
}

// The lse element of query i (within sequence s) of query head h.
PADDLE_EXT_HOST_DEVICE inline int64_t lse_index(const Problem& p, const Sequence& s, int64_t h, int64_t i) {
  return h * p.lse_head_stride + s.q0 * p.lse_token_mult + i;
}

// ---- dropout: Philox4x32-10, counter-based -------------------------------
// keep(b, h, i, j) for sequence b, query head h, query row i and key column j
// (positions within the sequence): Philox4x32-10 with key = seed and counter
// (j / 4, i, lo32(s), hi32(s)), s = offset + (b * heads_q + h) * 32, word j % 4;
// an element is kept when that word >= threshold(p). The same bits on every
// backend, in forward and backward.

struct Philox4 {
  uint32_t x[4];
};

PADDLE_EXT_HOST_DEVICE inline void mulhilo32(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

PADDLE_EXT_HOST_DEVICE inline Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                                   uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(0xD2511F53u, c0, &hi0, &lo0);
    mulhilo32(0xCD9E8D57u, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Words below the threshold are dropped: P(drop) = threshold / 2^32.
PADDLE_EXT_HOST_DEVICE inline uint32_t dropout_threshold(float p) {
  const double t = static_cast<double>(p) * 4294967296.0;
  return t >= 4294967295.0 ? 4294967295u : static_cast<uint32_t>(t);
}

PADDLE_EXT_HOST_DEVICE inline uint64_t dropout_subsequence(uint64_t offset, int64_t b, int64_t heads_q,
                                                           int64_t h) {
  return offset + static_cast<uint64_t>(b * heads_q + h) * kOffsetPerHead;
}

// Four consecutive columns j4*4 .. j4*4+3 of row i.
PADDLE_EXT_HOST_DEVICE inline Philox4 dropout_bits(uint64_t seed, uint64_t subsequence, int64_t i, int64_t j4) {
  return philox4x32_10(static_cast<uint32_t>(j4), static_cast<uint32_t>(i), static_cast<uint32_t>(subsequence),
                       static_cast<uint32_t>(subsequence >> 32), static_cast<uint32_t>(seed),
                       static_cast<uint32_t>(seed >> 32));
}

PADDLE_EXT_HOST_DEVICE inline bool keep_element(uint64_t seed, uint64_t subsequence, uint32_t threshold, int64_t i,
                                                int64_t j) {
  return dropout_bits(seed, subsequence, i, j >> 2).x[j & 3] >= threshold;
}

// ---- CPU backend (cpu/flash_attn_cpu.cc) -----------------------------------
// Inputs and outputs in `kind`; cu_q / cu_k in host memory. Threads: see
// common/parallel.h (paddle_ext.ops.set_num_threads, PADDLE_EXT_NUM_THREADS).

void forward_cpu(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse);

// The attention probabilities of a forward that wrote `lse`, into softmax
// [batch, heads_q, seqlen_q, seqlen_k] (`kind`; rows and columns beyond a
// sequence's lengths are 0). With dropout, dropped entries are negated (the
// flash-attention convention: the sign bit carries the mask).
void softmax_cpu(const Problem& p, const void* q, const void* k, const float* lse, void* softmax);

// dq, dk, dv (shapes of q, k, v) from dout; recomputes the probabilities from
// lse, in blocks: extra memory is linear in the sequence lengths.
void backward_cpu(const Problem& p, const void* q, const void* k, const void* v, const void* out,
                  const void* dout, const float* lse, void* dq, void* dk, void* dv);

// Which vectorised code path the CPU kernels take: "avx2" or "generic".
const char* cpu_isa();

#if defined(PADDLE_EXT_WITH_GPU)
// ---- GPU backend (gpu/flash_attn.cu): same contract, device pointers, --------
// `stream` a cudaStream_t / hipStream_t. float32 accumulation.
void forward_gpu(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                 void* stream);
void softmax_gpu(const Problem& p, const void* q, const void* k, const float* lse, void* softmax, void* stream);
// `workspace`: at least backward_gpu_workspace_bytes(p) bytes of device memory.
int64_t backward_gpu_workspace_bytes(const Problem& p);
void backward_gpu(const Problem& p, const void* q, const void* k, const void* v, const void* out,
                  const void* dout, const float* lse, void* dq, void* dk, void* dv, void* workspace, void* stream);
#endif

}  // namespace paddle_ext::flash_attn
