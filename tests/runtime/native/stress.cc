// Multithread stress of the auto-growth allocator, built and run under
// ThreadSanitizer and under AddressSanitizer + UBSan by run_sanitized.sh
// (tests/runtime/test_sanitizers.py drives it in the suite).
//
// 50 threads x 50 random sizes x 10 allocations each, on one pool over the
// fake backend with a capacity limit (so the out-of-memory -> free idle ->
// retry path races too). Every block is filled with a pattern unique to its
// thread and allocation (every 256th byte) and checked before it is freed: two live blocks that
// overlap would corrupt each other. Some blocks are freed with a recorded
// event on a held cpu stream, released later by another thread, and one
// thread keeps calling empty_cache and stats. Exits non-zero on any error.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "backends/cpu_event.h"
#include "backends/fake.h"
#include "core/auto_growth_allocator.h"
#include "core/error.h"

namespace rt = paddle_ext::runtime;

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 50;
  const int sizes = argc > 2 ? std::atoi(argv[2]) : 50;
  const int per_size = argc > 3 ? std::atoi(argv[3]) : 10;
  auto backend = std::make_shared<rt::FakeHostBackend>(rt::FakeOptions{std::size_t{40} << 20, 4096, 4096});
  rt::AllocatorOptions options;
  options.alignment = 256;
  options.chunk_size = std::size_t{1} << 20;
  options.max_cached_bytes = std::size_t{16} << 20;
  std::atomic<long> errors{0}, ooms{0}, gated{0};
  std::atomic<bool> done{false};
  const rt::Stream stream = 7001;  // a cpu stream private to this program
  auto events = rt::CpuEventBackend::instance();
  {
    auto pool = std::make_shared<rt::AutoGrowthAllocator>(backend, options);
    std::thread janitor([&] {
      // Completes the held stream's work now and then, and hits the pool's
      // read paths, while the workers allocate and free.
      for (int i = 0; !done.load(); ++i) {
        if (i % 3 == 0) events->release(stream); else events->hold(stream);
        if (i % 10 == 0) pool->empty_cache();
        (void)pool->stats();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      events->release(stream);
    });
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        std::mt19937_64 rng(1000 + t);
        // 4 KiB .. 256 KiB, log-uniform, plus odd sizes that need rounding.
        std::uniform_real_distribution<double> log_size(12.0, 18.0);
        for (int s = 0; s < sizes; ++s) {
          const std::size_t n = static_cast<std::size_t>(std::exp2(log_size(rng))) + (rng() % 300);
          std::vector<std::pair<unsigned char*, unsigned char>> live;
          for (int k = 0; k < per_size; ++k) {
            try {
              auto* p = static_cast<unsigned char*>(pool->allocate(n));
              const auto tag = static_cast<unsigned char>((t * 31 + s * 7 + k) | 1);
              // Every 256th byte: blocks are 256-aligned, so two overlapping
              // blocks share these addresses (and TSan stays fast).
              for (std::size_t i = 0; i < n; i += 256) p[i] = tag;
              p[n - 1] = tag;
              live.emplace_back(p, tag);
            } catch (const rt::OutOfMemory&) {
              ++ooms;
            }
          }
          std::shuffle(live.begin(), live.end(), rng);
          for (auto& [p, tag] : live) {
            for (std::size_t i = 0; i < n; i += 256)
              if (p[i] != tag) {
                ++errors;
                break;
              }
            if (p[n - 1] != tag) ++errors;
            if (rng() % 4 == 0 && pool->record_event(p, stream)) ++gated;
            pool->free(p);
          }
        }
      });
    }
    for (auto& w : workers) w.join();
    done = true;
    janitor.join();
    events->release(stream);
    pool->empty_cache();
    pool->check_invariants();
    const rt::AllocatorStats st = pool->stats();
    const bool consistent = st.allocated_bytes == 0 && st.requested_bytes == 0 && st.allocated_blocks == 0 &&
                            st.pending_blocks == 0 && st.allocations == st.frees && st.reserved_bytes == 0 &&
                            st.events_recorded == gated.load() && st.events_completed == st.events_recorded;
    std::printf("stress: %d threads x %d sizes x %d allocations: %lld allocations, %ld out-of-memory, %ld gated, "
                "%lld growths, %lld oom retries, peak reserved %lld B, pattern errors %ld, stats %s\n",
                threads, sizes, per_size, static_cast<long long>(st.allocations), ooms.load(), gated.load(),
                static_cast<long long>(st.growths), static_cast<long long>(st.oom_retries),
                static_cast<long long>(st.peak_reserved_bytes), errors.load(), consistent ? "consistent" : "INCONSISTENT");
    if (!consistent) errors += 1;
  }
  if (backend->used() != 0) {
    std::printf("stress: the backend still holds %zu B after the pool is gone\n", backend->used());
    ++errors;
  }
  return errors.load() == 0 ? 0 : 1;
}
