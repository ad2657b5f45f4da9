// GPU backend of c_embedding (declared in c_embedding.h): one source for CUDA
// (nvcc) and HIP (hipcc -x hip). Built with -DPADDLE_EXT_WITH_GPU -I csrc/ops;
// no Paddle header, so it also compiles standalone in the ci/ legs.
//
// Forward: one thread per (id, vector of bytes) of the output; a row copy or
// zeros, with the widest load/store (16, 8, 4, 2 or 1 bytes) that the row size
// and the pointers' alignment allow.
//
// Backward is deterministic: the same ids and out_grad give the same bits on
// every run, and float32 results equal the CPU kernel's (a sequential
// scatter-add in the order of positions):
//   1. key[i] = row of ids[i], or `rows` (a sentinel that sorts last) for ids
//      outside this rank's slice; pos[i] = i;
//   2. a stable LSD radix sort of (key, pos) by key, 8 bits a pass (two passes
//      for up to 65535 rows): per tile digit histograms, one exclusive scan,
//      then a stable scatter in which each id's rank inside its tile is the
//      number of earlier ids of the tile with the same digit. Stability keeps
//      the positions of one row in increasing order;
//   3. one thread block per unique row (the first sorted index of each run of
//      equal keys) sums its out_grad rows in that order from +0 (float64 in
//      double, every other kind in float32; complex tables arrive as their real
//      kind with twice the width) and writes the row once; rows that no id hit
//      keep the zeros of a memset. The same sums as the CPU kernel, bit for bit.
// No float atomics anywhere, so no order depends on scheduling. The cost: a
// row hit k times is summed by one block walking its k positions, which is
// slower than atomics when a single id (a padding id, say) fills the batch.
//
// Scratch memory (keys, positions, histograms) is stream-ordered
// (cudaMallocAsync / hipMallocAsync) where the device has memory pools, else
// cudaMalloc with a stream sync before the free. The raw-pointer API has no
// workspace argument; the op registration could pass one from Paddle's
// allocator later.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "c_embedding.h"
#include "common/gpu_runtime.h"

namespace paddle_ext::c_embedding {
namespace {

using gpu::Stream;

constexpr int kThreads = 256;          // every kernel; within any AMD or NVIDIA default limit
constexpr int64_t kMaxBlocks = 65535;  // grid-stride loops beyond that
constexpr int kRadixBits = 8;
constexpr int kRadix = 1 << kRadixBits;
constexpr int kItemsPerThread = 8;
constexpr int64_t kTile = int64_t{kThreads} * kItemsPerThread;  // ids per sort tile
static_assert(kRadix == kThreads, "the sort kernels give each thread one digit");

constexpr unsigned long long kNoPosition = ULLONG_MAX;

Stream as_stream(void* stream) { return static_cast<Stream>(stream); }

int64_t blocks_for(int64_t work) {
  return std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, kMaxBlocks));
}

void check_launch() { PADDLE_EXT_GPU_CHECK(gpu::get_last_error()); }

// Device scratch memory for the duration of one call (see the file comment).
class Scratch {
 public:
  Scratch(size_t bytes, Stream stream) : stream_(stream) {
    int device = 0;
    PADDLE_EXT_GPU_CHECK(gpu::get_device(&device));
    int pools = 0;
    PADDLE_EXT_GPU_CHECK(gpu::memory_pools_supported(device, &pools));
    async_ = pools != 0;
    if (async_) {
      PADDLE_EXT_GPU_CHECK(gpu::malloc_async(&ptr_, bytes, stream));
    } else {
      PADDLE_EXT_GPU_CHECK(gpu::malloc_device(&ptr_, bytes));
    }
  }
  ~Scratch() {
    if (ptr_ == nullptr) return;
    // A destructor must not throw; an error of the stream itself has been (or
    // will be) reported by the runtime call that met it.
    if (async_) {
      (void)gpu::free_async(ptr_, stream_);
    } else {
      (void)gpu::stream_synchronize(stream_);
      (void)gpu::free_device(ptr_);
    }
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  template <typename T>
  T* as(size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(ptr_) + byte_offset);
  }

 private:
  Stream stream_;
  void* ptr_ = nullptr;
  bool async_ = false;
};

__device__ __forceinline__ int64_t first_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t thread_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// ---------------------------------------------------------------- range check

template <typename IdT>
__global__ void __launch_bounds__(kThreads)
    find_out_of_range_kernel(const IdT* ids, int64_t n, int64_t limit, unsigned long long* first) {
  // limit: id_limit(vocab_size), so a negative vocab_size still refuses negative ids
  for (int64_t i = first_thread(); i < n; i += thread_stride()) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    if (id < 0 || id >= limit) {
      atomicMin(first, static_cast<unsigned long long>(i));
      return;  // this thread's later positions are larger
    }
  }
}

template <typename IdT>
__global__ void fetch_bad_id_kernel(const IdT* ids, unsigned long long* result) {
  if (result[0] != kNoPosition) {
    result[1] = static_cast<unsigned long long>(static_cast<int64_t>(ids[result[0]]));
  }
}

// --------------------------------------------------------------------- forward

struct alignas(16) Bytes16 {
  uint64_t lo, hi;
};

template <typename VecT, typename IdT>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const VecT* table, int64_t rows, int64_t vecs_per_row, const IdT* ids, int64_t n,
                   int64_t start, VecT* out) {
  const int64_t total = n * vecs_per_row;
  for (int64_t e = first_thread(); e < total; e += thread_stride()) {
    const int64_t i = e / vecs_per_row;
    const int64_t j = e - i * vecs_per_row;
    const int64_t row = static_cast<int64_t>(ids[i]) - start;
    VecT v{};
    if (row >= 0 && row < rows) v = table[row * vecs_per_row + j];
    out[e] = v;
  }
}

template <typename VecT, typename IdT>
void launch_forward(const char* table, int64_t rows, int64_t row_bytes, const IdT* ids, int64_t n,
                    int64_t start, char* out, Stream stream) {
  const int64_t vecs_per_row = row_bytes / static_cast<int64_t>(sizeof(VecT));
  forward_kernel<VecT, IdT><<<blocks_for(n * vecs_per_row), kThreads, 0, stream>>>(
      reinterpret_cast<const VecT*>(table), rows, vecs_per_row, ids, n, start,
      reinterpret_cast<VecT*>(out));
  check_launch();
}

// -------------------------------------------------------------------- backward

template <typename IdT>
__global__ void __launch_bounds__(kThreads)
    init_keys_kernel(const IdT* ids, int64_t n, int64_t rows, int64_t start, uint32_t* keys,
                     uint32_t* positions) {
  for (int64_t i = first_thread(); i < n; i += thread_stride()) {
    const int64_t row = static_cast<int64_t>(ids[i]) - start;
    keys[i] = static_cast<uint32_t>(row >= 0 && row < rows ? row : rows);
    positions[i] = static_cast<uint32_t>(i);
  }
}

// counts[digit * tiles + tile] = how many keys of the tile have that digit.
__global__ void __launch_bounds__(kThreads)
    histogram_kernel(const uint32_t* keys, int64_t n, int shift, int64_t tiles, uint32_t* counts) {
  __shared__ uint32_t hist[kRadix];
  hist[threadIdx.x] = 0;
  __syncthreads();
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int r = 0; r < kItemsPerThread; ++r) {
    const int64_t i = base + int64_t{r} * kThreads + threadIdx.x;
    if (i < n) atomicAdd(&hist[(keys[i] >> shift) & (kRadix - 1)], 1u);
  }
  __syncthreads();
  counts[static_cast<int64_t>(threadIdx.x) * tiles + blockIdx.x] = hist[threadIdx.x];
}

// In-place exclusive prefix sum of data[0, len) by a single block.
__global__ void __launch_bounds__(kThreads) exclusive_scan_kernel(uint32_t* data, int64_t len) {
  __shared__ uint32_t buf[kThreads];
  __shared__ uint32_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t base = 0; base < len; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const uint32_t v = i < len ? data[i] : 0u;
    buf[threadIdx.x] = v;
    __syncthreads();
    for (int offset = 1; offset < kThreads; offset <<= 1) {
      const uint32_t add = threadIdx.x >= static_cast<unsigned>(offset) ? buf[threadIdx.x - offset] : 0u;
      __syncthreads();
      buf[threadIdx.x] += add;
      __syncthreads();
    }
    const uint32_t inclusive = buf[threadIdx.x];
    if (i < len) data[i] = carry + inclusive - v;
    __syncthreads();  // everyone has read carry
    if (threadIdx.x == kThreads - 1) carry += inclusive;
    __syncthreads();
  }
}

// Stable scatter of one tile: offsets is the scanned histogram.
__global__ void __launch_bounds__(kThreads)
    scatter_kernel(const uint32_t* keys_in, const uint32_t* positions_in, int64_t n, int shift,
                   int64_t tiles, const uint32_t* offsets, uint32_t* keys_out,
                   uint32_t* positions_out) {
  __shared__ uint32_t digit_of[kThreads];
  __shared__ uint32_t next_slot[kRadix];    // the tile's next output slot per digit
  __shared__ uint32_t round_count[kRadix];  // ids per digit in the current round
  next_slot[threadIdx.x] = offsets[static_cast<int64_t>(threadIdx.x) * tiles + blockIdx.x];
  round_count[threadIdx.x] = 0;
  __syncthreads();
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int r = 0; r < kItemsPerThread; ++r) {
    const int64_t round_base = base + int64_t{r} * kThreads;
    if (round_base >= n) break;  // the same for the whole block
    const int64_t i = round_base + threadIdx.x;
    const bool valid = i < n;
    const uint32_t key = valid ? keys_in[i] : 0u;
    const uint32_t digit = valid ? (key >> shift) & (kRadix - 1) : uint32_t{kRadix};
    digit_of[threadIdx.x] = digit;
    __syncthreads();
    if (valid) {
      uint32_t rank = 0;
      for (unsigned u = 0; u < threadIdx.x; ++u) rank += digit_of[u] == digit;
      const uint32_t slot = next_slot[digit] + rank;
      keys_out[slot] = key;
      positions_out[slot] = positions_in[i];
      atomicAdd(&round_count[digit], 1u);
    }
    __syncthreads();
    next_slot[threadIdx.x] += round_count[threadIdx.x];
    round_count[threadIdx.x] = 0;
    __syncthreads();
  }
}

// One block per unique row: blocks walk the sorted keys and act on the first
// index of each run of equal keys.
// Sums in the dtype's Value: float64 in double, every other dtype in float32.
template <class Io>
__global__ void __launch_bounds__(kThreads)
    accumulate_kernel(const void* out_grad, const uint32_t* keys, const uint32_t* positions, int64_t n,
                      int64_t rows, int64_t width, void* table_grad) {
  for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {
    const uint32_t key = keys[s];
    if (key >= rows) break;  // sentinels sort last: the rest of this block's indices are too
    if (s > 0 && keys[s - 1] == key) continue;
    const int64_t row = key;
    for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
      typename Io::Value acc = 0;
      for (int64_t q = s; q < n && keys[q] == key; ++q) {
        acc += Io::load(static_cast<const typename Io::Storage*>(out_grad)[int64_t{positions[q]} * width + j]);
      }
      static_cast<typename Io::Storage*>(table_grad)[row * width + j] = Io::store(acc);
    }
  }
}

template <class Io>
void launch_accumulate(const void* out_grad, const uint32_t* keys, const uint32_t* positions, int64_t n,
                       int64_t rows, int64_t width, void* table_grad, Stream stream) {
  const int64_t blocks = std::min<int64_t>(n, kMaxBlocks);
  accumulate_kernel<Io><<<blocks, kThreads, 0, stream>>>(out_grad, keys, positions, n, rows, width, table_grad);
  check_launch();
}

int bit_width(uint64_t v) {
  int bits = 0;
  for (; v != 0; v >>= 1) ++bits;
  return bits;
}

size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

template <typename IdT>
BadId find_out_of_range_gpu(const IdT* ids, int64_t n, int64_t vocab_size, void* stream) {
  if (n <= 0) return {};
  const Stream s = as_stream(stream);
  Scratch scratch(2 * sizeof(unsigned long long), s);
  unsigned long long* result = scratch.as<unsigned long long>();
  PADDLE_EXT_GPU_CHECK(gpu::memset_async(result, 0xff, 2 * sizeof(unsigned long long), s));
  find_out_of_range_kernel<IdT><<<blocks_for(n), kThreads, 0, s>>>(ids, n, id_limit(vocab_size), result);
  check_launch();
  fetch_bad_id_kernel<IdT><<<1, 1, 0, s>>>(ids, result);
  check_launch();
  unsigned long long host[2] = {kNoPosition, 0};
  PADDLE_EXT_GPU_CHECK(gpu::memcpy_to_host_async(host, result, sizeof host, s));
  // The answer decides whether the op raises, so the host waits for it: this
  // synchronises the stream (as Paddle's own c_embedding check does).
  PADDLE_EXT_GPU_CHECK(gpu::stream_synchronize(s));
  if (host[0] == kNoPosition) return {};
  return {static_cast<int64_t>(host[0]), static_cast<int64_t>(host[1])};
}

template <typename IdT>
void forward_gpu(const char* table, int64_t rows, int64_t row_bytes, const IdT* ids, int64_t n,
                 int64_t start, char* out, void* stream) {
  if (n <= 0 || row_bytes <= 0) return;
  const Stream s = as_stream(stream);
  const auto fits = [&](int64_t bytes) {
    return row_bytes % bytes == 0 && reinterpret_cast<uintptr_t>(table) % bytes == 0 &&
           reinterpret_cast<uintptr_t>(out) % bytes == 0;
  };
  if (fits(16)) {
    launch_forward<Bytes16>(table, rows, row_bytes, ids, n, start, out, s);
  } else if (fits(8)) {
    launch_forward<uint64_t>(table, rows, row_bytes, ids, n, start, out, s);
  } else if (fits(4)) {
    launch_forward<uint32_t>(table, rows, row_bytes, ids, n, start, out, s);
  } else if (fits(2)) {
    launch_forward<uint16_t>(table, rows, row_bytes, ids, n, start, out, s);
  } else {
    launch_forward<uint8_t>(table, rows, row_bytes, ids, n, start, out, s);
  }
}

template <typename IdT>
void backward_gpu(DType kind, const void* out_grad, const IdT* ids, int64_t n, int64_t rows,
                  int64_t width, int64_t start, void* table_grad, void* stream) {
  if (rows <= 0 || width <= 0) return;
  const Stream s = as_stream(stream);
  const int64_t element_bytes = dtype_bytes(kind);
  PADDLE_EXT_GPU_CHECK(gpu::memset_async(table_grad, 0, static_cast<size_t>(rows * width * element_bytes), s));
  if (n <= 0) return;
  // Keys, positions and offsets are 32-bit; `rows` itself is the sentinel key.
  if (n >= int64_t{UINT32_MAX} || rows >= int64_t{UINT32_MAX}) {
    throw std::invalid_argument("paddle_ext.c_embedding backward (GPU): at most 2^32 - 2 ids and rows, got " +
                                std::to_string(n) + " ids and " + std::to_string(rows) + " rows");
  }
  const int64_t tiles = (n + kTile - 1) / kTile;
  const int passes = std::max(1, (bit_width(static_cast<uint64_t>(rows)) + kRadixBits - 1) / kRadixBits);

  const size_t array_bytes = align_up(static_cast<size_t>(n) * sizeof(uint32_t));
  const size_t counts_bytes = static_cast<size_t>(kRadix * tiles) * sizeof(uint32_t);
  Scratch scratch(4 * array_bytes + counts_bytes, s);
  uint32_t* keys[2] = {scratch.as<uint32_t>(0), scratch.as<uint32_t>(array_bytes)};
  uint32_t* positions[2] = {scratch.as<uint32_t>(2 * array_bytes), scratch.as<uint32_t>(3 * array_bytes)};
  uint32_t* counts = scratch.as<uint32_t>(4 * array_bytes);

  init_keys_kernel<IdT><<<blocks_for(n), kThreads, 0, s>>>(ids, n, rows, start, keys[0], positions[0]);
  check_launch();
  int cur = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const int shift = pass * kRadixBits;
    histogram_kernel<<<tiles, kThreads, 0, s>>>(keys[cur], n, shift, tiles, counts);
    check_launch();
    exclusive_scan_kernel<<<1, kThreads, 0, s>>>(counts, kRadix * tiles);
    check_launch();
    scatter_kernel<<<tiles, kThreads, 0, s>>>(keys[cur], positions[cur], n, shift, tiles, counts,
                                              keys[1 - cur], positions[1 - cur]);
    check_launch();
    cur = 1 - cur;
  }
  with_dtype(kind, [&](auto io) {
    launch_accumulate<decltype(io)>(out_grad, keys[cur], positions[cur], n, rows, width, table_grad, s);
  });
  // The scratch buffer is freed stream-ordered (or after a sync) when it goes
  // out of scope; the kernels above have all been queued by then.
}

#define PADDLE_EXT_INSTANTIATE(IdT)                                                                  \
  template BadId find_out_of_range_gpu<IdT>(const IdT*, int64_t, int64_t, void*);                   \
  template void forward_gpu<IdT>(const char*, int64_t, int64_t, const IdT*, int64_t, int64_t, char*, \
                                 void*);                                                             \
  template void backward_gpu<IdT>(DType, const void*, const IdT*, int64_t, int64_t, int64_t,        \
                                  int64_t, void*, void*);
PADDLE_EXT_INSTANTIATE(int32_t)
PADDLE_EXT_INSTANTIATE(int64_t)
#undef PADDLE_EXT_INSTANTIATE

}  // namespace paddle_ext::c_embedding
