// The ISA-specific half of the FlashAttention CPU kernels, included twice by
// flash_attn_cpu.cc: once for the portable baseline (VecGeneric) and once
// inside `#pragma GCC target("avx2,fma")` (VecAvx2), each time into its own
// namespace (PE_FA_NS). No include guard on purpose.
//
// Everything works on float32 tiles:
//  - a register-blocked micro-kernel C[6 x 16] (+)= A[6 x K] B[K x 16] with
//    A given by row and column strides (so A may be a transposed tile) and B
//    row-major with contiguous columns (a key/value row, or a packed K^T / V^T
//    panel of 16 columns);
//  - row-wise max / exp2 / sum for the online softmax, in log2 units (the
//    scores are scaled by scale * log2(e) inside the exponent's fused
//    multiply-add; softmax_block pre-multiplies its query tile instead).
//
// Expects, from the includer: PE_FA_NS, PE_FA_VEC, and in the enclosing
// namespace: Ctx, Sequence, sequence_of(), kBlockQ, kBlockK, kPanel, dropout_row_scalar(),
// store_rows(), load_rows(), flashmask_cover(), flashmask_block().

namespace PE_FA_NS {

using V = PE_FA_VEC;
using VT = typename V::T;
constexpr int kMR = 6;  // micro-kernel rows
constexpr int kW = V::kWidth;
static_assert(kPanel == 2 * kW, "a panel is two vectors wide");

enum Mode { kStore = 0, kAdd = 1, kScaleAdd = 2 };

// z[j] = 1 / (1 - p) for kept and 0 for dropped elements (i, k0 + j), j < n
// (n a multiple of 16; z has room for n rounded up to 32): V::dropout32 draws
// 32 columns (8 Philox counters) at a time where the ISA has it.
inline void dropout_row(const Ctx& ctx, uint64_t subsequence, int64_t i, int64_t k0, int64_t n, float* z) {
  if constexpr (V::kHasPhilox8) {
    for (int64_t j = 0; j < n; j += 32)
      V::dropout32(ctx.p.seed, subsequence, i, (k0 + j) >> 2, ctx.threshold, ctx.inv_keep, z + j);
  } else {
    dropout_row_scalar(ctx, subsequence, i, k0, n, z);
  }
}

// Inner products are summed in chunks of kChunk: each chunk from zero in the
// registers, then added to C. One chain over the whole K (a head_dim of 256,
// or a key block of 256) lost up to ~3x the float32 accuracy of Paddle's own
// matmul (MKL), and with it flash-attention's 2x accuracy rule at large
// head_dim; blocked sums bound the error by about (kChunk + K / kChunk)
// roundings instead of K, for one load-add-store of the C tile per chunk.
constexpr int64_t kChunk = 32;

// C[M x NV*8] (op)= A B. A(m, k) = a[m * a_rs + k * a_cs], B(k, n) = b[k * b_rs + n],
// C(m, n) = c[m * c_rs + n]; kScaleAdd: C = alpha[m] * C + A B.
template <int M, int NV>
inline void micro(int64_t K, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t b_rs, float* c,
                  int64_t c_rs, int mode, const float* alpha) {
  for (int64_t k0 = 0;; k0 += kChunk, mode = kAdd) {  // chunks after the first add to C
    const int64_t k1 = std::min<int64_t>(K, k0 + kChunk);
    VT acc[M][NV];
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < NV; ++n) acc[m][n] = V::zero();
    for (int64_t k = k0; k < k1; ++k) {
      VT bv[NV];
      for (int n = 0; n < NV; ++n) bv[n] = V::load(b + k * b_rs + n * kW);
      const float* ak = a + k * a_cs;
      for (int m = 0; m < M; ++m) {
        const VT av = V::set1(ak[m * a_rs]);
        for (int n = 0; n < NV; ++n) acc[m][n] = V::fma(av, bv[n], acc[m][n]);
      }
    }
    for (int m = 0; m < M; ++m) {
      float* cm = c + m * c_rs;
      for (int n = 0; n < NV; ++n) {
        VT r = acc[m][n];
        if (mode == kAdd) {
          r = V::add(r, V::load(cm + n * kW));
        } else if (mode == kScaleAdd) {
          r = V::fma(V::set1(alpha[m]), V::load(cm + n * kW), r);
        }
        V::store(cm + n * kW, r);
      }
    }
    if (k1 >= K) break;
  }
}

template <int NV>
inline void micro_rows(int rows, int64_t K, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                       int64_t b_rs, float* c, int64_t c_rs, int mode, const float* alpha) {
  switch (rows) {
    case 6: micro<6, NV>(K, a, a_rs, a_cs, b, b_rs, c, c_rs, mode, alpha); break;
    case 5: micro<5, NV>(K, a, a_rs, a_cs, b, b_rs, c, c_rs, mode, alpha); break;
    case 4: micro<4, NV>(K, a, a_rs, a_cs, b, b_rs, c, c_rs, mode, alpha); break;
    case 3: micro<3, NV>(K, a, a_rs, a_cs, b, b_rs, c, c_rs, mode, alpha); break;
    case 2: micro<2, NV>(K, a, a_rs, a_cs, b, b_rs, c, c_rs, mode, alpha); break;
    default: micro<1, NV>(K, a, a_rs, a_cs, b, b_rs, c, c_rs, mode, alpha); break;
  }
}

// gemm() over row tiles of kMR rows where tile t takes only the columns
// below n_end[t] (a multiple of 8; null: N) and the inner indices below
// k_end[t] (null: K):
// a causal diagonal block's ragged shape. Panels outside, tiles inside, so
// each B panel comes into L1 once for all tiles (per-tile products fetched
// every panel again per tile, from L2).
inline void gemm_tiles(int64_t M, int64_t N, int64_t K, const int64_t* n_end, const int64_t* k_end, const float* a,
                       int64_t a_rs, int64_t a_cs, const float* b, int64_t b_rs, int64_t b_ps, float* c, int64_t c_rs,
                       int mode, const float* alpha = nullptr) {
  for (int64_t n = 0; n < N; n += kPanel) {
    const bool full = n + kPanel <= N;
    const float* bn = b_ps ? b + (n / kPanel) * b_ps : b + n;
    for (int64_t m = 0, t = 0; m < M; m += kMR, ++t) {
      if (n_end != nullptr && n >= n_end[t]) continue;
      const int64_t kk = k_end != nullptr ? k_end[t] : K;
      const int rows = static_cast<int>(std::min<int64_t>(kMR, M - m));
      const float* am = a + m * a_rs;
      float* cm = c + m * c_rs + n;
      const float* al = alpha ? alpha + m : nullptr;
      if (full && (n_end == nullptr || n + kPanel <= n_end[t])) {
        micro_rows<2>(rows, kk, am, a_rs, a_cs, bn, b_rs, cm, c_rs, mode, al);
      } else {
        micro_rows<1>(rows, kk, am, a_rs, a_cs, bn, b_rs, cm, c_rs, mode, al);
      }
    }
  }
}

// C[M x N] (op)= A[M x K] B[K x N], N a multiple of 8. B(k, n) = b[k * b_rs + n]
// when b_ps == 0; otherwise B is stored as panels of 16 columns, b_ps apart:
// B(k, n) = b[(n / 16) * b_ps + k * b_rs + n % 16].
inline void gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                 int64_t b_rs, int64_t b_ps, float* c, int64_t c_rs, int mode, const float* alpha = nullptr) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // an empty product: C = alpha * C (kScaleAdd), C (kAdd) or 0
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        c[m * c_rs + n] = mode == kStore ? 0.f : mode == kAdd ? c[m * c_rs + n] : alpha[m] * c[m * c_rs + n];
    return;
  }
  gemm_tiles(M, N, K, nullptr, nullptr, a, a_rs, a_cs, b, b_rs, b_ps, c, c_rs, mode, alpha);
}

// n is a multiple of 8.
inline float row_max(const float* s, int64_t n) {
  VT mx = V::set1(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < n; j += kW) mx = V::max(mx, V::load(s + j));
  return V::hmax(mx);
}

// s = 2^(c s - m), c s - m in one fused multiply-add; returns the sum. The
// scores come unscaled: scaling the query by c = scale * log2(e) before the
// product rounded each of its elements, about doubling the scores' error.
inline float exp2_sub_sum(float* s, int64_t n, float m, float c = 1.f) {
  const VT mv = V::set1(-m), cv = V::set1(c);
  VT sum = V::zero();
  for (int64_t j = 0; j < n; j += kW) {
    const VT e = V::exp2(V::fma(V::load(s + j), cv, mv));
    V::store(s + j, e);
    sum = V::add(sum, e);
  }
  return V::hsum(sum);
}

// s = 2^(c s - hi - lo) for a row's log-sum-exp hi + lo in log2 units, held as
// two floats: P recomputed from one rounded float (|lse2| ~ 10, an ulp ~1e-6)
// carried that rounding into every P of the row alike, an error that does not
// cancel in dS = P (dP - D) and cost dq / dk up to ~2.5x the error of a plain
// float32 softmax.
inline void exp2_sub2(float* s, int64_t n, float c, float hi, float lo) {
  const VT cv = V::set1(c), hv = V::set1(-hi), lv = V::set1(lo);
  for (int64_t j = 0; j < n; j += kW) V::store(s + j, V::exp2(V::sub(V::fma(V::load(s + j), cv, hv), lv)));
}

inline void scale_row(float* s, int64_t n, float f) {
  const VT fv = V::set1(f);
  for (int64_t j = 0; j < n; j += kW) V::store(s + j, V::mul(V::load(s + j), fv));
}

inline void mul_rows(float* s, const float* z, int64_t n) {
  for (int64_t j = 0; j < n; j += kW) V::store(s + j, V::mul(V::load(s + j), V::load(z + j)));
}

inline float dot(const float* a, const float* b, int64_t n) {
  VT acc = V::zero();
  for (int64_t j = 0; j < n; j += kW) acc = V::fma(V::load(a + j), V::load(b + j), acc);
  return V::hsum(acc);
}

// Keys [k0, k0 + bk) a query i sees, counted from k0.
inline int64_t visible_cols(const Ctx& ctx, const Sequence& s, int64_t i, int64_t k0, int64_t bk) {
  if (!ctx.p.causal) return bk;
  return std::min<int64_t>(bk, std::max<int64_t>(0, i + causal_shift(ctx.p, s.lq, s.lk) + 1 - k0));
}

// Masks in place: row r (query i0 + r) keeps columns [0, visible) of the
// block's `width` (a multiple of 16) columns; S gets -inf elsewhere, and dP
// (when given) 0, so that columns a row group did not compute hold no garbage.
inline void mask_block(const Ctx& ctx, const Sequence& s, int64_t i0, int64_t rows, int64_t k0, int64_t bk, int64_t width,
                       float* S, float* dP = nullptr) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t visible = visible_cols(ctx, s, i0 + r, k0, bk);
    std::fill(S + r * kBlockK + visible, S + r * kBlockK + width, ninf);
    if (dP) std::fill(dP + r * kBlockK + visible, dP + r * kBlockK + width, 0.f);
  }
}

// A causal block that crosses the diagonal (some keys hidden from some rows).
inline bool diagonal_block(const Ctx& ctx, const Sequence& s, int64_t i0, int64_t k0, int64_t bk) {
  return ctx.p.causal && k0 + bk - 1 > i0 + causal_shift(ctx.p, s.lq, s.lk);
}

inline bool block_needs_mask(const Ctx& ctx, const Sequence& s, int64_t i0, int64_t k0, int64_t bk) {
  return bk % kPanel != 0 || diagonal_block(ctx, s, i0, k0, bk);  // zero-padded panel columns, or causal
}

inline int64_t panel_width(int64_t n) { return (n + kPanel - 1) / kPanel * kPanel; }

// For each row tile (kMR rows) of the block [i0, i0 + rows) x [k0, k0 + bk):
// the keys its last row sees (all bk when the block is not masked) into keys,
// their panel width into widths. Returns the number of tiles.
inline int64_t tile_keys(const Ctx& ctx, const Sequence& s, int64_t i0, int64_t rows, int64_t k0, int64_t bk,
                         bool masked, int64_t* keys, int64_t* widths) {
  const int64_t tiles = (rows + kMR - 1) / kMR;
  for (int64_t t = 0; t < tiles; ++t) {
    keys[t] = masked ? visible_cols(ctx, s, i0 + std::min<int64_t>(rows, (t + 1) * kMR) - 1, k0, bk) : bk;
    widths[t] = panel_width(keys[t]);
  }
  return tiles;
}

// Packs rows x D of src (row stride src_rs, optionally scaled) as panels of
// 16 columns: dst[(n / 16) * kBlockQ * 16 + r * 16 + n % 16], zero-padded.
inline void pack_block_rows(const float* src, int64_t src_rs, int64_t rows, int64_t D, float f, float* dst) {
  for (int64_t n0 = 0; n0 < D; n0 += kPanel) {
    float* panel = dst + (n0 / kPanel) * kBlockQ * kPanel;
    const int64_t w = std::min<int64_t>(kPanel, D - n0);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = src + r * src_rs + n0;
      float* out = panel + r * kPanel;
      for (int64_t c = 0; c < w; ++c) out[c] = row[c] * f;
      for (int64_t c = w; c < kPanel; ++c) out[c] = 0.f;
    }
  }
}

// One (sequence, kv head) of K or V, rows [0, lk) at rows + j * rs (D floats,
// D a multiple of kW), into its packed slot `base` (see Ctx): transposed,
// panels of 16 keys as D x 16 (8 x 8 register transposes); otherwise panels
// of 16 columns as lk' x 16. Zero beyond lk and D. Vectorised: with scalar
// gathers and stores this took about a tenth of a causal forward at S = 512,
// whose quadratic part is small.
inline void pack_sequence(bool transposed, const float* rows, int64_t rs, int64_t lk, int64_t D, float* base) {
  const int64_t lk_pad = panel_width(lk), d_pad = panel_width(D);
  if (transposed) {
    for (int64_t j0 = 0; j0 < lk_pad; j0 += kPanel) {
      float* out = base + j0 * D;
      prefetch_rows(rows + (j0 + kPanel) * rs, std::min<int64_t>(kPanel, lk - j0 - kPanel), rs, D);
      if (j0 + kPanel <= lk) {
        for (int64_t half = 0; half < kPanel; half += kW)
          for (int64_t d0 = 0; d0 < D; d0 += kW) V::transpose8(rows + (j0 + half) * rs + d0, rs, out + d0 * kPanel + half, kPanel);
      } else {
        for (int64_t d = 0; d < D; ++d)
          for (int64_t jj = 0; jj < kPanel; ++jj) out[d * kPanel + jj] = j0 + jj < lk ? rows[(j0 + jj) * rs + d] : 0.f;
      }
    }
    // columns D .. d_pad of the row panels' layout do not exist here: K^T
    // panels hold D rows, and the rest of the (b, kvh) slot is unused
    std::fill(base + lk_pad * D, base + lk_pad * d_pad, 0.f);
    return;
  }
  for (int64_t n0 = 0; n0 < d_pad; n0 += kPanel) {  // panel n0 / 16: lk' x 16, columns n0 .. n0 + 15
    float* out = base + (n0 / kPanel) * lk_pad * kPanel;
    for (int64_t j = 0; j < lk_pad; ++j, out += kPanel) {
      if (n0 == 0 && j + kPrefetchAhead < lk) prefetch_rows(rows + (j + kPrefetchAhead) * rs, 1, rs, D);
      for (int64_t c = 0; c < kPanel; c += kW)
        V::store(out + c, j < lk && n0 + c < D ? V::load(rows + j * rs + n0 + c) : V::zero());
    }
  }
}

// Queries [i0, i0 + rows) of sequence b, query head h: out rows and lse.
// kt / vr: the packed K^T / V panels of the block's (sequence, kv head).
inline void forward_block(const Ctx& ctx, int64_t b, int64_t h, int64_t i0, const float* kt, const float* vr,
                          float* scratch) {
  const Problem& p = ctx.p;
  const Sequence s = sequence_of(p, b);
  const int64_t D = p.head_dim, rows = std::min<int64_t>(kBlockQ, s.lq - i0);
  const int64_t q_rs = p.heads_q * D;
  float* qs = scratch;                  // kBlockQ x D
  float* S = qs + kBlockQ * D;          // kBlockQ x kBlockK
  float* O = S + kBlockQ * kBlockK;     // kBlockQ x D
  float* mrow = O + kBlockQ * D;        // kBlockQ
  float* lrow = mrow + kBlockQ;         // kBlockQ
  float* alpha = lrow + kBlockQ;        // kBlockQ
  float* z = alpha + kBlockQ;           // kBlockK
  const float ninf = -std::numeric_limits<float>::infinity();

  const int64_t kv_end = p.causal ? std::min<int64_t>(s.lk, std::max<int64_t>(0, i0 + rows + causal_shift(p, s.lq, s.lk))) : s.lk;
  const float qscale = p.scale * kLog2e;
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = ctx.q + (s.q0 + i0 + r) * q_rs + h * D;
    for (int64_t d = 0; d < D; ++d) qs[r * D + d] = src[d];  // scaled in exp2_sub_sum
    mrow[r] = ninf;
    lrow[r] = 0.f;
  }
  const int64_t vps = ctx.row_panel_stride(b);
  const uint64_t sub = dropout_subsequence(p.offset, b, p.heads_q, h);
  bool first = true;
  for (int64_t k0 = 0; k0 < kv_end; k0 += kBlockK) {
    const int64_t bk = std::min<int64_t>(kBlockK, kv_end - k0);
    const Cover cover = flashmask_cover(ctx, b, h, i0, i0 + rows, k0);
    if (cover == Cover::kFull) continue;  // FlashMask hides the whole tile
    const bool fm = cover == Cover::kPartial;
    // Row tile t (kMR rows) scores only the keys its last row sees (all bk
    // off the diagonal), exponentiates those, and sums only them in P V: the
    // masked triangle of a diagonal block is neither scored nor exponentiated.
    const bool masked = fm || block_needs_mask(ctx, s, i0, k0, bk);
    int64_t keys[kBlockQ / kMR], wt[kBlockQ / kMR];
    const int64_t tiles = tile_keys(ctx, s, i0, rows, k0, bk, masked, keys, wt);
    gemm_tiles(rows, panel_width(bk), D, wt, nullptr, qs, D, 1, kt + k0 * D, kPanel, kPanel * D, S, kBlockK, kStore);
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t r0 = t * kMR, nr = std::min<int64_t>(kMR, rows - r0), w = wt[t];
      if (masked) mask_block(ctx, s, i0 + r0, nr, k0, bk, w, S + r0 * kBlockK);
      if (fm) flashmask_block(ctx, b, h, i0 + r0, nr, k0, w, S + r0 * kBlockK, nullptr);
      for (int64_t r = r0; r < r0 + nr; ++r) {
        float* row = S + r * kBlockK;
        const float mnew = std::max(mrow[r], row_max(row, w) * qscale);  // any reference near the max
        const float mref = mnew == ninf ? 0.f : mnew;
        alpha[r] = std::exp2(mrow[r] - mref);
        lrow[r] = lrow[r] * alpha[r] + exp2_sub_sum(row, w, mref, qscale);
        mrow[r] = mnew;
        if (ctx.dropout) {
          dropout_row(ctx, sub, i0 + r, k0, w, z);
          mul_rows(row, z, w);
        }
      }
    }
    gemm_tiles(rows, D, 0, nullptr, keys, S, kBlockK, 1, vr + k0 * kPanel, kPanel, vps, O, D,
               first ? kStore : kScaleAdd, alpha);
    first = false;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const bool any = lrow[r] > 0.f;
    if (first) {
      std::fill(O + r * D, O + (r + 1) * D, 0.f);
    } else {
      scale_row(O + r * D, D, any ? 1.f / lrow[r] : 0.f);
    }
    // in double, rounded once: the backward pass recomputes P from it
    ctx.lse[ctx.lse_index(s, h, i0 + r)] =
        any ? static_cast<float>((static_cast<double>(mrow[r]) + std::log2(static_cast<double>(lrow[r]))) * kLn2d)
            : std::numeric_limits<float>::infinity();
  }
  store_rows(p.kind, O, D, rows, D, ctx.out, (s.q0 + i0) * q_rs + h * D, q_rs);
}

// The normalised probabilities of queries [i0, i0 + rows) into softmax rows.
inline void softmax_block(const Ctx& ctx, int64_t b, int64_t h, int64_t i0, float* scratch) {
  const Problem& p = ctx.p;
  const Sequence s = sequence_of(p, b);
  const int64_t D = p.head_dim, rows = std::min<int64_t>(kBlockQ, s.lq - i0);
  const int64_t kvh = h / (p.heads_q / p.heads_k);
  const int64_t q_rs = p.heads_q * D;
  const float inf = std::numeric_limits<float>::infinity();
  float* qs = scratch;
  float* S = qs + kBlockQ * D;
  float* z = S + kBlockQ * kBlockK;
  float* lse2 = z + kBlockK;
  const float qscale = p.scale * kLog2e;
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = ctx.q + (s.q0 + i0 + r) * q_rs + h * D;
    for (int64_t d = 0; d < D; ++d) qs[r * D + d] = src[d] * qscale;
    lse2[r] = ctx.lse[ctx.lse_index(s, h, i0 + r)] * kLog2e;
  }
  const float* kt = ctx.kt + ctx.pack_base(b, kvh);
  const uint64_t sub = dropout_subsequence(p.offset, b, p.heads_q, h);
  const int64_t row_elems = p.seqlen_k;
  const int64_t base = ((b * p.heads_q + h) * p.seqlen_q + i0) * row_elems;
  for (int64_t k0 = 0; k0 < s.lk; k0 += kBlockK) {
    const int64_t bk = std::min<int64_t>(kBlockK, s.lk - k0);
    const int64_t width = (bk + kPanel - 1) / kPanel * kPanel;
    gemm(rows, width, D, qs, D, 1, kt + k0 * D, kPanel, kPanel * D, S, kBlockK, kStore);
    if (block_needs_mask(ctx, s, i0, k0, bk)) mask_block(ctx, s, i0, rows, k0, bk, width, S);
    if (flashmask_cover(ctx, b, h, i0, i0 + rows, k0) != Cover::kNone)
      flashmask_block(ctx, b, h, i0, rows, k0, width, S, nullptr);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = S + r * kBlockK;
      if (lse2[r] == inf) {
        std::fill(row, row + width, 0.f);
      } else {
        exp2_sub_sum(row, width, lse2[r]);
      }
      if (ctx.dropout) {
        dropout_row(ctx, sub, i0 + r, k0, width, z);
        for (int64_t j = 0; j < width; ++j) row[j] = z[j] != 0.f ? row[j] : -row[j];
      }
    }
    store_rows(p.kind, S, kBlockK, rows, bk, ctx.softmax, base + k0, row_elems);
  }
}

// Floats of backward_unit's per-query-block preparation (see there).
inline int64_t prep_block_floats(int64_t D) {
  const int64_t Dp = (D + kPanel - 1) / kPanel * kPanel;
  return kBlockQ * (2 * D + 2 * Dp + 3);
}

// Backward of one unit: kv head kvh of sequence b, the query blocks of its
// group's heads that belong to `chunk` (blocks chunk, chunk + chunks, ...).
// FlashAttention-2's loop order: key blocks outside, query blocks inside, so
// a key block's packed K / V and its dK / dV rows stay in cache while the
// queries stream past. Per query head, every query block of the chunk is
// prepared once into `prep` (prep_block_floats(D) per block): Q, dO, Q and dO as panels, lse in log2 units (two floats, see
// exp2_sub2) and D = rowsum(dO * O). Accumulates dK, dV into dk_acc / dv_acc (Lk x D, zeroed
// here) and dQ of one query head into dq_acc (Lq x D), from which it writes dq.
// kt, kr, vt: the unit's packed K^T, K and V^T panels.
inline void backward_unit(const Ctx& ctx, int64_t b, int64_t kvh, int64_t chunk, int64_t chunks, const float* kt,
                          const float* kr, const float* vt, float* dk_acc, float* dv_acc, float* dq_acc, float* prep,
                          float* scratch) {
  const Problem& p = ctx.p;
  const Sequence s = sequence_of(p, b);
  const int64_t D = p.head_dim, group = p.heads_q / p.heads_k;
  const int64_t q_rs = p.heads_q * D;
  const int64_t Dp = (D + kPanel - 1) / kPanel * kPanel;
  const int64_t prep_floats = prep_block_floats(D);
  float* S = scratch;                    // kBlockQ x kBlockK: P, then P * z
  float* dP = S + kBlockQ * kBlockK;     // kBlockQ x kBlockK: dP, then dS
  float* z = dP + kBlockQ * kBlockK;     // kBlockK
  const float inf = std::numeric_limits<float>::infinity();
  std::fill(dk_acc, dk_acc + s.lk * D, 0.f);
  std::fill(dv_acc, dv_acc + s.lk * D, 0.f);
  const int64_t kps = ctx.row_panel_stride(b);
  const float qscale = p.scale * kLog2e;
  const int64_t nblocks = (s.lq + kBlockQ - 1) / kBlockQ;
  const int64_t qps = kBlockQ * kPanel;
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kvh * group + g;
    const uint64_t sub = dropout_subsequence(p.offset, b, p.heads_q, h);
    for (int64_t blk = chunk, n = 0; blk < nblocks; blk += chunks, ++n) {
      const int64_t i0 = blk * kBlockQ, rows = std::min<int64_t>(kBlockQ, s.lq - i0);
      float* qs = prep + n * prep_floats;
      float* dos = qs + kBlockQ * D;
      float* qp = dos + kBlockQ * D;
      float* dop = qp + kBlockQ * Dp;
      float* lse2 = dop + kBlockQ * Dp;
      float* lse2_lo = lse2 + kBlockQ;
      float* Di = lse2_lo + kBlockQ;
      const float* qrows = ctx.q + (s.q0 + i0) * q_rs + h * D;
      const float* dorows = ctx.dout + (s.q0 + i0) * q_rs + h * D;
      const float* orows = ctx.o + (s.q0 + i0) * q_rs + h * D;
      for (int64_t r = 0; r < rows; ++r) {
        if (i0 + r + kPrefetchAhead < s.lq) {  // rows 2 KiB apart or more: no hardware prefetch across pages
          const int64_t ahead = kPrefetchAhead * q_rs;
          prefetch_rows(qrows + r * q_rs + ahead, 1, q_rs, D);
          prefetch_rows(dorows + r * q_rs + ahead, 1, q_rs, D);
          prefetch_rows(orows + r * q_rs + ahead, 1, q_rs, D);
        }
        for (int64_t d = 0; d < D; ++d) {
          qs[r * D + d] = qrows[r * q_rs + d];  // scaled in exp2_sub2
          dos[r * D + d] = dorows[r * q_rs + d];
        }
        const double l2 = static_cast<double>(ctx.lse[ctx.lse_index(s, h, i0 + r)]) * kLog2ed;
        lse2[r] = static_cast<float>(l2);
        lse2_lo[r] = std::isfinite(l2) ? static_cast<float>(l2 - lse2[r]) : 0.f;
        Di[r] = dot(dorows + r * q_rs, orows + r * q_rs, D);
      }
      pack_block_rows(qrows, q_rs, rows, D, 1.f, qp);
      pack_block_rows(dorows, q_rs, rows, D, 1.f, dop);
      std::fill(dq_acc + i0 * D, dq_acc + (i0 + rows) * D, 0.f);
    }
    for (int64_t k0 = 0; k0 < s.lk; k0 += kBlockK) {
      for (int64_t blk = chunk, n = 0; blk < nblocks; blk += chunks, ++n) {
        const int64_t i0 = blk * kBlockQ, rows = std::min<int64_t>(kBlockQ, s.lq - i0);
        // Keys of this block that the block's last (most seeing) query sees.
        const int64_t bk = visible_cols(ctx, s, i0 + rows - 1, k0, std::min<int64_t>(kBlockK, s.lk - k0));
        if (bk <= 0) continue;
        const Cover cover = flashmask_cover(ctx, b, h, i0, i0 + rows, k0);
        if (cover == Cover::kFull) continue;  // FlashMask hides the whole tile
        const bool fm = cover == Cover::kPartial;
        const int64_t width = panel_width(bk);
        const float* qs = prep + n * prep_floats;
        const float* dos = qs + kBlockQ * D;
        const float* qp = dos + kBlockQ * D;
        const float* dop = qp + kBlockQ * Dp;
        const float* lse2 = dop + kBlockQ * Dp;
        const float* lse2_lo = lse2 + kBlockQ;
        const float* Di = lse2_lo + kBlockQ;
        // P and dS tile by tile (kMR rows), over the columns the tile's last
        // row sees (the masked triangle of a diagonal block is left out) and,
        // masked, the kMR - 1 after them: the dV / dK tiles below read a row
        // up to that far past the last column it sees.
        const bool masked = fm || block_needs_mask(ctx, s, i0, k0, bk);
        int64_t keys[kBlockQ / kMR], wc[kBlockQ / kMR];
        const int64_t tiles = tile_keys(ctx, s, i0, rows, k0, bk, masked, keys, wc);
        gemm_tiles(rows, width, D, wc, nullptr, qs, D, 1, kt + k0 * D, kPanel, kPanel * D, S, kBlockK, kStore);
        gemm_tiles(rows, width, D, wc, nullptr, dos, D, 1, vt + k0 * D, kPanel, kPanel * D, dP, kBlockK, kStore);
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t r0 = t * kMR, nr = std::min<int64_t>(kMR, rows - r0);
          const int64_t w = masked ? std::min<int64_t>(width, panel_width(keys[t] + kMR - 1)) : wc[t];
          if (masked) mask_block(ctx, s, i0 + r0, nr, k0, bk, w, S + r0 * kBlockK, dP + r0 * kBlockK);
          if (fm) flashmask_block(ctx, b, h, i0 + r0, nr, k0, w, S + r0 * kBlockK, dP + r0 * kBlockK);
          for (int64_t r = r0; r < r0 + nr; ++r) {
            float* prow = S + r * kBlockK;
            float* drow = dP + r * kBlockK;
            if (lse2[r] == inf) {
              std::fill(prow, prow + w, 0.f);
            } else {
              exp2_sub2(prow, w, qscale, lse2[r], lse2_lo[r]);
            }
            const VT di = V::set1(Di[r]), sc = V::set1(p.scale);
            if (ctx.dropout) {
              dropout_row(ctx, sub, i0 + r, k0, w, z);
              for (int64_t j = 0; j < w; j += kW) {
                const VT pv = V::load(prow + j), zv = V::load(z + j);
                const VT dpz = V::mul(V::load(drow + j), zv);
                V::store(drow + j, V::mul(V::mul(pv, V::sub(dpz, di)), sc));
                V::store(prow + j, V::mul(pv, zv));
              }
            } else {
              for (int64_t j = 0; j < w; j += kW) {
                const VT pv = V::load(prow + j);
                V::store(drow + j, V::mul(V::mul(pv, V::sub(V::load(drow + j), di)), sc));
              }
            }
          }
        }
        // dV[k0:] += (P z)^T dO ; dK[k0:] += dS^T Q. Key column c is seen by rows
        // r >= c - last_seen (0 for every column off the diagonal): the
        // columns all rows see in one product, then, on a diagonal block, tiles
        // of kMR columns summed only over the rows that see the tile's first
        // column (rows above see none of the tile; P and dS are zero where a
        // summed row does not see a tile column).
        const int64_t last_seen = ctx.p.causal ? i0 + causal_shift(ctx.p, s.lq, s.lk) - k0 : bk;
        const int64_t full_cols = std::min<int64_t>(bk, std::max<int64_t>(0, last_seen + 1));
        gemm(full_cols, D, rows, S, 1, kBlockK, dop, kPanel, qps, dv_acc + k0 * D, D, kAdd);
        gemm(full_cols, D, rows, dP, 1, kBlockK, qp, kPanel, qps, dk_acc + k0 * D, D, kAdd);
        for (int64_t c = full_cols; c < bk; c += kMR) {
          const int64_t nc = std::min<int64_t>(kMR, bk - c), r_first = c - last_seen;
          gemm(nc, D, rows - r_first, S + r_first * kBlockK + c, 1, kBlockK, dop + r_first * kPanel, kPanel, qps,
               dv_acc + (k0 + c) * D, D, kAdd);
          gemm(nc, D, rows - r_first, dP + r_first * kBlockK + c, 1, kBlockK, qp + r_first * kPanel, kPanel, qps,
               dk_acc + (k0 + c) * D, D, kAdd);
        }
        // dQ += dS K[k0:]
        gemm_tiles(rows, D, 0, nullptr, keys, dP, kBlockK, 1, kr + k0 * kPanel, kPanel, kps, dq_acc + i0 * D, D, kAdd);
      }
    }
    for (int64_t blk = chunk; blk < nblocks; blk += chunks) {
      const int64_t i0 = blk * kBlockQ, rows = std::min<int64_t>(kBlockQ, s.lq - i0);
      store_rows(p.kind, dq_acc + i0 * D, D, rows, D, ctx.dq, (s.q0 + i0) * q_rs + h * D, q_rs);
    }
  }
}

}  // namespace PE_FA_NS
