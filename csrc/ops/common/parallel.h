// Fork-join for the CPU kernels. Workers come from the OpenMP runtime the
// process has already loaded (Paddle's wheel loads Intel's libiomp5 for MKL),
// reached through its GNU-compatible entry point, so the kernels run on the
// same threads as Paddle's MKL calls: MKL's workers spin for KMP_BLOCKTIME
// (200 ms) after each call, and separate std::threads would compete with them
// for the cores (measured on 2 cores: a 15 ms attention call took 27 ms right
// after a Paddle matmul). Without a loaded runtime (a C++ driver, a probe), or
// with PADDLE_EXT_THREAD_POOL=std, a few std::threads per call: cheap next to
// kernels that run for milliseconds. The library never loads a runtime itself.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>

namespace paddle_ext {

// Threads the CPU kernels may use; set from Python (paddle_ext.ops.set_num_threads),
// defaulting to PADDLE_EXT_NUM_THREADS, then to the hardware's count.
int num_threads();
void set_num_threads(int n);

// "openmp (libiomp5.so)" or "std::thread": where run_workers' threads come from now.
const char* thread_pool();

// Runs body(w) on up to `workers` threads at once, the calling thread among
// them, w distinct in [0, workers); returns when all have. A runtime may give
// fewer threads than asked, so bodies share their work dynamically (see
// parallel_for) rather than assume every w runs. The first exception a body
// throws is rethrown here.
void run_workers(int64_t workers, const std::function<void(int64_t)>& body);

// Calls fn(begin, end) on disjoint ranges covering [0, n). Ranges hold at
// least `grain` items, so small problems stay on the calling thread.
template <typename Fn>
void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  const int64_t max_workers = std::max<int64_t>(1, n / std::max<int64_t>(1, grain));
  const int64_t workers = std::min<int64_t>(num_threads(), max_workers);
  if (workers <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t step = (n + workers - 1) / workers;
  std::atomic<int64_t> next{0};
  run_workers(workers, [&](int64_t) {
    for (int64_t r = next.fetch_add(1); r < workers; r = next.fetch_add(1)) {
      const int64_t b = r * step, e = std::min(n, b + step);
      if (b < e) fn(b, e);
    }
  });
}

}  // namespace paddle_ext
