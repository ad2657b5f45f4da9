// The tensor-core FlashAttention-2 kernels (bf16 / fp16, head dims 32, 64, 96,
// 128), written only against the primitives of gpu/warp_mma.cuh: included by
// gpu/flash_attn_tc.cu for CUDA, and by tests/gpu/flash_attn_tc_emulated.cc after
// tests/gpu/warp_emulator.h, which runs them on a CPU. Same contract as
// flash_attn.h; float32 accumulation, P and dS rounded to the input type
// before their products (as flash-attention does).
//
// Tiles: a block is 4 warps; a warp owns 32 query rows of a forward block's
// 128 (two m-tiles), 16 of a backward block's 64 (queries or keys). Tiles
// move global -> shared by cp.async (rows past a sequence's end read as
// zeros), shared -> registers by ldmatrix; a shared row holds head_dim + 8
// elements, which puts the 8 rows an ldmatrix reads in 8 distinct bank
// groups. The key / query tiles a block loops over go through a two-stage
// ring: tile j + 1 is in flight while tile j is computed on.
//   forward: block = 128 queries of one (sequence, head); online softmax over
//     key tiles of 64 in registers (each lane keeps four rows' max and partial
//     sum, combined across the row's 4 lanes by shuffles).
//   backward, in FlashAttention-2's order: rowdot_kernel D = rowsum(dO * O);
//     dkdv_kernel: block = 64 keys of one kv head, looping over the query
//     tiles of every query head that shares it: S^T = K Q^T, P^T, dP^T =
//     V dO^T, dS^T, then dV += (P^T o Z) dO and dK += dS^T Q. dQ one of two
//     ways (DqMode):
//     kAtomic (FlashAttention-2's): dkdv_kernel also puts dS^T in shared
//       memory and adds dS K of its keys into a float32 dQ (atomics), which
//       dq_convert_kernel rounds to the input type: 5 GEMMs per tile pair, the
//       sum's order (hence dQ's last bits) varies from run to run;
//     kDeterministic: dq_kernel, block = 64 queries, looping over key tiles:
//       S, P, dP = dO V^T, dS, dQ += dS K, recomputed: 7 GEMMs per tile pair,
//       no atomics, the same bits every run.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "flash_attn.h"

#if !defined(PE_TC_TARGET)
#error "include gpu/warp_mma.cuh (CUDA) or tests/gpu/warp_emulator.h (CPU) first: they define the primitives"
#endif

// The kernels live in an inline namespace named after the primitives they were
// compiled against (tc::on_cuda or tc::on_cpu_emulator): kernels_check links
// both builds, and under one name a kernel that is not a template is defined
// twice (nvcc's host stub and the emulator's function), while for templates
// only the stubs' internal linkage would keep the two apart.
namespace paddle_ext::flash_attn::tc {
inline namespace PE_TC_TARGET {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBlockRows = 16 * kWarps;  // rows (queries, or keys in dkdv) a block owns
constexpr int kTile = 64;                // rows of a key / query tile the block loops over
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D>
constexpr int kStride = D + 8;  // elements of a shared-memory row

// Shared memory each kernel needs, in bytes.
template <int D>
constexpr int kTileBytes = kTile * kStride<D> * 2;
// The forward's warps own two m-tiles each (128 rows a block), so that each K /
// V fragment read from shared memory feeds two MMAs (FlashAttention-2's 128 x
// 64 tiles); the backward's, which hold more accumulators, one.
constexpr int kForwardMTiles = 2;
constexpr int kForwardRows = 16 * kWarps * kForwardMTiles;
template <int D>
constexpr int kForwardSmemBytes = kForwardRows * kStride<D> * 2 + 4 * kTileBytes<D>;  // Q, 2 stages of (K, V)
template <int D>
constexpr int kDqSmemBytes = 2 * kBlockRows * kStride<D> * 2 + 4 * kTileBytes<D>;  // Q, dO, 2 stages of (K, V)
template <int D>
constexpr int kDkdvStageBytes = 2 * kTileBytes<D> + 2 * kTile * 4;  // Q, dO, lse, D of one query tile
template <int D>
constexpr int kDkdvSmemBytes = 2 * kBlockRows * kStride<D> * 2 + 2 * kDkdvStageBytes<D>;  // K, V, 2 query stages
// kAtomic's dkdv_kernel adds dS^T of one query tile (keys x queries) after those.
constexpr int kDsStride = kTile + 8;
constexpr int kDsBytes = kBlockRows * kDsStride * 2;
template <int D>
constexpr int kDkdvAtomicSmemBytes = kDkdvSmemBytes<D> + kDsBytes;

// How the backward computes dQ (see the top of this file).
enum class DqMode { kAtomic, kDeterministic };

PADDLE_EXT_HOST_DEVICE inline int64_t blocks_of(int64_t rows, int per_block) {
  return (rows + per_block - 1) / per_block;
}

// The first query row of a forward / dq block of `rows` rows. Causal: the
// last rows (the most keys) go to the first blocks launched, so the longest
// blocks do not trail.
PE_TC_DEVICE int64_t query_block_start(const Problem& p, int rows) {
  return (p.causal ? blocks_of(p.seqlen_q, rows) - 1 - block_x() : block_x()) * rows;
}

PE_TC_DEVICE int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
PE_TC_DEVICE int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// rows x D elements from global (row r at src + r * row_stride) into a shared
// tile; rows >= valid_rows become zeros. All threads of the block take part.
template <int D, int kRows>
PE_TC_DEVICE void load_tile(uint16_t* tile, const uint16_t* src, int64_t row_stride, int64_t valid_rows) {
  constexpr int kChunks = D / 8;  // 16-byte chunks of a row
  for (int c = thread_rank(); c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool ok = r < valid_rows;
    cp_async_16(tile + r * kStride<D> + col, ok ? src + r * row_stride + col : src, ok);
  }
}

// ldmatrix addressing (lane = threadIdx % 32), for a shared tile of stride S:
// the A operand of rows r0..r0+15, k-step ks (row-major A).
template <int S>
PE_TC_DEVICE void load_a(uint32_t a[4], const uint16_t* tile, int r0, int ks, int lane) {
  ldmatrix_x4(a, tile + (r0 + lane % 16) * S + ks * 16 + (lane / 16) * 8);
}
// The A operand of rows r0..r0+15, k-step ks, from a tile that stores A
// transposed (A[r][k] = tile[k][r]): dS from dS^T.
template <int S>
PE_TC_DEVICE void load_a_trans(uint32_t a[4], const uint16_t* tile, int r0, int ks, int lane) {
  ldmatrix_x4_trans(a, tile + (ks * 16 + (lane / 16) * 8 + lane % 8) * S + r0 + ((lane / 8) % 2) * 8);
}
// The B operand of two n-tiles n0..n0+15 stored as rows (B[k][n] = tile[n][k]),
// k-step ks: b[0], b[1] for n-tile n0, b[2], b[3] for n0 + 8.
template <int S>
PE_TC_DEVICE void load_b_rows(uint32_t b[4], const uint16_t* tile, int n0, int ks, int lane) {
  ldmatrix_x4(b, tile + (n0 + (lane / 16) * 8 + lane % 8) * S + ks * 16 + ((lane / 8) % 2) * 8);
}
// The B operand stored k-major (B[k][n] = tile[k][n]): k rows k0..k0+15,
// n-tiles n0 and n0 + 8.
template <int S>
PE_TC_DEVICE void load_b_cols(uint32_t b[4], const uint16_t* tile, int k0, int n0, int lane) {
  ldmatrix_x4_trans(b, tile + (k0 + ((lane / 8) % 2) * 8 + lane % 8) * S + n0 + (lane / 16) * 8);
}

// For each of a warp's MT m-tiles (16 rows each): acc[mt] (NT n-tiles of 16 x 8)
// += A_mt (16 x 16 KS) * B^T, where B's rows (n) are rows 0.. of tile: S = Q K^T
// and the like. load_a(mt, ks, a) gives A_mt's fragments of k-step ks (from
// registers or shared memory); each B fragment serves all MT m-tiles.
template <bool kBf16, int KS, int NT, int S, int MT, class LoadA>
PE_TC_DEVICE void mma_rows(float (*acc)[NT][4], LoadA&& load_a, const uint16_t* tile, int lane) {
PE_TC_UNROLL
  for (int ks = 0; ks < KS; ++ks) {
    uint32_t a[MT][4];
PE_TC_UNROLL
    for (int mt = 0; mt < MT; ++mt) load_a(mt, ks, a[mt]);
PE_TC_UNROLL
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      load_b_rows<S>(b, tile, np * 16, ks, lane);
PE_TC_UNROLL
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<kBf16>(acc[mt][2 * np], a[mt], b[0], b[1]);
        mma_16816<kBf16>(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// The fragments of an accumulator (16 x 8 * NT, C layout) as A operands
// (16 x 16 * NT / 2), rounded to the input type: P and dS before P V, dS K.
template <bool kBf16, int NT>
PE_TC_DEVICE void to_a(uint32_t (*a)[4], const float (*c)[4]) {
PE_TC_UNROLL
  for (int kk = 0; kk < NT / 2; ++kk) {
    a[kk][0] = pack2<kBf16>(c[2 * kk][0], c[2 * kk][1]);
    a[kk][1] = pack2<kBf16>(c[2 * kk][2], c[2 * kk][3]);
    a[kk][2] = pack2<kBf16>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[kk][3] = pack2<kBf16>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

// For each m-tile: acc[mt] (16 x D) += A_mt (16 x 16 KK, fragments a[mt]) *
// tile (16 KK rows x D, k-major).
template <bool kBf16, int KK, int DT, int S, int MT>
PE_TC_DEVICE void mma_cols(float (*acc)[DT][4], const uint32_t (*a)[KK][4], const uint16_t* tile, int lane) {
PE_TC_UNROLL
  for (int kk = 0; kk < KK; ++kk) {
PE_TC_UNROLL
    for (int dp = 0; dp < DT / 2; ++dp) {
      uint32_t b[4];
      load_b_cols<S>(b, tile, kk * 16, dp * 16, lane);
PE_TC_UNROLL
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<kBf16>(acc[mt][2 * dp], a[mt][kk], b[0], b[1]);
        mma_16816<kBf16>(acc[mt][2 * dp + 1], a[mt][kk], b[2], b[3]);
      }
    }
  }
}

// Rows r0 and r0 + 8 of a 16 x D accumulator (lane (g, t) holds columns 8 dt +
// 2t, +1) into global rows at dst + r * row_stride, rows < valid_rows only.
template <bool kBf16, int DT>
PE_TC_DEVICE void store_rows(const float (*acc)[4], uint16_t* dst, int64_t row_stride, int g, int t,
                             int64_t valid_rows, float f0, float f1) {
PE_TC_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int r = g + 8 * half;
    if (r >= valid_rows) continue;
    const float f = half ? f1 : f0;
PE_TC_UNROLL
    for (int dt = 0; dt < DT; ++dt) {
      *reinterpret_cast<uint32_t*>(dst + r * row_stride + dt * 8 + 2 * t) =
          pack2<kBf16>(acc[dt][2 * half] * f, acc[dt][2 * half + 1] * f);
    }
  }
}

PE_TC_DEVICE void copy4(uint32_t* dst, const uint32_t* src) {
  dst[0] = src[0], dst[1] = src[1], dst[2] = src[2], dst[3] = src[3];
}

template <int NT>
PE_TC_DEVICE void zero(float (*acc)[4]) {
PE_TC_UNROLL
  for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}

// Keys a block of queries [m0, m0 + rows) attends to: [0, end).
PE_TC_DEVICE int64_t key_end(const Problem& p, const Sequence& s, int64_t m0, int rows) {
  if (!p.causal) return s.lk;
  return max64(0, min64(s.lk, m0 + rows + causal_shift(p, s.lq, s.lk)));
}

// Whether key tile [j0, j0 + kTile) needs the mask for queries m0 and after.
PE_TC_DEVICE bool tile_needs_mask(const Problem& p, const Sequence& s, int64_t m0, int64_t j0) {
  return j0 + kTile > s.lk || (p.causal && j0 + kTile - 1 > m0 + causal_shift(p, s.lq, s.lk));
}

// ---- what the kernels share ------------------------------------------------------

// Dropout's constants of one query head.
struct Dropout {
  float rkeep;          // 1 / (1 - p), or 1 without dropout
  uint32_t threshold;
  uint64_t sub;         // the head's Philox subsequence
};

PE_TC_DEVICE Dropout dropout_of(const Problem& p, int64_t b, int64_t h) {
  return {p.dropout > 0.f ? 1.f / (1.f - p.dropout) : 1.f, dropout_threshold(p.dropout),
          dropout_subsequence(p.offset, b, p.heads_q, h)};
}

// A forward / dq block: query rows of one (sequence, head), and the key tiles
// they attend to.
struct QueryBlock {
  int warp, lane, g, t;  // lane = 4 g + t
  int64_t b, h, kvh, m0, q_rs, k_rs, shift;
  int n_tiles;
  float scale2;  // softmax scale * log2(e): scores in base 2
  Sequence s;
  Dropout drop;
};

template <int D>
PE_TC_DEVICE QueryBlock query_block(const Problem& p, int rows) {
  QueryBlock qb;
  const int tid = thread_rank();
  qb.warp = tid / 32, qb.lane = tid % 32, qb.g = qb.lane / 4, qb.t = qb.lane % 4;
  qb.b = block_z(), qb.h = block_y(), qb.m0 = query_block_start(p, rows);
  qb.kvh = qb.h / (p.heads_q / p.heads_k), qb.q_rs = p.heads_q * D, qb.k_rs = p.heads_k * D;
  qb.s = sequence_of(p, qb.b);
  qb.shift = causal_shift(p, qb.s.lq, qb.s.lk);
  qb.n_tiles = static_cast<int>((key_end(p, qb.s, qb.m0, rows) + kTile - 1) / kTile);
  qb.scale2 = p.scale * kLog2e;
  qb.drop = dropout_of(p, qb.b, qb.h);
  return qb;
}

// The two-stage ring of (K, V) tiles a query block loops over, in shared
// memory at `base`: stage j % 2 holds tile j.
template <int D>
struct KvRing {
  uint16_t* base;
  const uint16_t* k;  // the kv head's first key of the sequence
  const uint16_t* v;
  int64_t row_stride, keys;
  PE_TC_DEVICE uint16_t* k_tile(int j) const { return base + (j % 2) * 2 * kTile * kStride<D>; }
  PE_TC_DEVICE uint16_t* v_tile(int j) const { return k_tile(j) + kTile * kStride<D>; }
  PE_TC_DEVICE void issue(int j) const {
    const int64_t first = int64_t{j} * kTile;
    load_tile<D, kTile>(k_tile(j), k + first * row_stride, row_stride, keys - first);
    load_tile<D, kTile>(v_tile(j), v + first * row_stride, row_stride, keys - first);
  }
};

template <int D>
PE_TC_DEVICE KvRing<D> kv_ring(uint16_t* base, const QueryBlock& qb, const uint16_t* k, const uint16_t* v) {
  const int64_t off = qb.s.k0 * qb.k_rs + qb.kvh * D;
  return {base, k + off, v + off, qb.k_rs, qb.s.lk};
}

// Before computing on tile j of n (tile 0 issued with the block's own tiles,
// one group): issues tile j + 1 into the other stage, waits for tile j, and
// syncs the block. The loop body ends with block_sync(), so that the stage is
// free when iteration j + 1 issues tile j + 2 into it.
template <class Issue>
PE_TC_DEVICE void ring_step(int j, int n, Issue&& issue) {
  if (j + 1 < n) {
    issue(j + 1);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  block_sync();
}

// The keep factors z (0 or 1 / (1 - p)) of the two columns j, j + 1 (j even)
// of query row i: both lie in one Philox word group of 4, words 0 and 1 or 2
// and 3. Chosen by selects, not bits.x[j & 3]: an index known only at run time
// puts the four words in local memory, and with that stack frame ptxas spilled
// 28 bytes of the d=128 forward on sm_90 (4 bytes now; docs/gpu_check.md).
PE_TC_DEVICE void keep_pair(const Problem& p, const Dropout& z, int64_t i, int64_t j, float* z0, float* z1) {
  const Philox4 bits = dropout_bits(p.seed, z.sub, i, j >> 2);
  const bool high = (j & 2) != 0;
  *z0 = (high ? bits.x[2] : bits.x[0]) >= z.threshold ? z.rkeep : 0.f;
  *z1 = (high ? bits.x[3] : bits.x[1]) >= z.threshold ? z.rkeep : 0.f;
}

// ---- forward -------------------------------------------------------------------

template <int D, bool kBf16>
PE_TC_KERNEL void forward_kernel(Problem p, const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out,
                                 float* lse) {
  constexpr int S = kStride<D>, KS = D / 16, NT = kTile / 8, DT = D / 8, MT = kForwardMTiles;
  const QueryBlock qb = query_block<D>(p, kForwardRows);
  const Sequence& s = qb.s;
  const int64_t m0 = qb.m0, h = qb.h, q_rs = qb.q_rs, shift = qb.shift;
  const int warp = qb.warp, lane = qb.lane, g = qb.g, t = qb.t, n_tiles = qb.n_tiles;
  const float scale2 = qb.scale2;
  const Dropout& drop = qb.drop;
  if (m0 >= s.lq) return;
  uint16_t* q_tile = reinterpret_cast<uint16_t*>(dynamic_smem());
  const KvRing<D> ring = kv_ring<D>(q_tile + kForwardRows * S, qb, k, v);
  load_tile<D, kForwardRows>(q_tile, q + (s.q0 + m0) * q_rs + h * D, q_rs, s.lq - m0);
  if (n_tiles > 0) ring.issue(0);
  cp_async_commit();

  const int wrow = warp * 16 * MT;  // the warp's first row within the block
  // Q's fragments are read from shared memory for every key tile (kept in
  // registers, they would not leave room for two m-tiles' accumulators).
  auto load_q = [&](int mt, int ks, uint32_t* a) { load_a<S>(a, q_tile, wrow + 16 * mt, ks, lane); };
  float o[MT][DT][4], m[MT][2], l[MT][2];
PE_TC_UNROLL
  for (int mt = 0; mt < MT; ++mt) {
    zero<DT>(o[mt]);
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
  }
  for (int j = 0; j < n_tiles; ++j) {
    ring_step(j, n_tiles, [&](int next) { ring.issue(next); });
    float sc[MT][NT][4];
PE_TC_UNROLL
    for (int mt = 0; mt < MT; ++mt) zero<NT>(sc[mt]);
    mma_rows<kBf16, KS, NT, S, MT>(sc, load_q, ring.k_tile(j), lane);
    // Positions within the sequence in 32 bits (sequences are shorter than 2^31):
    // 64-bit ones cost the registers that two m-tiles need.
    const int j0 = j * kTile, lk = static_cast<int>(s.lk);
    const bool masked = tile_needs_mask(p, s, m0, j0);
PE_TC_UNROLL
    for (int mt = 0; mt < MT; ++mt) {
PE_TC_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int i = static_cast<int>(m0) + wrow + 16 * mt + 8 * half + g;  // this lane's query row
        const int last = p.causal ? i + static_cast<int>(shift) : lk - 1;     // its last visible key
        float mx = -INFINITY;
PE_TC_UNROLL
        for (int nt = 0; nt < NT; ++nt) {
PE_TC_UNROLL
          for (int e = 0; e < 2; ++e) {
            const int col = j0 + nt * 8 + 2 * t + e;
            float x = sc[mt][nt][2 * half + e] * scale2;
            if (masked && (col >= lk || col > last)) x = -INFINITY;
            sc[mt][nt][2 * half + e] = x;
            mx = fmaxf(mx, x);
          }
        }
        mx = fmaxf(mx, shfl_xor(mx, 1));
        mx = fmaxf(mx, shfl_xor(mx, 2));
        const float mnew = fmaxf(m[mt][half], mx), mref = mnew == -INFINITY ? 0.f : mnew;
        const float alpha = fast_exp2(m[mt][half] - mref);
        m[mt][half] = mnew;
        float sum = 0.f;
PE_TC_UNROLL
        for (int nt = 0; nt < NT; ++nt) {
          float z0 = 1.f, z1 = 1.f;
          if (p.dropout > 0.f) keep_pair(p, drop, i, j0 + nt * 8 + 2 * t, &z0, &z1);
          const float p0 = fast_exp2(sc[mt][nt][2 * half] - mref), p1 = fast_exp2(sc[mt][nt][2 * half + 1] - mref);
          sum += p0 + p1;
          sc[mt][nt][2 * half] = p0 * z0;
          sc[mt][nt][2 * half + 1] = p1 * z1;
        }
        l[mt][half] = l[mt][half] * alpha + sum;
PE_TC_UNROLL
        for (int dt = 0; dt < DT; ++dt) {
          o[mt][dt][2 * half] *= alpha;
          o[mt][dt][2 * half + 1] *= alpha;
        }
      }
    }
    uint32_t pa[MT][NT / 2][4];
PE_TC_UNROLL
    for (int mt = 0; mt < MT; ++mt) to_a<kBf16, NT>(pa[mt], sc[mt]);
    mma_cols<kBf16, NT / 2, DT, S, MT>(o, pa, ring.v_tile(j), lane);
    block_sync();  // the stage is refilled by the next iteration's issue
  }
PE_TC_UNROLL
  for (int mt = 0; mt < MT; ++mt) {
PE_TC_UNROLL
    for (int half = 0; half < 2; ++half) {
      l[mt][half] += shfl_xor(l[mt][half], 1);
      l[mt][half] += shfl_xor(l[mt][half], 2);
    }
    const int64_t r0 = m0 + wrow + 16 * mt;  // the m-tile's first row within the sequence
    store_rows<kBf16, DT>(o[mt], out + (s.q0 + r0) * q_rs + h * D, q_rs, g, t, s.lq - r0,
                          l[mt][0] > 0.f ? 1.f / l[mt][0] : 0.f, l[mt][1] > 0.f ? 1.f / l[mt][1] : 0.f);
    if (t == 0) {
PE_TC_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int64_t i = r0 + 8 * half + g;
        const float lh = l[mt][half];
        if (i < s.lq) lse[lse_index(p, s, h, i)] = lh > 0.f ? (m[mt][half] + log2f(lh)) * kLn2 : INFINITY;
      }
    }
  }
}

// ---- backward --------------------------------------------------------------------

// di[h * total_q + token] = dO . O of every (token, query head): a warp per row.
template <int D, bool kBf16>
PE_TC_KERNEL void rowdot_kernel(Problem p, const uint16_t* out, const uint16_t* dout, float* di) {
  const int warp = thread_rank() / 32, lane = thread_rank() % 32;
  const int64_t row = block_x() * kWarps + warp;
  if (row >= p.total_q * p.heads_q) return;
  const int64_t token = row / p.heads_q, h = row % p.heads_q, off = row * D;
  float acc = 0.f;
  for (int d = lane; d < D; d += 32) {
    const float o = kBf16 ? bf16_to_float(out[off + d]) : fp16_to_float(out[off + d]);
    const float g = kBf16 ? bf16_to_float(dout[off + d]) : fp16_to_float(dout[off + d]);
    acc += o * g;
  }
PE_TC_UNROLL
  for (int mask = 16; mask > 0; mask >>= 1) acc += shfl_xor(acc, mask);
  if (lane == 0) di[h * p.total_q + token] = acc;
}

template <int D, bool kBf16>
PE_TC_KERNEL void dq_kernel(Problem p, const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout,
                            const float* lse, const float* di, uint16_t* dq) {
  constexpr int S = kStride<D>, KS = D / 16, NT = kTile / 8, DT = D / 8;
  const QueryBlock qb = query_block<D>(p, kBlockRows);
  const Sequence& s = qb.s;
  const int64_t m0 = qb.m0, h = qb.h, q_rs = qb.q_rs, shift = qb.shift;
  const int warp = qb.warp, lane = qb.lane, g = qb.g, t = qb.t, n_tiles = qb.n_tiles;
  const float scale2 = qb.scale2;
  const Dropout& drop = qb.drop;
  if (m0 >= s.lq) return;
  uint16_t* q_tile = reinterpret_cast<uint16_t*>(dynamic_smem());
  uint16_t* do_tile = q_tile + kBlockRows * S;
  const KvRing<D> ring = kv_ring<D>(do_tile + kBlockRows * S, qb, k, v);
  const int64_t qoff = (s.q0 + m0) * q_rs + h * D;
  load_tile<D, kBlockRows>(q_tile, q + qoff, q_rs, s.lq - m0);
  load_tile<D, kBlockRows>(do_tile, dout + qoff, q_rs, s.lq - m0);
  if (n_tiles > 0) ring.issue(0);
  cp_async_commit();

  const int64_t row0 = m0 + warp * 16 + g, row1 = row0 + 8;
  float lse2[2], dsum[2];
PE_TC_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int64_t i = half ? row1 : row0;
    lse2[half] = i < s.lq ? lse[lse_index(p, s, h, i)] * kLog2e : INFINITY;
    dsum[half] = i < s.lq ? di[h * p.total_q + s.q0 + i] : 0.f;
  }
  uint32_t qf[KS][4], dof[KS][4];
  float dqa[1][DT][4];
  zero<DT>(dqa[0]);
  for (int j = 0; j < n_tiles; ++j) {
    ring_step(j, n_tiles, [&](int next) { ring.issue(next); });
    if (j == 0) {
PE_TC_UNROLL
      for (int ks = 0; ks < KS; ++ks) {
        load_a<S>(qf[ks], q_tile, warp * 16, ks, lane);
        load_a<S>(dof[ks], do_tile, warp * 16, ks, lane);
      }
    }
    float sc[1][NT][4], dp[1][NT][4];
    zero<NT>(sc[0]);
    zero<NT>(dp[0]);
    mma_rows<kBf16, KS, NT, S, 1>(sc, [&](int, int ks, uint32_t* a) { copy4(a, qf[ks]); }, ring.k_tile(j), lane);
    mma_rows<kBf16, KS, NT, S, 1>(dp, [&](int, int ks, uint32_t* a) { copy4(a, dof[ks]); }, ring.v_tile(j), lane);
    const int64_t j0 = int64_t{j} * kTile;
    const bool masked = tile_needs_mask(p, s, m0, j0);
PE_TC_UNROLL
    for (int half = 0; half < 2; ++half) {
      const int64_t i = half ? row1 : row0;
PE_TC_UNROLL
      for (int nt = 0; nt < NT; ++nt) {
        const int64_t col = j0 + nt * 8 + 2 * t;
        float z[2] = {1.f, 1.f};
        if (p.dropout > 0.f) keep_pair(p, drop, i, col, &z[0], &z[1]);
PE_TC_UNROLL
        for (int e = 0; e < 2; ++e) {
          const bool ok = !masked || (col + e < s.lk && (!p.causal || col + e <= i + shift));
          const float pr = ok ? fast_exp2(sc[0][nt][2 * half + e] * scale2 - lse2[half]) : 0.f;
          sc[0][nt][2 * half + e] = pr * (dp[0][nt][2 * half + e] * z[e] - dsum[half]) * p.scale;  // dS
        }
      }
    }
    uint32_t dsa[1][NT / 2][4];
    to_a<kBf16, NT>(dsa[0], sc[0]);
    mma_cols<kBf16, NT / 2, DT, S, 1>(dqa, dsa, ring.k_tile(j), lane);
    block_sync();
  }
  const int64_t r0 = warp * 16;
  store_rows<kBf16, DT>(dqa[0], dq + qoff + r0 * q_rs, q_rs, g, t, s.lq - m0 - r0, 1.f, 1.f);
}

// kAtomic's dQ of one query tile: dq (float32 rows at dq + r * row_stride,
// rows < valid_rows) += dS K, dS (queries x this block's 64 keys) read from
// ds_tile, which holds it transposed; the warp's 16 queries, D in chunks of
// 64 columns (fewer live accumulators beside dK's and dV's).
template <int D, bool kBf16>
PE_TC_DEVICE void add_dq(const uint16_t* ds_tile, const uint16_t* k_tile, float* dq, int64_t row_stride,
                         int64_t valid_rows, int warp, int lane) {
  constexpr int S = kStride<D>, KK = kBlockRows / 16, kChunks = D > 64 ? 2 : 1, CT = D / 8 / kChunks;
  const int g = lane / 4, t = lane % 4;
  uint32_t dsa[1][KK][4];
PE_TC_UNROLL
  for (int kk = 0; kk < KK; ++kk) load_a_trans<kDsStride>(dsa[0][kk], ds_tile, warp * 16, kk, lane);
PE_TC_UNROLL
  for (int c = 0; c < kChunks; ++c) {
    float acc[1][CT][4];
    zero<CT>(acc[0]);
    mma_cols<kBf16, KK, CT, S, 1>(acc, dsa, k_tile + c * (D / kChunks), lane);
PE_TC_UNROLL
    for (int half = 0; half < 2; ++half) {
      const int r = warp * 16 + 8 * half + g;
      if (r >= valid_rows) continue;
      float* row = dq + r * row_stride + c * (D / kChunks) + 2 * t;
PE_TC_UNROLL
      for (int ct = 0; ct < CT; ++ct) {
        atomic_add2(row + ct * 8, acc[0][ct][2 * half], acc[0][ct][2 * half + 1]);
      }
    }
  }
}

// kAtomic's dQ before and after dkdv_kernel: zeroed, then rounded to the input
// type; n elements (a multiple of 4), 4 a thread.
PE_TC_KERNEL void fill_zero_kernel(float* x, int64_t n) {
  const int64_t i = (block_x() * kThreads + thread_rank()) * 4;
  if (i < n) x[i] = x[i + 1] = x[i + 2] = x[i + 3] = 0.f;
}

template <bool kBf16>
PE_TC_KERNEL void dq_convert_kernel(const float* accum, uint16_t* dq, int64_t n) {
  const int64_t i = (block_x() * kThreads + thread_rank()) * 4;
  if (i >= n) return;
  uint32_t* out = reinterpret_cast<uint32_t*>(dq + i);
  out[0] = pack2<kBf16>(accum[i], accum[i + 1]);
  out[1] = pack2<kBf16>(accum[i + 2], accum[i + 3]);
}

// kAtomicDq: dq_accum (float32, dQ's layout, zeroed) += dS K of this block's keys.
template <int D, bool kBf16, bool kAtomicDq>
PE_TC_KERNEL void dkdv_kernel(Problem p, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                              const uint16_t* dout, const float* lse, const float* di, uint16_t* dk, uint16_t* dv,
                              float* dq_accum) {
  constexpr int S = kStride<D>, KS = D / 16, NT = kTile / 8, DT = D / 8;
  const int tid = thread_rank(), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int64_t b = block_z(), kvh = block_y(), n0 = block_x() * kBlockRows;
  const Sequence s = sequence_of(p, b);
  if (n0 >= s.lk) return;
  const int64_t G = p.heads_q / p.heads_k, q_rs = p.heads_q * D, k_rs = p.heads_k * D;
  const int64_t shift = causal_shift(p, s.lq, s.lk);
  // Query tiles that see a key of this block: from the one holding the first
  // query that sees key n0 (causal: i >= n0 - shift), for each of the G heads.
  const int64_t i_begin = p.causal ? max64(0, n0 - shift) : 0;
  const int first_tile = static_cast<int>(i_begin / kTile);
  const int per_head = i_begin < s.lq ? static_cast<int>((s.lq + kTile - 1) / kTile) - first_tile : 0;
  const int n_tiles = static_cast<int>(G) * per_head;
  const float scale2 = p.scale * kLog2e;
  uint16_t* k_tile = reinterpret_cast<uint16_t*>(dynamic_smem());
  uint16_t* v_tile = k_tile + kBlockRows * S;
  char* ring = reinterpret_cast<char*>(v_tile + kBlockRows * S);
  uint16_t* ds_tile = reinterpret_cast<uint16_t*>(ring + 2 * kDkdvStageBytes<D>);  // kAtomicDq only
  // Stage st: Q tile, dO tile, then lse * log2(e) and D of its kTile queries.
  auto stage_q = [&](int j) { return reinterpret_cast<uint16_t*>(ring + (j % 2) * kDkdvStageBytes<D>); };
  auto stage_f = [&](int j) { return reinterpret_cast<float*>(stage_q(j) + 2 * kTile * S); };
  auto head_of = [&](int j) { return kvh * G + j / per_head; };
  auto start_of = [&](int j) { return int64_t{first_tile + j % per_head} * kTile; };
  auto issue = [&](int j) {
    const int64_t h = head_of(j), i0 = start_of(j), off = (s.q0 + i0) * q_rs + h * D;
    load_tile<D, kTile>(stage_q(j), q + off, q_rs, s.lq - i0);
    load_tile<D, kTile>(stage_q(j) + kTile * S, dout + off, q_rs, s.lq - i0);
    float* f = stage_f(j);
    for (int r = thread_rank(); r < kTile; r += kThreads) {
      const bool ok = i0 + r < s.lq;
      st_shared_f32(f + r, ok ? lse[lse_index(p, s, h, i0 + r)] * kLog2e : INFINITY);
      st_shared_f32(f + kTile + r, ok ? di[h * p.total_q + s.q0 + i0 + r] : 0.f);
    }
  };
  const int64_t koff = (s.k0 + n0) * k_rs + kvh * D;
  load_tile<D, kBlockRows>(k_tile, k + koff, k_rs, s.lk - n0);
  load_tile<D, kBlockRows>(v_tile, v + koff, k_rs, s.lk - n0);
  if (n_tiles > 0) issue(0);
  cp_async_commit();

  const int64_t key0 = n0 + warp * 16 + g, key1 = key0 + 8;  // this lane's two key rows
  float dka[1][DT][4], dva[1][DT][4];
  zero<DT>(dka[0]);
  zero<DT>(dva[0]);
  for (int j = 0; j < n_tiles; ++j) {
    ring_step(j, n_tiles, issue);
    const uint16_t* qt = stage_q(j);
    const uint16_t* dot = qt + kTile * S;
    const float* lse_t = stage_f(j);
    const float* di_t = lse_t + kTile;
    const int64_t h = head_of(j), i0 = start_of(j);
    const Dropout drop = dropout_of(p, b, h);
    // S^T = K Q^T and dP^T = V dO^T, the warp's 16 keys against the tile's queries.
    float st[1][NT][4], dpt[1][NT][4];
    zero<NT>(st[0]);
    zero<NT>(dpt[0]);
    mma_rows<kBf16, KS, NT, S, 1>(st, [&](int, int ks, uint32_t* a) { load_a<S>(a, k_tile, warp * 16, ks, lane); },
                                  qt, lane);
    mma_rows<kBf16, KS, NT, S, 1>(dpt, [&](int, int ks, uint32_t* a) { load_a<S>(a, v_tile, warp * 16, ks, lane); },
                                  dot, lane);
    // Rows are keys (key0, key1), columns queries i0 + 8 nt + 2t + e.
    const bool masked = p.causal && n0 + kBlockRows - 1 > i0 + shift;
    float pz[1][NT][4];
PE_TC_UNROLL
    for (int half = 0; half < 2; ++half) {
      const int64_t jkey = half ? key1 : key0;
PE_TC_UNROLL
      for (int nt = 0; nt < NT; ++nt) {
PE_TC_UNROLL
        for (int e = 0; e < 2; ++e) {
          const int c = nt * 8 + 2 * t + e;
          const int64_t i = i0 + c;
          const bool ok = !masked || jkey <= i + shift;
          const float pr = ok ? fast_exp2(st[0][nt][2 * half + e] * scale2 - ld_shared_f32(lse_t + c)) : 0.f;
          const float z = p.dropout > 0.f && !keep_element(p.seed, drop.sub, drop.threshold, i, jkey) ? 0.f : drop.rkeep;
          pz[0][nt][2 * half + e] = pr * z;
          st[0][nt][2 * half + e] = pr * (dpt[0][nt][2 * half + e] * z - ld_shared_f32(di_t + c)) * p.scale;  // dS^T
        }
      }
    }
    if constexpr (kAtomicDq) {  // dS^T, rounded as dK's operand is, for dQ below
PE_TC_UNROLL
      for (int half = 0; half < 2; ++half) {
PE_TC_UNROLL
        for (int nt = 0; nt < NT; ++nt) {
          st_shared_u32(ds_tile + (warp * 16 + 8 * half + g) * kDsStride + nt * 8 + 2 * t,
                        pack2<kBf16>(st[0][nt][2 * half], st[0][nt][2 * half + 1]));
        }
      }
    }
    uint32_t fa[1][NT / 2][4];
    to_a<kBf16, NT>(fa[0], pz[0]);
    mma_cols<kBf16, NT / 2, DT, S, 1>(dva, fa, dot, lane);
    to_a<kBf16, NT>(fa[0], st[0]);
    mma_cols<kBf16, NT / 2, DT, S, 1>(dka, fa, qt, lane);
    if constexpr (kAtomicDq) {
      block_sync();  // every warp's rows of dS^T are in
      add_dq<D, kBf16>(ds_tile, k_tile, dq_accum + (s.q0 + i0) * q_rs + h * D, q_rs, s.lq - i0, warp, lane);
    }
    block_sync();
  }
  const int64_t r0 = warp * 16;
  store_rows<kBf16, DT>(dka[0], dk + koff + r0 * k_rs, k_rs, g, t, s.lk - n0 - r0, 1.f, 1.f);
  store_rows<kBf16, DT>(dva[0], dv + koff + r0 * k_rs, k_rs, g, t, s.lk - n0 - r0, 1.f, 1.f);
}

// ---- the launch plan: one for the CUDA launcher and the emulator ---------------

struct Grid {
  int64_t x, y, z;
};

// Calls f(std::integral_constant<int, D>) for the head dims these kernels take.
template <class F>
bool with_head_dim(int64_t head_dim, F&& f) {
  switch (head_dim) {
    case 32: f(std::integral_constant<int, 32>{}); return true;
    case 64: f(std::integral_constant<int, 64>{}); return true;
    case 96: f(std::integral_constant<int, 96>{}); return true;
    case 128: f(std::integral_constant<int, 128>{}); return true;
    default: return false;
  }
}

// The most dynamic shared memory a call with this head dim asks for (0: not taken).
inline int smem_bytes_needed(int64_t head_dim) {
  int bytes = 0;
  with_head_dim(head_dim, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    for (int b : {kForwardSmemBytes<D>, kDqSmemBytes<D>, kDkdvAtomicSmemBytes<D>}) bytes = b > bytes ? b : bytes;
  });
  return bytes;
}

// launch(kernel, grid, smem_bytes, args...) runs kernel on grid, kThreads a
// block. p.kind is bf16 or fp16 and p.head_dim one with_head_dim takes.
template <class Launch>
void run_forward(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse,
                 Launch&& launch) {
  const Grid grid{blocks_of(p.seqlen_q, kForwardRows), p.heads_q, p.batch};
  const auto* qh = static_cast<const uint16_t*>(q);
  const auto* kh = static_cast<const uint16_t*>(k);
  const auto* vh = static_cast<const uint16_t*>(v);
  auto* oh = static_cast<uint16_t*>(out);
  with_head_dim(p.head_dim, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    if (p.kind == DType::kBFloat16) {
      launch(forward_kernel<D, true>, grid, kForwardSmemBytes<D>, p, qh, kh, vh, oh, lse);
    } else {
      launch(forward_kernel<D, false>, grid, kForwardSmemBytes<D>, p, qh, kh, vh, oh, lse);
    }
  });
}

// run_backward's workspace: D = rowsum(dO * O) (heads_q * total_q floats,
// rounded up to 16 bytes), then, for kAtomic, the float32 dQ.
inline int64_t rowdot_floats(const Problem& p) { return (p.heads_q * p.total_q + 3) / 4 * 4; }
inline int64_t backward_workspace_floats(const Problem& p, DqMode mode) {
  return rowdot_floats(p) + (mode == DqMode::kAtomic ? p.total_q * p.heads_q * p.head_dim : 0);
}

template <class Launch>
void run_backward(const Problem& p, const void* q, const void* k, const void* v, const void* out, const void* dout,
                  const float* lse, void* dq, void* dk, void* dv, void* workspace, DqMode mode, Launch&& launch) {
  const auto* qh = static_cast<const uint16_t*>(q);
  const auto* kh = static_cast<const uint16_t*>(k);
  const auto* vh = static_cast<const uint16_t*>(v);
  const auto* oh = static_cast<const uint16_t*>(out);
  const auto* doh = static_cast<const uint16_t*>(dout);
  auto* dqh = static_cast<uint16_t*>(dq);
  auto* dkh = static_cast<uint16_t*>(dk);
  auto* dvh = static_cast<uint16_t*>(dv);
  float* di = static_cast<float*>(workspace);
  float* dq_accum = mode == DqMode::kAtomic ? di + rowdot_floats(p) : nullptr;
  const int64_t dq_elems = p.total_q * p.heads_q * p.head_dim;
  const Grid rows{(p.total_q * p.heads_q + kWarps - 1) / kWarps, 1, 1};
  const Grid elems{blocks_of(dq_elems, 4 * kThreads), 1, 1};
  const Grid queries{blocks_of(p.seqlen_q, kBlockRows), p.heads_q, p.batch};
  const Grid keys{blocks_of(p.seqlen_k, kBlockRows), p.heads_k, p.batch};
  with_head_dim(p.head_dim, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    const bool bf16 = p.kind == DType::kBFloat16;
    if (rows.x > 0) {
      bf16 ? launch(rowdot_kernel<D, true>, rows, 0, p, oh, doh, di)
           : launch(rowdot_kernel<D, false>, rows, 0, p, oh, doh, di);
    }
    if (dq_accum == nullptr) {
      bf16 ? launch(dq_kernel<D, true>, queries, kDqSmemBytes<D>, p, qh, kh, vh, doh, lse, di, dqh)
           : launch(dq_kernel<D, false>, queries, kDqSmemBytes<D>, p, qh, kh, vh, doh, lse, di, dqh);
      if (keys.x > 0) {
        bf16 ? launch(dkdv_kernel<D, true, false>, keys, kDkdvSmemBytes<D>, p, qh, kh, vh, doh, lse, di, dkh, dvh,
                      dq_accum)
             : launch(dkdv_kernel<D, false, false>, keys, kDkdvSmemBytes<D>, p, qh, kh, vh, doh, lse, di, dkh, dvh,
                      dq_accum);
      }
      return;
    }
    if (elems.x > 0) launch(fill_zero_kernel, elems, 0, dq_accum, dq_elems);
    if (keys.x > 0) {
      bf16 ? launch(dkdv_kernel<D, true, true>, keys, kDkdvAtomicSmemBytes<D>, p, qh, kh, vh, doh, lse, di, dkh,
                    dvh, dq_accum)
           : launch(dkdv_kernel<D, false, true>, keys, kDkdvAtomicSmemBytes<D>, p, qh, kh, vh, doh, lse, di, dkh,
                    dvh, dq_accum);
    }
    if (elems.x == 0) return;
    bf16 ? launch(dq_convert_kernel<true>, elems, 0, static_cast<const float*>(dq_accum), dqh, dq_elems)
         : launch(dq_convert_kernel<false>, elems, 0, static_cast<const float*>(dq_accum), dqh, dq_elems);
  });
}

}  // namespace PE_TC_TARGET
}  // namespace paddle_ext::flash_attn::tc
