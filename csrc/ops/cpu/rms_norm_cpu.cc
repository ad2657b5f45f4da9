// CPU backend of RMS normalisation (see rms_norm.h for the semantics). One
// pass over the data: the threads split the rows; each row is read once into
// its sum of squares (backward: also its dot product with dy * weight), which
// the following loop over the same row, still in cache, turns into the
// outputs. The weight is converted to float once per call. The column sums of
// the weight gradient go into one double row per fixed part of the rows, added
// in part order at the end, so no result depends on the number of threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/memory.h"
#include "common/parallel.h"
#include "rms_norm.h"

namespace paddle_ext::rms_norm {
namespace {

constexpr int64_t kLanes = 16;
constexpr int64_t kSumBlock = 256;
// Parts of the rows that get their own weight-gradient row, and the most
// doubles all of those rows may take.
constexpr int64_t kMaxParts = 64;
constexpr int64_t kMaxPartDoubles = int64_t{4} << 20;

// sum of term(j) for j in [0, n): float32 lanes within blocks of kSumBlock,
// the blocks added in double (n up to millions stays accurate to ~1e-7).
template <class Term>
inline double blocked_sum(int64_t n, const Term& term) {
  double total = 0.0;
  for (int64_t b = 0; b < n; b += kSumBlock) {
    const int64_t e = std::min(n, b + kSumBlock);
    float lane[kLanes] = {};
    int64_t j = b;
    for (; j + kLanes <= e; j += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) lane[l] += term(j + l);
    }
    double block = 0.0;
    for (; j < e; ++j) block += term(j);
    for (int64_t l = 0; l < kLanes; ++l) block += lane[l];
    total += block;
  }
  return total;
}

template <class X>
inline float row_inv_var(const typename X::Storage* xr, int64_t n, float epsilon) {
  const double squares = blocked_sum(n, [xr](int64_t j) {
    const float v = X::load(xr[j]);
    return v * v;
  });
  return static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(n) + static_cast<double>(epsilon)));
}

template <class W>
std::vector<float> weight_as_float(const Problem& p) {
  const auto* w = static_cast<const typename W::Storage*>(p.weight);
  std::vector<float> out(static_cast<size_t>(p.cols));
  for (int64_t j = 0; j < p.cols; ++j) out[j] = W::load(w[j]);
  return out;
}

int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, cols)); }

template <class X, class W>
void forward_typed(const Problem& p, void* y, float* inv_var) {
  const std::vector<float> weight = weight_as_float<W>(p);
  const float* wf = weight.data();
  const auto* x = static_cast<const typename X::Storage*>(p.x);
  auto* out = static_cast<typename W::Storage*>(y);
  const int64_t n = p.cols;
  parallel_for(p.rows, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const typename X::Storage* xr = x + r * n;
      typename W::Storage* yr = out + r * n;
      const float inv = row_inv_var<X>(xr, n, p.epsilon);
      inv_var[r] = inv;
      for (int64_t j = 0; j < n; ++j) yr[j] = W::store(wf[j] * inv * X::load(xr[j]));
    }
  });
}

template <class X, class W>
void backward_typed(const Problem& p, const void* dy, const float* inv_var, void* dx, void* dweight) {
  const std::vector<float> weight = weight_as_float<W>(p);
  const float* wf = weight.data();
  const auto* x = static_cast<const typename X::Storage*>(p.x);
  const auto* g = static_cast<const typename W::Storage*>(dy);
  auto* gx = static_cast<typename X::Storage*>(dx);
  const int64_t n = p.cols;
  const double inv_n = 1.0 / static_cast<double>(n);

  // Fixed parts of the rows (independent of the thread count).
  int64_t parts = std::min<int64_t>(kMaxParts, std::max<int64_t>(1, p.rows / row_grain(n)));
  if (dweight != nullptr) parts = std::max<int64_t>(1, std::min(parts, kMaxPartDoubles / n));
  parts = std::min(parts, std::max<int64_t>(1, p.rows));
  const int64_t rows_per_part = (p.rows + parts - 1) / parts;
  std::vector<double> partial(dweight != nullptr ? static_cast<size_t>(parts * n) : 0, 0.0);

  parallel_for(parts, 1, [&](int64_t part_begin, int64_t part_end) {
    for (int64_t part = part_begin; part < part_end; ++part) {
      double* dw = dweight != nullptr ? partial.data() + part * n : nullptr;
      const int64_t r_end = std::min(p.rows, (part + 1) * rows_per_part);
      for (int64_t r = part * rows_per_part; r < r_end; ++r) {
        const typename X::Storage* xr = x + r * n;
        const typename W::Storage* gr = g + r * n;
        typename X::Storage* gxr = gx + r * n;
        const float inv = inv_var != nullptr ? inv_var[r] : row_inv_var<X>(xr, n, p.epsilon);
        const double dot = blocked_sum(n, [xr, gr, wf](int64_t j) { return W::load(gr[j]) * wf[j] * X::load(xr[j]); });
        const double inv_d = inv;
        const float c = static_cast<float>(inv_d * inv_d * inv_d * dot * inv_n);
        if (dw != nullptr) {
          for (int64_t j = 0; j < n; ++j) {
            const float gv = W::load(gr[j]);
            const float xv = X::load(xr[j]);
            gxr[j] = X::store(inv * wf[j] * gv - c * xv);
            dw[j] += static_cast<double>(gv * xv * inv);
          }
        } else {
          for (int64_t j = 0; j < n; ++j) {
            gxr[j] = X::store(inv * wf[j] * W::load(gr[j]) - c * X::load(xr[j]));
          }
        }
      }
    }
  });

  if (dweight != nullptr) {
    auto* out = static_cast<typename W::Storage*>(dweight);
    parallel_for(n, std::max<int64_t>(1, 16384 / parts), [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        double sum = 0.0;
        for (int64_t part = 0; part < parts; ++part) sum += partial[part * n + j];
        out[j] = W::store(static_cast<float>(sum));
      }
    });
  }
}

// fn(X{}, W{}) for the DTypeIo of x and of weight (float64 is not taken).
template <class Fn>
void dispatch(const Problem& p, const Fn& fn) {
  with_dtype<false>(p.x_kind, [&](auto x_io) {
    with_dtype<false>(p.weight_kind, [&](auto w_io) { fn(x_io, w_io); });
  });
}

size_t bytes_of(DType kind, int64_t n) { return static_cast<size_t>(n * dtype_bytes(kind)); }

}  // namespace

void forward_cpu(const Problem& p, void* y, float* inv_var) {
  if (p.rows <= 0 || p.cols <= 0) return;
  advise_huge_pages(y, bytes_of(p.weight_kind, p.rows * p.cols));
  dispatch(p, [&](auto x_io, auto w_io) { forward_typed<decltype(x_io), decltype(w_io)>(p, y, inv_var); });
}

void backward_cpu(const Problem& p, const void* dy, const float* inv_var, void* dx, void* dweight) {
  if (p.cols <= 0) return;
  if (p.rows <= 0) {  // no rows: the weight gradient is an empty sum
    if (dweight != nullptr) std::memset(dweight, 0, bytes_of(p.weight_kind, p.cols));
    return;
  }
  advise_huge_pages(dx, bytes_of(p.x_kind, p.rows * p.cols));
  dispatch(p, [&](auto x_io, auto w_io) {
    backward_typed<decltype(x_io), decltype(w_io)>(p, dy, inv_var, dx, dweight);
  });
}

}  // namespace paddle_ext::rms_norm
