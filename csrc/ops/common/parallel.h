// A tiny fork-join helper for the CPU kernels. The kernels here are memory
// bound and run for milliseconds, so spawning a few std::threads per call is
// cheap next to the work, and keeps the library free of an OpenMP runtime that
// could clash with the one Paddle's wheel already loads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace paddle_ext {

// Threads the CPU kernels may use; set from Python (paddle_ext.ops.set_num_threads),
// defaulting to PADDLE_EXT_NUM_THREADS, then to the hardware's count.
int num_threads();
void set_num_threads(int n);

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
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (int64_t w = 1; w < workers; ++w) {
    const int64_t b = w * step, e = std::min(n, b + step);
    if (b < e) pool.emplace_back([&fn, b, e] { fn(b, e); });
  }
  fn(int64_t{0}, std::min(n, step));
  for (auto& t : pool) t.join();
}

}  // namespace paddle_ext
