// CPU backend of FlashAttention-2: tiled attention with an online softmax.
//
// Forward: one task per (sequence, query head, block of kBlockQ queries),
// scheduled dynamically over the threads, head by head and heaviest first
// within a head (causal blocks near the bottom see the most keys). A task streams over blocks of kBlockK keys:
// S = Q K^T on a register-blocked micro-kernel against K^T packed into
// panels of 16 keys (short sequences: by each worker, for the (sequence, kv
// head) its task reads, so the panels stay in its cache; see KvPanels), masks (causal, partial blocks only: fully masked blocks
// are never visited), rescales its running max / sum, and accumulates P V
// straight from the value rows. Only the per-row log-sum-exp is kept.
//
// Backward: one unit per (sequence, kv head, chunk of query blocks); a unit
// recomputes P from the saved log-sum-exp block by block and runs the five
// products (S, dP = dO V^T, dV += P^T dO, dK += dS^T Q, dQ += dS K) on the
// same micro-kernel, key blocks outside and query blocks inside (as
// FlashAttention-2), accumulating dK / dV of its kv head (all heads of its
// group) in float32 buffers of Lk x D and dQ of one query head in Lq x D.
// Query blocks are split into chunks only when there are fewer kv heads than
// threads; chunk buffers are then summed. Extra memory: O((Lq + Lk) x D) per
// worker or unit, plus the packed K / V: linear in S. These buffers stay with
// the calling thread between calls (at most 64 MiB of them; larger ones are
// freed after the call), so a steady training loop takes no page faults here.
// (Accumulating dK / dV / dQ in place in the strided outputs saves a copy
// pass but was slower: rows 2 KiB apart conflict in the caches.)
//
// Causal: fully masked blocks are never visited, diagonal blocks are computed
// by groups of 6 rows up to the keys each group sees, and the per-call work
// (packing, scratch) is kept small, since it weighs twice as much per FLOP on
// causal attention's half-size quadratic part.
//
// FlashMask: tiles the mask hides entirely are skipped, partly hidden ones
// masked element by element; a mask that is only documents runs as
// variable-length attention over them (split_documents).
//
// float16 / bfloat16 inputs are converted to float32 once (linear memory) and
// computed in float32. The vectorised code exists twice: for AVX2+FMA (chosen
// at run time with __builtin_cpu_supports) and for the portable baseline.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PADDLE_EXT_FA_X86 1
#endif

#include "common/float_io.h"
#include "common/memory.h"
#include "common/parallel.h"
#include "flash_attn.h"

namespace paddle_ext::flash_attn {
namespace {

constexpr int64_t kBlockQ = 48;   // queries per task (a multiple of the micro-kernel's 6 rows)
constexpr int64_t kBlockK = 256;  // keys per inner step (a multiple of kPanel and of 32)
constexpr int64_t kPanel = 16;    // columns of a packed K^T / V^T panel
static_assert(kBlockQ % 6 == 0 && kBlockK % 32 == 0, "block sizes");
constexpr float kLog2e = 1.4426950408889634f;
constexpr double kLog2ed = 1.4426950408889634;
constexpr double kLn2d = 0.6931471805599453;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Rows the kernels' copy loops prefetch ahead of the one they read.
constexpr int64_t kPrefetchAhead = 4;

// Asks the caches for `rows` rows of `floats` floats, `rs` apart (rows <= 0:
// nothing). Token rows of one head lie heads * head_dim floats apart (2 KiB
// for 8 heads of 64), so a copy walking them crosses a page every row or two,
// where the hardware prefetchers stop: each 256-byte row came from memory at
// the copy, a few percent of a 512-token causal forward.
inline void prefetch_rows(const float* p, int64_t rows, int64_t rs, int64_t floats) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t f = 0; f < floats; f += 16) __builtin_prefetch(p + r * rs + f, 0, 2);
}

// FlashMask bounds of one (sequence, mask head, key block): the extremes over
// its keys of the two hidden row intervals [a1, b1), [a2, b2).
struct FmBlock {
  int32_t max_a1, min_b1, min_a1, max_b1, max_a2, min_b2, min_a2, max_b2;
};

// float32 views of the operands and where the results go.
struct Ctx {
  Problem p;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* o = nullptr;
  const float* dout = nullptr;
  // Packed copies of one (sequence, kv head), pack_sequence's layout: K^T /
  // V^T as panels of 16 keys (panel j: D x 16 at j * 16 * D), K / V rows as
  // panels of 16 columns (panel n: Lk' x 16 at n * Lk' * 16, Lk' = Lk rounded
  // up to 16). The forward and backward kernels get theirs from KvPanels; kt
  // here is the softmax's copy of every (sequence, kv head).
  const float* kt = nullptr;
  std::vector<int64_t> pack_offset;  // per sequence: where its panels start in a whole-call copy
  float* lse = nullptr;
  void* out = nullptr;
  void* softmax = nullptr;
  void* dq = nullptr;
  bool dropout = false;
  uint32_t threshold = 0;
  float inv_keep = 1.f;
  // FlashMask: per (sequence, mask head, key) the hidden query rows as
  // a1, b1, a2, b2 (intervals [a1, b1) and [a2, b2)), and per key block of
  // kBlockK their bounds.
  std::vector<int32_t> fm_rows;
  std::vector<FmBlock> fm_blocks;
  int64_t fm_key_blocks = 0;

  int64_t mask_head(int64_t h) const {
    if (p.mask_heads == p.heads_q) return h;
    return p.mask_heads == p.heads_k ? h / (p.heads_q / p.heads_k) : 0;
  }

  int64_t pack_base(int64_t b, int64_t kvh) const {
    return pack_offset[b] + kvh * round_up(sequence_of(p, b).lk, kPanel) * round_up(p.head_dim, kPanel);
  }
  int64_t row_panel_stride(int64_t b) const { return round_up(sequence_of(p, b).lk, kPanel) * kPanel; }
  int64_t lse_index(const Sequence& s, int64_t h, int64_t i) const { return flash_attn::lse_index(p, s, h, i); }
};

// z[j] = 1 / (1 - p) for kept and 0 for dropped elements (i, k0 + j), j < n (n % 4 == 0).
void dropout_row_scalar(const Ctx& ctx, uint64_t subsequence, int64_t i, int64_t k0, int64_t n, float* z) {
  for (int64_t j = 0; j < n; j += 4) {
    const Philox4 r = dropout_bits(ctx.p.seed, subsequence, i, (k0 + j) >> 2);
    for (int w = 0; w < 4; ++w) z[j + w] = r.x[w] >= ctx.threshold ? ctx.inv_keep : 0.f;
  }
}

// rows x cols of src (row stride src_rs) into dst (kind) at element dst_off, row stride dst_rs.
void store_rows(DType kind, const float* src, int64_t src_rs, int64_t rows, int64_t cols, void* dst,
                int64_t dst_off, int64_t dst_rs) {
  with_dtype<false>(kind, [&](auto io) {
    using Io = decltype(io);
    for (int64_t r = 0; r < rows; ++r) {
      const float* s = src + r * src_rs;
      typename Io::Storage* d = static_cast<typename Io::Storage*>(dst) + dst_off + r * dst_rs;
      for (int64_t c = 0; c < cols; ++c) d[c] = Io::store(s[c]);
    }
  });
}

// A float32 view of n elements: the data itself, or a converted copy in `buf`.
const float* as_f32(DType kind, const void* data, int64_t n, std::vector<float>* buf) {
  if (kind == DType::kFloat32 || data == nullptr) return static_cast<const float*>(data);
  buf->resize(n);
  float* dst = buf->data();
  with_dtype<false>(kind, [&](auto io) {
    using Io = decltype(io);
    const auto* src = static_cast<const typename Io::Storage*>(data);
    parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] = Io::load(src[i]);
    });
  });
  return dst;
}

// Per-call scratch (packed K / V, gradient accumulators, tiles) of n floats,
// uninitialised: every user writes before it reads. Kept per calling thread
// between calls, up to kRetainFloats in all, because a fresh block costs a
// page fault and a kernel-side zeroing per page, which took about a tenth of
// a causal forward at S = 2048. These costs are linear in S, but causal
// attention does half the quadratic work, so they weigh twice as much on its
// speed per FLOP. Larger requests get a fresh block, freed after the call.
enum Slot { kSlotKt, kSlotAcc, kSlotDq, kSlotPrep, kSlotScratch, kSlots };
constexpr int64_t kRetainFloats = int64_t{16} << 20;  // 64 MiB per calling thread

class Floats {
 public:
  Floats(Slot slot, int64_t n) {
    struct Cache {
      std::unique_ptr<float[]> buf[kSlots];
      int64_t size[kSlots] = {};
      int64_t total = 0;
    };
    thread_local Cache cache;
    n = std::max<int64_t>(n, 1);
    if (cache.size[slot] >= n) {
      ptr_ = cache.buf[slot].get();
      return;
    }
    if (cache.total - cache.size[slot] + n <= kRetainFloats) {
      cache.total += n - cache.size[slot];
      cache.buf[slot].reset();  // release the old block first: peak memory stays one block per slot
      cache.buf[slot].reset(new float[static_cast<size_t>(n)]);
      cache.size[slot] = n;
      ptr_ = cache.buf[slot].get();
    } else {
      own_.reset(new float[static_cast<size_t>(n)]);
      ptr_ = own_.get();
    }
    advise_huge_pages(ptr_, static_cast<size_t>(n) * sizeof(float));
  }
  float* get() const { return ptr_; }

 private:
  std::unique_ptr<float[]> own_;
  float* ptr_ = nullptr;
};

void pack_sequence(bool transposed, const float* rows, int64_t rs, int64_t lk, int64_t D, float* base);

// Packs every (sequence, kv head) of src (float32 token rows of heads_k * D)
// into dst at ctx.pack_base(): transposed (K^T panels) or as row panels, zero
// beyond the sequence / D. One pass writing each packed element once, in the
// order it is laid out.
void pack_into(const Ctx& ctx, const float* src, bool transposed, float* dst) {
  const Problem& p = ctx.p;
  const int64_t D = p.head_dim, k_rs = p.heads_k * D;
  parallel_for(p.batch * p.heads_k, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / p.heads_k, kvh = t % p.heads_k;
      const Sequence s = sequence_of(p, b);
      pack_sequence(transposed, src + s.k0 * k_rs + kvh * D, k_rs, s.lk, D, dst + ctx.pack_base(b, kvh));
    }
  });
}

Floats pack(const Ctx& ctx, const float* src, bool transposed, Slot slot) {
  Floats packed(slot, ctx.pack_offset[ctx.p.batch]);
  pack_into(ctx, src, transposed, packed.get());
  return packed;
}

// Packed copies of one (sequence, kv head) beyond which KvPanels packs the
// whole call at once: half of this machine's 1 MiB L2.
constexpr int64_t kCachedPanelBytes = int64_t{512} << 10;

// The packed K / V copies (each: K or V, transposed or as row panels) that
// the forward and backward kernels read per (sequence, kv head). When one
// (sequence, kv head)'s copies fit in cache, each worker packs the one its
// task needs into its own buffer when a task of another comes (tasks and
// units run head by head), and reads the panels from cache: packed once for
// the whole call, they went through memory (16 MiB written and read back in
// a forward over 8 x 512 tokens of 8 heads), about a twentieth of a forward
// over 512-token sequences, whose quadratic part is small. Longer sequences
// are packed once for the call, as before: their panels leave the cache
// either way, and with more workers each would pack every head it meets.
class KvPanels {
 public:
  struct Copy {
    const float* src;
    bool transposed;
  };

  KvPanels(const Ctx& ctx, std::vector<Copy> copies, int64_t workers)
      : ctx_(ctx),
        copies_(std::move(copies)),
        slot_(largest_slot(ctx)),
        per_worker_(static_cast<int64_t>(copies_.size()) * slot_ * static_cast<int64_t>(sizeof(float)) <=
                    kCachedPanelBytes),
        stride_(per_worker_ ? slot_ : ctx.pack_offset[ctx.p.batch]),
        buf_(kSlotKt, static_cast<int64_t>(copies_.size()) * stride_ * (per_worker_ ? workers : 1)),
        holds_(static_cast<size_t>(workers), -1) {
    if (per_worker_) return;
    for (size_t c = 0; c < copies_.size(); ++c)
      pack_into(ctx, copies_[c].src, copies_[c].transposed, buf_.get() + c * stride_);
  }

  // Whether each worker packs the copies it reads (short sequences) rather than
  // reading copies packed once for the call.
  bool per_worker() const { return per_worker_; }

  // out[c]: copy c of (sequence b, kv head kvh) for worker w.
  void get(int64_t w, int64_t b, int64_t kvh, const float** out) {
    const int64_t n = static_cast<int64_t>(copies_.size());
    if (!per_worker_) {
      for (int64_t c = 0; c < n; ++c) out[c] = buf_.get() + c * stride_ + ctx_.pack_base(b, kvh);
      return;
    }
    float* mine = buf_.get() + w * n * stride_;
    const int64_t key = b * ctx_.p.heads_k + kvh;
    if (holds_[w] != key) {
      const Sequence s = sequence_of(ctx_.p, b);
      const int64_t D = ctx_.p.head_dim, k_rs = ctx_.p.heads_k * D;
      for (int64_t c = 0; c < n; ++c)
        pack_sequence(copies_[c].transposed, copies_[c].src + s.k0 * k_rs + kvh * D, k_rs, s.lk, D,
                      mine + c * stride_);
      holds_[w] = key;
    }
    for (int64_t c = 0; c < n; ++c) out[c] = mine + c * stride_;
  }

 private:
  static int64_t largest_slot(const Ctx& ctx) {  // floats of one (sequence, kv head) copy
    int64_t slot = 0;
    for (int64_t b = 0; b < ctx.p.batch; ++b)
      slot = std::max(slot, ctx.row_panel_stride(b) * round_up(ctx.p.head_dim, kPanel) / kPanel);
    return slot;
  }

  const Ctx& ctx_;
  const std::vector<Copy> copies_;
  const int64_t slot_;
  const bool per_worker_;
  const int64_t stride_;  // floats from one copy to the next
  const Floats buf_;
  std::vector<int64_t> holds_;  // per worker: the (sequence, kv head) its buffer holds, or -1
};

// The query rows one key column's startend_row_indices entry `se` hides, as
// two intervals [iv[0], iv[1]) and [iv[2], iv[3]) (see Problem::startend).
void hidden_rows(const Problem& p, const int32_t* se, int32_t* iv) {
  constexpr int32_t kBig = std::numeric_limits<int32_t>::max();
  if (p.causal) {
    iv[0] = se[0], iv[1] = p.mask_cols == 2 ? se[1] : kBig, iv[2] = 0, iv[3] = 0;
  } else if (p.mask_cols == 2) {
    iv[0] = se[0], iv[1] = kBig, iv[2] = 0, iv[3] = se[1];
  } else {
    iv[0] = se[0], iv[1] = se[1], iv[2] = se[2], iv[3] = se[3];
  }
}

void init_ctx(Ctx* ctx, const Problem& p) {
  ctx->p = p;
  ctx->pack_offset.assign(p.batch + 1, 0);
  for (int64_t b = 0; b < p.batch; ++b)
    ctx->pack_offset[b + 1] =
        ctx->pack_offset[b] + round_up(sequence_of(p, b).lk, kPanel) * p.heads_k * round_up(p.head_dim, kPanel);
  ctx->dropout = p.dropout > 0.f;
  if (ctx->dropout) {
    ctx->threshold = dropout_threshold(p.dropout);
    ctx->inv_keep = 1.f / (1.f - p.dropout);
  }
  if (p.startend == nullptr) return;
  // FlashMask: each key's hidden rows as two intervals, then per key block the
  // bounds that tell a tile fully hidden (skipped), untouched or partly hidden.
  const int64_t lk = p.seqlen_k, cols = p.mask_cols, n = p.batch * p.mask_heads;
  constexpr int32_t kBig = std::numeric_limits<int32_t>::max(), kSmall = std::numeric_limits<int32_t>::min();
  ctx->fm_rows.resize(static_cast<size_t>(n * lk * 4));
  ctx->fm_key_blocks = (lk + kBlockK - 1) / kBlockK;
  ctx->fm_blocks.resize(static_cast<size_t>(n * ctx->fm_key_blocks));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < lk; ++j) {
      hidden_rows(p, p.startend + (t * lk + j) * cols, ctx->fm_rows.data() + (t * lk + j) * 4);
    }
    for (int64_t kb = 0; kb < ctx->fm_key_blocks; ++kb) {
      FmBlock f{kSmall, kBig, kBig, kSmall, kSmall, kBig, kBig, kSmall};
      for (int64_t j = kb * kBlockK; j < std::min<int64_t>(lk, (kb + 1) * kBlockK); ++j) {
        const int32_t* iv = ctx->fm_rows.data() + (t * lk + j) * 4;
        f.max_a1 = std::max(f.max_a1, iv[0]), f.min_a1 = std::min(f.min_a1, iv[0]);
        f.min_b1 = std::min(f.min_b1, iv[1]), f.max_b1 = std::max(f.max_b1, iv[1]);
        f.max_a2 = std::max(f.max_a2, iv[2]), f.min_a2 = std::min(f.min_a2, iv[2]);
        f.min_b2 = std::min(f.min_b2, iv[3]), f.max_b2 = std::max(f.max_b2, iv[3]);
      }
      ctx->fm_blocks[t * ctx->fm_key_blocks + kb] = f;
    }
  }
}

// How the FlashMask covers query rows [i0, i1) x key block k0 (a multiple of
// kBlockK) of query head h: not at all, partly, or fully (the tile is skipped).
enum class Cover { kNone, kPartial, kFull };

Cover flashmask_cover(const Ctx& ctx, int64_t b, int64_t h, int64_t i0, int64_t i1, int64_t k0) {
  if (ctx.p.startend == nullptr) return Cover::kNone;
  const FmBlock& f = ctx.fm_blocks[(b * ctx.p.mask_heads + ctx.mask_head(h)) * ctx.fm_key_blocks + k0 / kBlockK];
  if ((f.max_a1 <= i0 && f.min_b1 >= i1) || (f.max_a2 <= i0 && f.min_b2 >= i1)) return Cover::kFull;
  const bool miss1 = f.min_a1 >= i1 || f.max_b1 <= i0, miss2 = f.min_a2 >= i1 || f.max_b2 <= i0;
  return miss1 && miss2 ? Cover::kNone : Cover::kPartial;
}

// S = -inf (and dP = 0 when given) where the FlashMask hides key k0 + c from
// query i0 + r (r < rows, c < width; rows kBlockK apart).
void flashmask_block(const Ctx& ctx, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t k0, int64_t width,
                     float* S, float* dP) {
  const int64_t lk = ctx.p.seqlen_k;
  const int32_t* iv = ctx.fm_rows.data() + ((b * ctx.p.mask_heads + ctx.mask_head(h)) * lk + k0) * 4;
  const int64_t cols = std::min<int64_t>(width, lk - k0);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t c = 0; c < cols; ++c, iv += 4) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      if ((iv[0] <= i && i < iv[1]) || (iv[2] <= i && i < iv[3])) {
        S[r * kBlockK + c] = ninf;
        if (dP != nullptr) dP[r * kBlockK + c] = 0.f;
      }
    }
  }
}

// Runs fn(worker, task) for tasks [0, n) on up to `workers` threads, handing
// tasks out in order as threads free up.
template <typename Fn>
void run_tasks(int64_t n, int64_t workers, Fn&& fn) {
  if (n <= 0) return;
  if (workers <= 1) {
    for (int64_t t = 0; t < n; ++t) fn(int64_t{0}, t);
    return;
  }
  std::atomic<int64_t> next{0};
  run_workers(workers, [&](int64_t w) {
    for (int64_t t = next.fetch_add(1); t < n; t = next.fetch_add(1)) fn(w, t);
  });
}

int64_t workers_for(int64_t tasks) { return std::max<int64_t>(1, std::min<int64_t>(num_threads(), tasks)); }

int64_t scratch_floats(int64_t D) {
  return 2 * kBlockQ * D + 2 * kBlockQ * round_up(D, kPanel) + 2 * kBlockQ * kBlockK + 4 * kBlockQ + kBlockK + 64;
}

struct QueryTask {
  int64_t b, h, i0, work;
};

// (sequence, query head, query block) tasks: sequences by decreasing work,
// then head by head, each head's blocks heaviest first. Head-major keeps the
// threads on one head's K / V at a time (consecutive causal blocks read
// nearly the same key prefix, so it stays in cache; a heaviest-first order
// across all heads cycled through every head's K / V between blocks and
// left causal attention 5-10% slower per FLOP at S = 1024-2048), while the
// queue still ends on the lightest blocks of the last head, so the threads
// finish within one small block of each other.
std::vector<QueryTask> query_tasks(const Problem& p) {
  std::vector<int64_t> order(p.batch), work(p.batch);
  for (int64_t b = 0; b < p.batch; ++b) work[b] = sequence_of(p, b).lq * sequence_of(p, b).lk;
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return work[a] > work[b]; });
  std::vector<QueryTask> tasks;
  for (const int64_t b : order) {
    const Sequence s = sequence_of(p, b);
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const size_t first = tasks.size();
      for (int64_t i0 = 0; i0 < s.lq; i0 += kBlockQ) {
        const int64_t rows = std::min<int64_t>(kBlockQ, s.lq - i0);
        const int64_t keys =
            p.causal ? std::min<int64_t>(s.lk, std::max<int64_t>(0, i0 + rows + causal_shift(p, s.lq, s.lk))) : s.lk;
        tasks.push_back({b, h, i0, rows * std::max<int64_t>(keys, 1)});
      }
      std::stable_sort(tasks.begin() + first, tasks.end(),
                       [](const QueryTask& x, const QueryTask& y) { return x.work > y.work; });
    }
  }
  return tasks;
}

// ---- vector types ----------------------------------------------------------

struct VecGeneric {
  static constexpr int kWidth = 8;
  static constexpr bool kHasPhilox8 = false;
  static void dropout32(uint64_t, uint64_t, int64_t, int64_t, uint32_t, float, float*) {}
  struct T {
    float v[8];
  };
  // c[i * c_rs + r] = a[r * a_rs + i], r, i < 8
  static void transpose8(const float* a, int64_t a_rs, float* c, int64_t c_rs) {
    for (int r = 0; r < 8; ++r)
      for (int i = 0; i < 8; ++i) c[i * c_rs + r] = a[r * a_rs + i];
  }
  static T zero() { return set1(0.f); }
  static T set1(float x) {
    T r;
    for (int i = 0; i < 8; ++i) r.v[i] = x;
    return r;
  }
  static T load(const float* p) {
    T r;
    for (int i = 0; i < 8; ++i) r.v[i] = p[i];
    return r;
  }
  static void store(float* p, T a) {
    for (int i = 0; i < 8; ++i) p[i] = a.v[i];
  }
  static T fma(T a, T b, T c) {
    for (int i = 0; i < 8; ++i) c.v[i] += a.v[i] * b.v[i];
    return c;
  }
  static T add(T a, T b) {
    for (int i = 0; i < 8; ++i) a.v[i] += b.v[i];
    return a;
  }
  static T sub(T a, T b) {
    for (int i = 0; i < 8; ++i) a.v[i] -= b.v[i];
    return a;
  }
  static T mul(T a, T b) {
    for (int i = 0; i < 8; ++i) a.v[i] *= b.v[i];
    return a;
  }
  static T max(T a, T b) {
    for (int i = 0; i < 8; ++i) a.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];
    return a;
  }
  static float hmax(T a) {
    float m = a.v[0];
    for (int i = 1; i < 8; ++i) m = a.v[i] > m ? a.v[i] : m;
    return m;
  }
  static float hsum(T a) {
    float s = 0.f;
    for (int i = 0; i < 8; ++i) s += a.v[i];
    return s;
  }
  static T exp2(T x) {
    for (int i = 0; i < 8; ++i) x.v[i] = std::exp2(x.v[i]);
    return x;
  }
};

}  // namespace

#define PE_FA_NS generic
#define PE_FA_VEC VecGeneric
#include "cpu/flash_attn_cpu_impl.h"
#undef PE_FA_NS
#undef PE_FA_VEC

#if defined(PADDLE_EXT_FA_X86)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

namespace {

struct VecAvx2 {
  static constexpr int kWidth = 8;
  static constexpr bool kHasPhilox8 = true;
  using T = __m256;

  // 32-bit lanes: (hi, lo) halves of a * m for a constant multiplier m.
  static void mulhilo8(__m256i a, __m256i m, __m256i* hi, __m256i* lo) {
    const __m256i even = _mm256_mul_epu32(a, m);                         // lanes 0, 2, 4, 6 as 64-bit
    const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);  // lanes 1, 3, 5, 7
    *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  }

  // keep_element() of flash_attn.h for columns 4 * j4 .. 4 * j4 + 31 of row i:
  // eight Philox4x32-10 counters in parallel, then words back in column order.
  static void dropout32(uint64_t seed, uint64_t sub, int64_t i, int64_t j4, uint32_t threshold, float inv_keep,
                        float* z) {
    __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(j4))),
                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i c1 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(i)));
    __m256i c2 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(sub)));
    __m256i c3 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(sub >> 32)));
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
    const __m256i m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
    for (int round = 0; round < 10; ++round) {
      __m256i hi0, lo0, hi1, lo1;
      mulhilo8(c0, m0, &hi0, &lo0);
      mulhilo8(c2, m1, &hi1, &lo1);
      c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
      c1 = lo1;
      c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
      c3 = lo0;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    // c0..c3 hold word 0..3 of counters 0..7: transpose to columns 0..31.
    const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
    const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    const __m256i cols[4] = {_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u2, u3, 0x20),
                             _mm256_permute2x128_si256(u0, u1, 0x31), _mm256_permute2x128_si256(u2, u3, 0x31)};
    const __m256i thr = _mm256_set1_epi32(static_cast<int>(threshold));
    const __m256 inv = _mm256_set1_ps(inv_keep);
    for (int b = 0; b < 4; ++b) {
      const __m256i keep = _mm256_cmpeq_epi32(_mm256_max_epu32(cols[b], thr), cols[b]);  // word >= threshold
      _mm256_storeu_ps(z + 8 * b, _mm256_and_ps(_mm256_castsi256_ps(keep), inv));
    }
  }
  // c[i * c_rs + r] = a[r * a_rs + i], r, i < 8: unpack pairs, then 64-bit
  // shuffles, then 128-bit halves. Inlined by force: as a call (GCC keeps it
  // out of line) it took ~2.5% of a 512-token causal forward.
  __attribute__((always_inline)) static inline void transpose8(const float* a, int64_t a_rs, float* c, int64_t c_rs) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(a + i * a_rs);
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
      r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
      r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
      r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
      _mm256_storeu_ps(c + i * c_rs, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
      _mm256_storeu_ps(c + (i + 4) * c_rs, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
  }
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T a) { _mm256_storeu_ps(p, a); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static float hmax(T a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
  }
  static float hsum(T a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  // 2^x for x <= 0 (the softmax's s - max and s - lse): round to the nearest
  // integer n, Cephes' degree-6 polynomial for 2^(x - n) (relative error
  // about 2e-7), n into the exponent bits. x <= -127 (masked entries are
  // -inf) gives exactly 0: n = -127 makes the exponent field, hence 2^n, zero.
  static T exp2(T x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-127.f));
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(x, n);
    __m256 r = _mm256_set1_ps(1.535336188319500e-4f);
    r = _mm256_fmadd_ps(r, f, _mm256_set1_ps(1.339887440266574e-3f));
    r = _mm256_fmadd_ps(r, f, _mm256_set1_ps(9.618437357674640e-3f));
    r = _mm256_fmadd_ps(r, f, _mm256_set1_ps(5.550332471162809e-2f));
    r = _mm256_fmadd_ps(r, f, _mm256_set1_ps(2.402264791363012e-1f));
    r = _mm256_fmadd_ps(r, f, _mm256_set1_ps(6.931472028550421e-1f));
    r = _mm256_fmadd_ps(r, f, _mm256_set1_ps(1.f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(r, _mm256_castsi256_ps(e));
  }
};

}  // namespace

#define PE_FA_NS avx2
#define PE_FA_VEC VecAvx2
#include "cpu/flash_attn_cpu_impl.h"
#undef PE_FA_NS
#undef PE_FA_VEC

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // PADDLE_EXT_FA_X86

namespace {

// PADDLE_EXT_FLASH_ATTN_ISA=generic forces the portable code (read per call: tests switch it).
bool use_avx2() {
#if defined(PADDLE_EXT_FA_X86)
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const char* isa = std::getenv("PADDLE_EXT_FLASH_ATTN_ISA");
  return supported && !(isa != nullptr && std::strcmp(isa, "generic") == 0);
#else
  return false;
#endif
}

void forward_block(const Ctx& ctx, int64_t b, int64_t h, int64_t i0, const float* kt, const float* vr,
                   float* scratch) {
#if defined(PADDLE_EXT_FA_X86)
  if (use_avx2()) return avx2::forward_block(ctx, b, h, i0, kt, vr, scratch);
#endif
  generic::forward_block(ctx, b, h, i0, kt, vr, scratch);
}

void softmax_block(const Ctx& ctx, int64_t b, int64_t h, int64_t i0, float* scratch) {
#if defined(PADDLE_EXT_FA_X86)
  if (use_avx2()) return avx2::softmax_block(ctx, b, h, i0, scratch);
#endif
  generic::softmax_block(ctx, b, h, i0, scratch);
}

void backward_unit(const Ctx& ctx, int64_t b, int64_t kvh, int64_t chunk, int64_t chunks, const float* kt,
                   const float* kr, const float* vt, float* dk_acc, float* dv_acc, float* dq_acc, float* prep,
                   float* scratch) {
#if defined(PADDLE_EXT_FA_X86)
  if (use_avx2())
    return avx2::backward_unit(ctx, b, kvh, chunk, chunks, kt, kr, vt, dk_acc, dv_acc, dq_acc, prep, scratch);
#endif
  generic::backward_unit(ctx, b, kvh, chunk, chunks, kt, kr, vt, dk_acc, dv_acc, dq_acc, prep, scratch);
}

void pack_sequence(bool transposed, const float* rows, int64_t rs, int64_t lk, int64_t D, float* base) {
#if defined(PADDLE_EXT_FA_X86)
  if (use_avx2()) return avx2::pack_sequence(transposed, rows, rs, lk, D, base);
#endif
  generic::pack_sequence(transposed, rows, rs, lk, D, base);
}

}  // namespace

const char* cpu_isa() { return use_avx2() ? "avx2" : "generic"; }

namespace {

void forward_aligned(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse) {
  Ctx ctx;
  init_ctx(&ctx, p);
  std::vector<float> q32, k32, v32;
  ctx.q = as_f32(p.kind, q, p.total_q * p.heads_q * p.head_dim, &q32);
  ctx.k = as_f32(p.kind, k, p.total_k * p.heads_k * p.head_dim, &k32);
  ctx.v = as_f32(p.kind, v, p.total_k * p.heads_k * p.head_dim, &v32);
  ctx.lse = lse;
  ctx.out = out;
  const std::vector<QueryTask> tasks = query_tasks(p);
  const int64_t workers = workers_for(static_cast<int64_t>(tasks.size()));
  const int64_t per_worker = scratch_floats(p.head_dim);
  const Floats scratch(kSlotScratch, workers * per_worker);
  const int64_t q_rs = p.heads_q * p.head_dim;
  KvPanels panels(ctx, {{ctx.k, true}, {ctx.v, false}}, workers);
  const int64_t group = p.heads_q / p.heads_k;
  auto run = [&](int64_t w, int64_t t) {
    const int64_t b = tasks[t].b;
    const float* kv[2];  // K^T, V
    panels.get(w, b, tasks[t].h / group, kv);
    if (t + 1 < static_cast<int64_t>(tasks.size())) {  // the query rows of the task likely to follow
      const QueryTask& n = tasks[t + 1];
      const Sequence s = sequence_of(p, n.b);
      prefetch_rows(ctx.q + (s.q0 + n.i0) * q_rs + n.h * p.head_dim, std::min<int64_t>(kBlockQ, s.lq - n.i0), q_rs,
                    p.head_dim);
    }
    forward_block(ctx, b, tasks[t].h, tasks[t].i0, kv[0], kv[1], scratch.get() + w * per_worker);
  };
  // Short sequences, each worker packing its own panels: handed out block by block,
  // both workers met every (sequence, kv head) and packed it (at 2 threads, 8 x 512
  // tokens: the packing was 7% of the forward, twice its 1-thread share). With enough
  // (sequence, kv head) runs to balance the workers, a worker takes a whole run, except
  // the last 2 per worker, handed out block by block again so that the workers finish
  // within one block of each other rather than one run (3% of that forward).
  std::vector<int64_t> runs{0};  // task index where each (sequence, kv head) run starts
  for (int64_t t = 1; t < static_cast<int64_t>(tasks.size()); ++t)
    if (tasks[t].b != tasks[t - 1].b || tasks[t].h / group != tasks[t - 1].h / group) runs.push_back(t);
  runs.push_back(static_cast<int64_t>(tasks.size()));
  const int64_t n_runs = static_cast<int64_t>(runs.size()) - 1;
  if (workers > 1 && panels.per_worker() && n_runs >= 8 * workers) {
    std::vector<std::pair<int64_t, int64_t>> items;  // task ranges, in queue order
    const int64_t whole = n_runs - 2 * workers;
    for (int64_t r = 0; r < whole; ++r) items.emplace_back(runs[r], runs[r + 1]);
    for (int64_t t = runs[whole]; t < static_cast<int64_t>(tasks.size()); ++t) items.emplace_back(t, t + 1);
    run_tasks(static_cast<int64_t>(items.size()), workers, [&](int64_t w, int64_t i) {
      for (int64_t t = items[i].first; t < items[i].second; ++t) run(w, t);
    });
    return;
  }
  run_tasks(static_cast<int64_t>(tasks.size()), workers, run);
}

void softmax_aligned(const Problem& p, const void* q, const void* k, const float* lse, void* softmax) {
  Ctx ctx;
  init_ctx(&ctx, p);
  std::vector<float> q32, k32;
  ctx.q = as_f32(p.kind, q, p.total_q * p.heads_q * p.head_dim, &q32);
  ctx.k = as_f32(p.kind, k, p.total_k * p.heads_k * p.head_dim, &k32);
  const Floats kt = pack(ctx, ctx.k, true, kSlotKt);
  ctx.kt = kt.get();
  ctx.lse = const_cast<float*>(lse);
  ctx.softmax = softmax;
  const int64_t elems = p.batch * p.heads_q * p.seqlen_q * p.seqlen_k;
  const int64_t esize = dtype_bytes(p.kind);
  std::memset(softmax, 0, static_cast<size_t>(elems * esize));
  const std::vector<QueryTask> tasks = query_tasks(p);
  const int64_t workers = workers_for(static_cast<int64_t>(tasks.size()));
  const int64_t per_worker = scratch_floats(p.head_dim);
  const Floats scratch(kSlotScratch, workers * per_worker);
  run_tasks(static_cast<int64_t>(tasks.size()), workers, [&](int64_t w, int64_t t) {
    softmax_block(ctx, tasks[t].b, tasks[t].h, tasks[t].i0, scratch.get() + w * per_worker);
  });
}

void backward_aligned(const Problem& p, const void* q, const void* k, const void* v, const void* out,
                      const void* dout, const float* lse, void* dq, void* dk, void* dv) {
  Ctx ctx;
  init_ctx(&ctx, p);
  const int64_t D = p.head_dim, k_rs = p.heads_k * D;
  std::vector<float> q32, k32, v32, o32, do32;
  ctx.q = as_f32(p.kind, q, p.total_q * p.heads_q * D, &q32);
  ctx.k = as_f32(p.kind, k, p.total_k * k_rs, &k32);
  ctx.v = as_f32(p.kind, v, p.total_k * k_rs, &v32);
  ctx.o = as_f32(p.kind, out, p.total_q * p.heads_q * D, &o32);
  ctx.dout = as_f32(p.kind, dout, p.total_q * p.heads_q * D, &do32);
  ctx.lse = const_cast<float*>(lse);
  ctx.dq = dq;

  // Units: (sequence, kv head) x chunks; enough of them to keep every thread busy.
  int64_t max_lk = 0, max_lq = 0, max_blocks = 1;
  std::vector<int64_t> order(p.batch);
  std::vector<int64_t> work(p.batch);
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence s = sequence_of(p, b);
    max_lk = std::max(max_lk, s.lk);
    max_lq = std::max(max_lq, s.lq);
    max_blocks = std::max(max_blocks, (s.lq + kBlockQ - 1) / kBlockQ);
    work[b] = s.lq * s.lk;
  }
  const int64_t threads = num_threads();
  const int64_t base_units = p.batch * p.heads_k;
  int64_t chunks = 1;
  if (base_units < 2 * threads) chunks = std::min<int64_t>(max_blocks, (2 * threads + base_units - 1) / base_units);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return work[a] > work[b]; });
  const int64_t units = base_units * chunks;
  const int64_t workers = workers_for(units);
  const int64_t per_worker = scratch_floats(D);
  const Floats scratch(kSlotScratch, workers * per_worker);
  // chunks == 1: one dK / dV buffer pair per worker, written out by the unit;
  // otherwise one pair per unit, summed below.
  const int64_t acc = max_lk * D;
  const Floats acc_buf(kSlotAcc, (chunks == 1 ? workers : units) * 2 * acc);
  const Floats dq_buf(kSlotDq, workers * max_lq * D);  // a worker's dQ rows of one query head
  // a worker's prepared query blocks (one query head of one unit); generic:: and
  // avx2:: agree on the size
  const int64_t prep_floats = max_blocks * generic::prep_block_floats(D);
  const Floats prep_buf(kSlotPrep, workers * prep_floats);
  KvPanels panels(ctx, {{ctx.k, true}, {ctx.k, false}, {ctx.v, true}}, workers);  // K^T, K, V^T
  run_tasks(units, workers, [&](int64_t w, int64_t t) {
    const int64_t b = order[t / (p.heads_k * chunks)];
    const int64_t kvh = (t / chunks) % p.heads_k, chunk = t % chunks;
    const float* kv[3];
    panels.get(w, b, kvh, kv);
    const int64_t slot = chunks == 1 ? w : (b * p.heads_k + kvh) * chunks + chunk;
    float* dk_acc = acc_buf.get() + slot * 2 * acc;
    float* dv_acc = dk_acc + acc;
    backward_unit(ctx, b, kvh, chunk, chunks, kv[0], kv[1], kv[2], dk_acc, dv_acc, dq_buf.get() + w * max_lq * D,
                  prep_buf.get() + w * prep_floats, scratch.get() + w * per_worker);
    if (chunks == 1) {
      const Sequence s = sequence_of(p, b);
      store_rows(p.kind, dk_acc, D, s.lk, D, dk, s.k0 * k_rs + kvh * D, k_rs);
      store_rows(p.kind, dv_acc, D, s.lk, D, dv, s.k0 * k_rs + kvh * D, k_rs);
    }
  });
  if (chunks > 1) {
    parallel_for(base_units, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> sum(2 * acc);
      for (int64_t u = begin; u < end; ++u) {
        const int64_t b = u / p.heads_k, kvh = u % p.heads_k;
        const Sequence s = sequence_of(p, b);
        std::fill(sum.begin(), sum.end(), 0.f);
        for (int64_t c = 0; c < chunks; ++c) {
          const float* part = acc_buf.get() + (u * chunks + c) * 2 * acc;
          for (int64_t i = 0; i < s.lk * D; ++i) {
            sum[i] += part[i];
            sum[acc + i] += part[acc + i];
          }
        }
        store_rows(p.kind, sum.data(), D, s.lk, D, dk, s.k0 * k_rs + kvh * D, k_rs);
        store_rows(p.kind, sum.data() + acc, D, s.lk, D, dv, s.k0 * k_rs + kvh * D, k_rs);
      }
    });
  }
}

// ---- head_dim not a multiple of the vector width --------------------------
// The kernels' products run on whole vectors of kHeadDimMultiple columns. Any
// other head_dim runs on float32 copies zero-padded to the next multiple:
// zero columns of q and k change no score, zero columns of v and dout give
// zero columns of out and of the gradients, which are dropped on the way
// back. The copies are linear in the sequence length; head_dims that are
// multiples of 8 take the kernels directly, as before.

bool needs_padding(const Problem& p) { return p.head_dim % kHeadDimMultiple != 0; }

Problem padded(const Problem& p) {
  Problem r = p;
  r.kind = DType::kFloat32;
  r.head_dim = round_up(p.head_dim, kHeadDimMultiple);
  return r;
}

// rows of D elements (kind) into float32 rows of Dp, zero beyond D.
std::vector<float> pad_rows(DType kind, const void* src, int64_t rows, int64_t D, int64_t Dp) {
  std::vector<float> dst(static_cast<size_t>(rows * Dp));
  float* d = dst.data();
  parallel_for(rows, 256, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      for (int64_t c = 0; c < D; ++c) d[r * Dp + c] = load_float<false>(kind, src, r * D + c);
      std::fill(d + r * Dp + D, d + (r + 1) * Dp, 0.f);
    }
  });
  return dst;
}

// float32 rows of Dp into rows of D (kind).
void unpad_rows(DType kind, const std::vector<float>& src, int64_t rows, int64_t D, int64_t Dp, void* dst) {
  parallel_for(rows, 256, [&](int64_t b, int64_t e) {
    store_rows(kind, src.data() + b * Dp, Dp, e - b, D, dst, b * D, D);
  });
}

// ---- FlashMask document masks ---------------------------------------------
// A mask that only cuts each sequence into documents (every key visible from
// the rows of its own document, from its diagonal on when causal: the mask of
// packed training sequences) runs as variable-length attention over those
// documents, without the mask: the same attention, in tiles that never
// straddle a document end. Tiled with the mask, a 48-row query block or a
// 256-key block across a document end scored both documents' pairs and
// masked them element by element: 8 documents of 512 at S = 4096 cost 1.4x
// (forward) to 1.6x (forward + backward) plain causal's time per visible
// FLOP, documents of 480 (key blocks across every end) 1.6x the same
// documents run as separate sequences. Not with dropout: its bits are drawn
// per sequence and position, which documents run as sequences would change.

// The document boundaries of sequence b (0, ends of the documents ..., seqlen)
// into *bounds when its mask is a document mask alike in every mask head.
bool mask_documents(const Problem& p, int64_t b, std::vector<int32_t>* bounds) {
  bounds->clear();
  if (p.startend == nullptr || p.seqlen_q != p.seqlen_k) return false;
  const int64_t n = p.seqlen_k;
  std::vector<int32_t> cut;
  for (int64_t mh = 0; mh < p.mask_heads; ++mh) {
    cut.assign(1, 0);
    int64_t doc_end = 0;
    for (int64_t j = 0; j < n; ++j) {
      int32_t iv[4];
      hidden_rows(p, p.startend + ((b * p.mask_heads + mh) * n + j) * p.mask_cols, iv);
      // rows [lo, hi) see key j: its rows (from the diagonal when causal) less
      // the two hidden intervals, taken by increasing start
      int64_t lo = p.causal ? j : 0, hi = n;
      const int first = iv[2] < iv[0] ? 2 : 0;
      for (const int x : {first, 2 - first}) {
        const int64_t a = std::max<int64_t>(iv[x], lo), e = std::min<int64_t>(iv[x + 1], hi);
        if (a >= e) continue;                                    // misses [lo, hi)
        if (a == lo && e == hi) return false;                    // a key no row sees
        if (a != lo && e != hi) return false;                    // a hole inside: not a document
        if (a == lo) {
          lo = e;  // hidden just below the visible rows' start
        } else {
          hi = a;  // hidden from a row on to the end
        }
      }
      if (j == cut.back()) doc_end = hi;  // a document's first key: its rows end the document
      if (hi != doc_end || lo != (p.causal ? j : cut.back())) return false;
      if (j + 1 == doc_end) cut.push_back(static_cast<int32_t>(doc_end));
    }
    if (mh == 0) {
      bounds->swap(cut);
    } else if (cut != *bounds) {
      bounds->clear();
      return false;
    }
  }
  return true;
}

template <typename T>
T* at(DType kind, T* base, int64_t elems) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return base == nullptr ? nullptr : reinterpret_cast<T*>(reinterpret_cast<Byte*>(base) + elems * dtype_bytes(kind));
}

// Runs fn(sub, b) for every sequence b of a FlashMask call in which some
// sequence's mask is a document mask: `sub` is that sequence alone, as
// variable-length attention over its documents (no mask) or, for a sequence
// with another mask, as a batch of one with its mask. Returns false, running
// nothing, for any other call.
template <typename Fn>
bool split_documents(const Problem& p, Fn&& fn) {
  if (p.startend == nullptr || p.cu_q != nullptr || p.dropout > 0.f) return false;
  std::vector<std::vector<int32_t>> docs(static_cast<size_t>(p.batch));
  bool any = false;
  for (int64_t b = 0; b < p.batch; ++b) any = mask_documents(p, b, &docs[b]) || any;
  if (!any) return false;
  for (int64_t b = 0; b < p.batch; ++b) {
    Problem s = p;
    s.batch = 1;
    s.total_q = p.seqlen_q;
    s.total_k = p.seqlen_k;
    if (!docs[b].empty()) {
      const std::vector<int32_t>& d = docs[b];
      s.batch = static_cast<int64_t>(d.size()) - 1;
      s.cu_q = s.cu_k = d.data();
      int64_t longest = 0;
      for (size_t i = 0; i + 1 < d.size(); ++i) longest = std::max<int64_t>(longest, d[i + 1] - d[i]);
      s.seqlen_q = s.seqlen_k = longest;
      s.startend = nullptr;
      s.mask_heads = s.mask_cols = 0;
      s.lse_token_mult = 1;  // lse[h * Sq + token]: the sequence's [Hq, Sq] slice
    } else {
      s.startend = p.startend + b * p.mask_heads * p.seqlen_k * p.mask_cols;
    }
    fn(s, b);
  }
  return true;
}

}  // namespace

void forward_cpu(const Problem& p, const void* q, const void* k, const void* v, void* out, float* lse) {
  const int64_t qe = p.seqlen_q * p.heads_q * p.head_dim, ke = p.seqlen_k * p.heads_k * p.head_dim;
  if (split_documents(p, [&](const Problem& s, int64_t b) {
        forward_cpu(s, at(p.kind, q, b * qe), at(p.kind, k, b * ke), at(p.kind, v, b * ke), at(p.kind, out, b * qe),
                    lse + b * p.heads_q * p.seqlen_q);
      }))
    return;
  if (!needs_padding(p)) return forward_aligned(p, q, k, v, out, lse);
  const Problem pp = padded(p);
  const int64_t D = p.head_dim, Dp = pp.head_dim, rq = p.total_q * p.heads_q, rk = p.total_k * p.heads_k;
  const std::vector<float> q32 = pad_rows(p.kind, q, rq, D, Dp), k32 = pad_rows(p.kind, k, rk, D, Dp);
  const std::vector<float> v32 = pad_rows(p.kind, v, rk, D, Dp);
  std::vector<float> o32(static_cast<size_t>(rq * Dp));
  forward_aligned(pp, q32.data(), k32.data(), v32.data(), o32.data(), lse);
  unpad_rows(p.kind, o32, rq, D, Dp, out);
}

void softmax_cpu(const Problem& p, const void* q, const void* k, const float* lse, void* softmax) {
  if (!needs_padding(p)) return softmax_aligned(p, q, k, lse, softmax);
  const Problem pp = padded(p);
  const int64_t D = p.head_dim, Dp = pp.head_dim;
  const std::vector<float> q32 = pad_rows(p.kind, q, p.total_q * p.heads_q, D, Dp);
  const std::vector<float> k32 = pad_rows(p.kind, k, p.total_k * p.heads_k, D, Dp);
  if (p.kind == DType::kFloat32) return softmax_aligned(pp, q32.data(), k32.data(), lse, softmax);
  // float16 / bfloat16: the probabilities in float32, then converted.
  const int64_t elems = p.batch * p.heads_q * p.seqlen_q * p.seqlen_k;
  std::vector<float> sm32(static_cast<size_t>(elems));
  softmax_aligned(pp, q32.data(), k32.data(), lse, sm32.data());
  unpad_rows(p.kind, sm32, elems, 1, 1, softmax);
}

void backward_cpu(const Problem& p, const void* q, const void* k, const void* v, const void* out,
                  const void* dout, const float* lse, void* dq, void* dk, void* dv) {
  const int64_t qe = p.seqlen_q * p.heads_q * p.head_dim, ke = p.seqlen_k * p.heads_k * p.head_dim;
  if (split_documents(p, [&](const Problem& s, int64_t b) {
        backward_cpu(s, at(p.kind, q, b * qe), at(p.kind, k, b * ke), at(p.kind, v, b * ke), at(p.kind, out, b * qe),
                     at(p.kind, dout, b * qe), lse + b * p.heads_q * p.seqlen_q, at(p.kind, dq, b * qe),
                     at(p.kind, dk, b * ke), at(p.kind, dv, b * ke));
      }))
    return;
  if (!needs_padding(p)) return backward_aligned(p, q, k, v, out, dout, lse, dq, dk, dv);
  const Problem pp = padded(p);
  const int64_t D = p.head_dim, Dp = pp.head_dim, rq = p.total_q * p.heads_q, rk = p.total_k * p.heads_k;
  const std::vector<float> q32 = pad_rows(p.kind, q, rq, D, Dp), k32 = pad_rows(p.kind, k, rk, D, Dp);
  const std::vector<float> v32 = pad_rows(p.kind, v, rk, D, Dp), o32 = pad_rows(p.kind, out, rq, D, Dp);
  const std::vector<float> do32 = pad_rows(p.kind, dout, rq, D, Dp);
  std::vector<float> dq32(static_cast<size_t>(rq * Dp)), dk32(static_cast<size_t>(rk * Dp));
  std::vector<float> dv32(static_cast<size_t>(rk * Dp));
  backward_aligned(pp, q32.data(), k32.data(), v32.data(), o32.data(), do32.data(), lse, dq32.data(), dk32.data(),
                   dv32.data());
  unpad_rows(p.kind, dq32, rq, D, Dp, dq);
  unpad_rows(p.kind, dk32, rk, D, Dp, dk);
  unpad_rows(p.kind, dv32, rk, D, Dp, dv);
}

}  // namespace paddle_ext::flash_attn

// For tests and benchmarks (ctypes): the code path the CPU kernels take now.
extern "C" const char* paddle_ext_flash_attn_cpu_isa() { return paddle_ext::flash_attn::cpu_isa(); }

// For tests (ctypes): the document boundaries the CPU kernels run a FlashMask
// sequence's mask as (startend: int32 [mask_heads, seqlen, cols] of one
// sequence), into bounds (room for seqlen + 1): the number of documents, or
// -1 when the mask is not a document mask (the kernels then tile with it).
extern "C" int64_t paddle_ext_flashmask_documents(const int32_t* startend, int64_t mask_heads, int64_t seqlen,
                                                  int64_t cols, int causal, int32_t* bounds) {
  paddle_ext::flash_attn::Problem p;
  p.batch = 1;
  p.seqlen_q = p.seqlen_k = seqlen;
  p.causal = causal != 0;
  p.startend = startend;
  p.mask_heads = mask_heads;
  p.mask_cols = cols;
  std::vector<int32_t> d;
  if (!paddle_ext::flash_attn::mask_documents(p, 0, &d)) return -1;
  std::copy(d.begin(), d.end(), bounds);
  return static_cast<int64_t>(d.size()) - 1;
}
