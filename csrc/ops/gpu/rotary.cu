// GPU backend of the fused rotary position embedding (declared in rotary.h):
// one source for CUDA (nvcc) and HIP (hipcc -x hip). Built with
// -DPADDLE_EXT_WITH_GPU -I csrc/ops; no Paddle header, so it also compiles
// standalone in the ci/ legs.
//
// One thread block per token (b, s), grid-stride over the tokens: the block
// first builds the token's coefficient rows in shared memory (cos, and sin with
// the pair's sign folded in: the transposed form for the backward pass), from
// the tables or, without them, from the angles p * base^(-2*(i/2)/head_dim)
// in double; then each thread rotates pairs (i, partner(i)) of the token's
// heads. The arithmetic is the CPU backend's: double for float32 and float64,
// float for float16 / bfloat16, with the same bit-level conversions
// (common/half.h), so float32 results are the correctly rounded values on both.
//
// The position-id check copies its answer back to the host, so it
// synchronises the stream (the op raises on a bad id); it runs once per call of
// the Python API, not per tensor.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "common/gpu_runtime.h"
#include "rotary.h"

namespace paddle_ext::rotary {
namespace {

using gpu::Stream;

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride beyond that
constexpr size_t kMaxSharedBytes = 48 * 1024;     // without opting in to more, on every device
constexpr unsigned long long kNoIndex = ULLONG_MAX;

Stream as_stream(void* stream) { return static_cast<Stream>(stream); }

void check_launch() { PADDLE_EXT_GPU_CHECK(gpu::get_last_error()); }

__device__ __forceinline__ int64_t partner(int64_t i, int64_t d, bool adjacent) {
  return adjacent ? (i ^ 1) : (i < d / 2 ? i + d / 2 : i - d / 2);
}

// -1 for the first element of a pair, +1 for the second.
__device__ __forceinline__ int sigma(int64_t i, int64_t d, bool adjacent) {
  return (adjacent ? (i & 1) == 0 : i < d / 2) ? -1 : 1;
}

template <class Io, bool kAdjacent>
__global__ void __launch_bounds__(kThreads) rotary_kernel(Problem p, bool backward) {
  using C = Compute<Io::kDType>;
  using S = typename Io::Storage;
  extern __shared__ double shared[];  // double-aligned, holds 3 * head_dim of C
  const int64_t d = p.head_dim;
  const int64_t half = d / 2;
  C* c = reinterpret_cast<C*>(shared);
  C* s = c + d;
  C* ss = s + d;
  const int64_t tokens = p.batch * p.seq;
  const int64_t pairs = p.heads * half;
  const S* in = static_cast<const S*>(p.in);
  S* out = static_cast<S*>(p.out);
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const int64_t b = p.time_major ? t % p.batch : t / p.seq;
    const int64_t q = p.time_major ? t / p.batch : t % p.seq;
    const int64_t pos = p.position_ids != nullptr ? p.position_ids[b * p.seq + q] : q;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      if (p.sin != nullptr) {
        c[i] = Io::load(static_cast<const S*>(p.cos)[pos * d + i]);
        s[i] = Io::load(static_cast<const S*>(p.sin)[pos * d + i]);
      } else {
        const double inv_freq = 1.0 / pow(p.base, static_cast<double>(2 * (i / 2)) / static_cast<double>(d));
        double sn, cs;
        sincos(static_cast<double>(pos) * inv_freq, &sn, &cs);
        c[i] = static_cast<C>(cs);
        s[i] = static_cast<C>(sn);
      }
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const C sg = static_cast<C>(sigma(i, d, kAdjacent));
      ss[i] = backward ? -sg * s[partner(i, d, kAdjacent)] : sg * s[i];
    }
    __syncthreads();
    const S* x = in + t * p.heads * d;
    S* y = out + t * p.heads * d;
    for (int64_t e = threadIdx.x; e < pairs; e += blockDim.x) {
      const int64_t h = e / half;
      const int64_t j = e - h * half;
      const int64_t i0 = h * d + (kAdjacent ? 2 * j : j);
      const int64_t i1 = i0 + (kAdjacent ? 1 : half);
      const int64_t k0 = i0 - h * d;
      const int64_t k1 = i1 - h * d;
      const C x0 = Io::load(x[i0]);
      const C x1 = Io::load(x[i1]);
      y[i0] = Io::store(static_cast<typename Io::Value>(x0 * c[k0] + x1 * ss[k0]));
      y[i1] = Io::store(static_cast<typename Io::Value>(x1 * c[k1] + x0 * ss[k1]));
    }
    __syncthreads();  // the next token rewrites the rows
  }
}

template <class Io>
void launch(const Problem& p, bool backward, Stream stream) {
  const int64_t tokens = p.batch * p.seq;
  const size_t shared_bytes = 3 * static_cast<size_t>(p.head_dim) * sizeof(Compute<Io::kDType>);
  if (shared_bytes > kMaxSharedBytes) {
    throw std::invalid_argument("paddle_ext.rotary (GPU): head_dim " + std::to_string(p.head_dim) +
                                " needs " + std::to_string(shared_bytes) + " bytes of shared memory, more than " +
                                std::to_string(kMaxSharedBytes));
  }
  const int64_t blocks = std::min(tokens, kMaxBlocks);
  if (p.adjacent_pairs) {
    rotary_kernel<Io, true><<<blocks, kThreads, shared_bytes, stream>>>(p, backward);
  } else {
    rotary_kernel<Io, false><<<blocks, kThreads, shared_bytes, stream>>>(p, backward);
  }
  check_launch();
}

void run(const Problem& p, bool backward, void* stream) {
  if (p.batch * p.seq <= 0 || p.heads <= 0 || p.head_dim <= 0) return;
  const Stream s = as_stream(stream);
  with_dtype(p.dtype, [&](auto io) { launch<decltype(io)>(p, backward, s); });
}

// ------------------------------------------------------------ position check

__global__ void __launch_bounds__(kThreads)
    find_bad_position_kernel(const int64_t* ids, int64_t n, int64_t rows, unsigned long long* first) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (ids[i] < 0 || ids[i] >= rows) {
      atomicMin(first, static_cast<unsigned long long>(i));
      return;  // this thread's later indices are larger
    }
  }
}

__global__ void fetch_bad_position_kernel(const int64_t* ids, unsigned long long* result) {
  if (result[0] != kNoIndex) result[1] = static_cast<unsigned long long>(ids[result[0]]);
}

}  // namespace

void forward_gpu(const Problem& p, void* stream) { run(p, false, stream); }

void backward_gpu(const Problem& p, void* stream) { run(p, true, stream); }

BadPosition find_bad_position_gpu(const int64_t* ids, int64_t n, int64_t rows, void* stream) {
  if (n <= 0) return {};
  const Stream s = as_stream(stream);
  void* scratch = nullptr;
  PADDLE_EXT_GPU_CHECK(gpu::malloc_device(&scratch, 2 * sizeof(unsigned long long)));
  unsigned long long host[2] = {kNoIndex, 0};
  try {
    auto* result = static_cast<unsigned long long*>(scratch);
    PADDLE_EXT_GPU_CHECK(gpu::memset_async(result, 0xff, 2 * sizeof(unsigned long long), s));
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
    find_bad_position_kernel<<<blocks, kThreads, 0, s>>>(ids, n, rows, result);
    check_launch();
    fetch_bad_position_kernel<<<1, 1, 0, s>>>(ids, result);
    check_launch();
    PADDLE_EXT_GPU_CHECK(gpu::memcpy_to_host_async(host, result, sizeof host, s));
    PADDLE_EXT_GPU_CHECK(gpu::stream_synchronize(s));
  } catch (...) {
    (void)gpu::free_device(scratch);
    throw;
  }
  PADDLE_EXT_GPU_CHECK(gpu::free_device(scratch));
  if (host[0] == kNoIndex) return {};
  return {static_cast<int64_t>(host[0]), static_cast<int64_t>(host[1])};
}

}  // namespace paddle_ext::rotary
