// CPU backend of c_embedding: threaded row copies forward; backward zeroes and
// fills the table gradient in a single pass, each thread owning a row range.
// A row hit once is summed too (+0 + g, not copied), so a -0 gradient becomes
// +0 as in Paddle's scatter-add on zeroed memory.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "c_embedding.h"
#include "common/float_io.h"
#include "common/memory.h"
#include "common/parallel.h"

namespace paddle_ext::c_embedding {
namespace {

constexpr int64_t kRowsPerTask = 64;

}  // namespace

template <typename IdT>
BadId find_out_of_range_cpu(const IdT* ids, int64_t n, int64_t vocab_size) {
  // Paddle's GPU kernel: `id >= 0 && (vocab_size < 0 || id < vocab_size)`: a negative
  // vocab_size lifts only the upper bound; 0 refuses every id.
  const int64_t limit = id_limit(vocab_size);
  // Branch-free scan first (the common case is all in range), then locate.
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    bad |= (id < 0) | (id >= limit);
  }
  if (!bad) return {};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    if (id < 0 || id >= limit) return {i, id};
  }
  return {};
}

template <typename IdT>
void forward_cpu(const char* table, int64_t rows, int64_t row_bytes, const IdT* ids, int64_t n,
                 int64_t start, char* out) {
  advise_huge_pages(out, static_cast<std::size_t>(n * row_bytes));
  parallel_for(n, kRowsPerTask, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = static_cast<int64_t>(ids[i]) - start;
      char* dst = out + i * row_bytes;
      if (row >= 0 && row < rows) {
        std::memcpy(dst, table + row * row_bytes, row_bytes);
      } else {
        std::memset(dst, 0, row_bytes);
      }
    }
  });
}

namespace {

// Sums the out_grad rows at positions [first, last) (all of one table row) into
// `dst`, from +0 in that order: Paddle's `table_grad[row] += out_grad[i]` on
// zeroed memory. float16 / bfloat16 are summed in float32 and rounded once.
template <typename It>
void sum_rows(DType kind, const void* out_grad, It first, It last, int64_t width, void* dst,
              std::vector<float>& acc32, std::vector<double>& acc64) {
  if (kind == DType::kFloat64) {
    std::fill(acc64.begin(), acc64.end(), 0.0);
    for (It g = first; g != last; ++g) {
      const double* src = static_cast<const double*>(out_grad) + *g * width;
      for (int64_t j = 0; j < width; ++j) acc64[j] += src[j];
    }
    std::memcpy(dst, acc64.data(), static_cast<std::size_t>(width) * sizeof(double));
    return;
  }
  std::fill(acc32.begin(), acc32.end(), 0.f);
  for (It g = first; g != last; ++g) {
    const int64_t base = *g * width;
    if (kind == DType::kFloat32) {  // the common case, kept vectorisable
      const float* src = static_cast<const float*>(out_grad) + base;
      for (int64_t j = 0; j < width; ++j) acc32[j] += src[j];
    } else {
      for (int64_t j = 0; j < width; ++j) acc32[j] += load_float(kind, out_grad, base + j);
    }
  }
  if (kind == DType::kFloat32) {
    std::memcpy(dst, acc32.data(), static_cast<std::size_t>(width) * sizeof(float));
  } else {
    for (int64_t j = 0; j < width; ++j) store_float(kind, dst, j, acc32[j]);
  }
}

}  // namespace

template <typename IdT>
void backward_cpu(DType kind, const void* out_grad, const IdT* ids, int64_t n, int64_t rows,
                  int64_t width, int64_t start, void* table_grad) {
  // Positions of in-range ids, stably sorted by row: each row's contributions
  // then sit together in their original order.
  std::vector<int64_t> order;
  order.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = static_cast<int64_t>(ids[i]) - start;
    if (row >= 0 && row < rows) order.push_back(i);
  }
  auto row_of = [&](int64_t pos) { return static_cast<int64_t>(ids[pos]) - start; };
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return row_of(a) < row_of(b); });

  const int64_t row_bytes = width * dtype_bytes(kind);
  char* grad = static_cast<char*>(table_grad);
  advise_huge_pages(grad, static_cast<std::size_t>(rows * row_bytes));
  parallel_for(rows, 1024, [&](int64_t row_begin, int64_t row_end) {
    std::memset(grad + row_begin * row_bytes, 0, (row_end - row_begin) * row_bytes);
    auto first = std::lower_bound(order.begin(), order.end(), row_begin,
                                  [&](int64_t pos, int64_t r) { return row_of(pos) < r; });
    std::vector<float> acc32(kind == DType::kFloat64 ? 0 : width);
    std::vector<double> acc64(kind == DType::kFloat64 ? width : 0);
    for (auto it = first; it != order.end() && row_of(*it) < row_end;) {
      const int64_t row = row_of(*it);
      auto group_end = it;
      while (group_end != order.end() && row_of(*group_end) == row) ++group_end;
      sum_rows(kind, out_grad, it, group_end, width, grad + row * row_bytes, acc32, acc64);
      it = group_end;
    }
  });
}

#define PADDLE_EXT_INSTANTIATE(IdT)                                                              \
  template BadId find_out_of_range_cpu<IdT>(const IdT*, int64_t, int64_t);                      \
  template void forward_cpu<IdT>(const char*, int64_t, int64_t, const IdT*, int64_t, int64_t,    \
                                 char*);                                                         \
  template void backward_cpu<IdT>(DType, const void*, const IdT*, int64_t, int64_t, int64_t,    \
                                  int64_t, void*);
PADDLE_EXT_INSTANTIATE(int32_t)
PADDLE_EXT_INSTANTIATE(int64_t)
#undef PADDLE_EXT_INSTANTIATE

}  // namespace paddle_ext::c_embedding
