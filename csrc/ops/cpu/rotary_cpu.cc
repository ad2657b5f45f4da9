// CPU backend of the fused rotary position embedding (see rotary.h for the
// semantics). One pass over the data: the threads split the tokens (b, s)
// into contiguous ranges; for each token the coefficient rows (cos, and sin
// with the pair's sign folded in) are built once and every head is rotated
// from them. The inner loops are branch-free over head_dim so the
// compiler vectorises them; on x86-64 they are also built for AVX2+FMA and
// AVX-512 and picked at run time (PADDLE_EXT_ROTARY_ISA=default|avx2|avx512
// forces one, for tests and benchmarks).
//
// Without sin/cos tables the angles p * base^(-2j/head_dim) are evaluated in
// double once per (seq, head_dim, base) and kept in a small cache, so repeated
// calls (every layer of every step) pay nothing for them.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "common/memory.h"
#include "common/parallel.h"
#include "rotary.h"

namespace paddle_ext::rotary {
namespace {

// ------------------------------------------------------------ computed angles

// cos / sin of p * base^(-2j/head_dim) for p < rows, j < head_dim / 2.
struct AngleTable {
  int64_t rows = 0;
  int64_t head_dim = 0;
  double base = 0;
  std::vector<double> cos, sin;  // [rows, head_dim / 2]
};

std::shared_ptr<const AngleTable> build_angles(int64_t rows, int64_t head_dim, double base) {
  auto table = std::make_shared<AngleTable>();
  table->rows = rows;
  table->head_dim = head_dim;
  table->base = base;
  const int64_t half = head_dim / 2;
  table->cos.resize(static_cast<size_t>(rows * half));
  table->sin.resize(static_cast<size_t>(rows * half));
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t j = 0; j < half; ++j) {
    inv_freq[j] = 1.0 / std::pow(base, static_cast<double>(2 * j) / static_cast<double>(head_dim));
  }
  AngleTable* t = table.get();
  parallel_for(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(half, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t j = 0; j < half; ++j) {
        const double angle = static_cast<double>(r) * inv_freq[j];
        t->cos[r * half + j] = std::cos(angle);
        t->sin[r * half + j] = std::sin(angle);
      }
    }
  });
  return table;
}

// The last few tables, most recent first: a model uses one or two shapes.
std::shared_ptr<const AngleTable> cached_angles(int64_t rows, int64_t head_dim, double base) {
  static std::mutex mutex;
  static std::list<std::shared_ptr<const AngleTable>> cache;
  constexpr size_t kKeep = 4;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto it = cache.begin(); it != cache.end(); ++it) {
      const AngleTable& t = **it;
      if (t.rows == rows && t.head_dim == head_dim && t.base == base) {
        auto hit = *it;
        cache.erase(it);
        cache.push_front(hit);
        return hit;
      }
    }
  }
  auto table = build_angles(rows, head_dim, base);  // outside the lock: it is threaded
  std::lock_guard<std::mutex> lock(mutex);
  cache.push_front(table);
  while (cache.size() > kKeep) cache.pop_back();
  return table;
}

// ------------------------------------------------------------------- kernels

int64_t partner(int64_t i, int64_t head_dim, bool adjacent) {
  if (adjacent) return i ^ 1;
  const int64_t half = head_dim / 2;
  return i < half ? i + half : i - half;
}

// -1 for the first element of a pair, +1 for the second.
int sigma(int64_t i, int64_t head_dim, bool adjacent) {
  return (adjacent ? (i & 1) == 0 : i < head_dim / 2) ? -1 : 1;
}

// c[i] and ss[i] such that out[i] = x[i] * c[i] + x[partner(i)] * ss[i].
template <class Io>
void token_coefficients(const Problem& p, int64_t pos, bool backward, const AngleTable* angles,
                        Compute<Io::kDType>* c, Compute<Io::kDType>* s, Compute<Io::kDType>* ss) {
  using C = Compute<Io::kDType>;
  using S = typename Io::Storage;
  const int64_t d = p.head_dim;
  if (angles != nullptr) {
    const int64_t half = d / 2;
    const double* crow = angles->cos.data() + pos * half;
    const double* srow = angles->sin.data() + pos * half;
    for (int64_t i = 0; i < d; ++i) {
      c[i] = static_cast<C>(crow[i / 2]);
      s[i] = static_cast<C>(srow[i / 2]);
    }
  } else {
    const S* crow = static_cast<const S*>(p.cos) + pos * d;
    const S* srow = static_cast<const S*>(p.sin) + pos * d;
    for (int64_t i = 0; i < d; ++i) {
      c[i] = Io::load(crow[i]);
      s[i] = Io::load(srow[i]);
    }
  }
  for (int64_t i = 0; i < d; ++i) {
    const int sg = sigma(i, d, p.adjacent_pairs);
    ss[i] = backward ? static_cast<C>(-sg) * s[partner(i, d, p.adjacent_pairs)] : static_cast<C>(sg) * s[i];
  }
}

// Rotates `rows` consecutive rows of head_dim elements.
template <class Io, bool kAdjacent>
__attribute__((always_inline)) inline void rotate_rows(const typename Io::Storage* __restrict__ x,
                                                       typename Io::Storage* __restrict__ y, int64_t rows,
                                                       int64_t d, const Compute<Io::kDType>* __restrict__ c,
                                                       const Compute<Io::kDType>* __restrict__ ss) {
  using C = Compute<Io::kDType>;
  const int64_t half = d / 2;
  for (int64_t r = 0; r < rows; ++r, x += d, y += d) {
    if (kAdjacent) {
      for (int64_t j = 0; j < d; j += 2) {
        const C x0 = Io::load(x[j]);
        const C x1 = Io::load(x[j + 1]);
        y[j] = Io::store(static_cast<typename Io::Value>(x0 * c[j] + x1 * ss[j]));
        y[j + 1] = Io::store(static_cast<typename Io::Value>(x1 * c[j + 1] + x0 * ss[j + 1]));
      }
    } else {
      for (int64_t j = 0; j < half; ++j) {
        const C x0 = Io::load(x[j]);
        const C x1 = Io::load(x[j + half]);
        y[j] = Io::store(static_cast<typename Io::Value>(x0 * c[j] + x1 * ss[j]));
        y[j + half] = Io::store(static_cast<typename Io::Value>(x1 * c[j + half] + x0 * ss[j + half]));
      }
    }
  }
}

// Tokens [begin, end), in the memory order of the tensor.
template <class Io, bool kAdjacent>
__attribute__((always_inline)) inline void process_tokens(const Problem& p, bool backward,
                                                          const AngleTable* angles, int64_t begin,
                                                          int64_t end) {
  using C = Compute<Io::kDType>;
  using S = typename Io::Storage;
  const int64_t d = p.head_dim;
  std::vector<C> buffer(static_cast<size_t>(3 * d));
  C* c = buffer.data();
  C* s = c + d;
  C* ss = s + d;
  int64_t last_pos = -1;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t b = p.time_major ? t % p.batch : t / p.seq;
    const int64_t q = p.time_major ? t / p.batch : t % p.seq;
    const int64_t pos = p.position_ids != nullptr ? p.position_ids[b * p.seq + q] : q;
    if (pos != last_pos) {  // time-major without position ids: a run of equal positions
      token_coefficients<Io>(p, pos, backward, angles, c, s, ss);
      last_pos = pos;
    }
    const int64_t row = t * p.heads * d;
    rotate_rows<Io, kAdjacent>(static_cast<const S*>(p.in) + row, static_cast<S*>(p.out) + row, p.heads, d, c,
                               ss);
  }
}

using RangeFn = void (*)(const Problem&, bool, const AngleTable*, int64_t, int64_t);

template <class Io, bool kAdjacent>
void range_default(const Problem& p, bool backward, const AngleTable* angles, int64_t begin, int64_t end) {
  process_tokens<Io, kAdjacent>(p, backward, angles, begin, end);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define PADDLE_EXT_ROTARY_X86 1
template <class Io, bool kAdjacent>
__attribute__((target("avx2,fma"))) void range_avx2(const Problem& p, bool backward, const AngleTable* angles,
                                                    int64_t begin, int64_t end) {
  process_tokens<Io, kAdjacent>(p, backward, angles, begin, end);
}

template <class Io, bool kAdjacent>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"))) void range_avx512(
    const Problem& p, bool backward, const AngleTable* angles, int64_t begin, int64_t end) {
  process_tokens<Io, kAdjacent>(p, backward, angles, begin, end);
}
#endif

enum class Isa { kDefault, kAvx2, kAvx512 };

Isa pick_isa() {
#if defined(PADDLE_EXT_ROTARY_X86)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  // Read on every call (it is cheap next to the work) so tests can switch it.
  if (const char* forced = std::getenv("PADDLE_EXT_ROTARY_ISA")) {
    if (std::strcmp(forced, "default") == 0) return Isa::kDefault;
    if (std::strcmp(forced, "avx2") == 0 && avx2) return Isa::kAvx2;
    if (std::strcmp(forced, "avx512") == 0 && avx512) return Isa::kAvx512;
  }
  if (avx512) return Isa::kAvx512;
  if (avx2) return Isa::kAvx2;
#endif
  return Isa::kDefault;
}

template <class Io, bool kAdjacent>
RangeFn range_fn(Isa isa) {
#if defined(PADDLE_EXT_ROTARY_X86)
  if (isa == Isa::kAvx512) return &range_avx512<Io, kAdjacent>;
  if (isa == Isa::kAvx2) return &range_avx2<Io, kAdjacent>;
#else
  (void)isa;
#endif
  return &range_default<Io, kAdjacent>;
}

template <class Io>
RangeFn range_fn(Isa isa, bool adjacent) {
  return adjacent ? range_fn<Io, true>(isa) : range_fn<Io, false>(isa);
}

void run(const Problem& p, bool backward) {
  const int64_t tokens = p.batch * p.seq;
  if (tokens <= 0 || p.heads <= 0 || p.head_dim <= 0) return;
  std::shared_ptr<const AngleTable> angles;
  if (p.sin == nullptr || p.cos == nullptr) angles = cached_angles(p.seq, p.head_dim, p.base);

  const Isa isa = pick_isa();
  const RangeFn fn =
      with_dtype(p.dtype, [&](auto io) { return range_fn<decltype(io)>(isa, p.adjacent_pairs); });

  const int64_t per_token = p.heads * p.head_dim;
  advise_huge_pages(p.out, static_cast<std::size_t>(tokens * per_token * dtype_bytes(p.dtype)));
  // At least ~32k elements per task: smaller problems stay on one thread.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(per_token, 1));
  const AngleTable* table = angles.get();
  parallel_for(tokens, grain, [&](int64_t begin, int64_t end) { fn(p, backward, table, begin, end); });
}

}  // namespace

void forward_cpu(const Problem& p) { run(p, false); }

void backward_cpu(const Problem& p) { run(p, true); }

BadPosition find_bad_position_cpu(const int64_t* ids, int64_t n, int64_t rows) {
  bool bad = false;  // branch-free scan first: the common case is all in range
  for (int64_t i = 0; i < n; ++i) bad |= (ids[i] < 0) | (ids[i] >= rows);
  if (!bad) return {};
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= rows) return {i, ids[i]};
  }
  return {};
}

}  // namespace paddle_ext::rotary
