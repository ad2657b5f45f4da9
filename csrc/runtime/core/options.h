// Knobs of the auto-growth allocator and its debug flags. The Python face
// (paddle_ext/runtime/config.py) fills them from the environment or the
// paddle_ext config; validate() names the argument, the value and the
// allowed range of anything out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>

namespace paddle_ext::runtime {

// The debugging family of upstream's FLAGS_alloc_fill_value,
// FLAGS_sync_after_alloc and FLAGS_free_idle_chunk (PaddlePaddle/Paddle#57797).
struct DebugFlags {
  int fill_value = -1;           // -1: off; 0..255: memset every allocation with this byte
  bool sync_after_alloc = false; // wait for the device after every allocation
  bool dump_chunks = false;      // print the chunk layout on growth and on out-of-memory
  bool free_idle_chunk = false;  // give a chunk back as soon as it is entirely free
};

struct AllocatorOptions {
  // Every block starts at a multiple of this; a power of two. Upstream pins
  // 64 KiB, which wastes most of a chunk on small staging buffers.
  std::size_t alignment = 256;
  // Growth requests max(request, chunk_size) from the backend, so small
  // allocations share chunks; 0 grows by the request alone.
  std::size_t chunk_size = std::size_t{2} << 20;
  // Cap on cached bytes (reserved - allocated): beyond it, entirely free
  // chunks go back to the backend right after a free.
  std::size_t max_cached_bytes = SIZE_MAX;
  // Before a growth that would lift reserved bytes above their peak so far,
  // give idle chunks back (largest first) until it would not. Dedicated
  // chunks of variable-size requests (variable sequence lengths) otherwise
  // pile up: on bench/pinned_pool.py's variable trace the pool held 4.5x the
  // peak live bytes without it, 1.00x with it (power-of-two rounding: 1.44x);
  // fixed shapes never trigger it once warm.
  bool trim_on_growth = true;
  // A request above chunk_size gets a dedicated chunk of its own (exactly its
  // aligned size), which is never split. A later request may take a free
  // dedicated chunk whole only if it exceeds the request by at most this
  // fraction of the request; otherwise the pool grows (and trim_on_growth
  // gives the idle misfits back first). So at any new peak, reserved bytes
  // are at most (1 + reuse_waste) x the live large requests plus the shared
  // chunks. Splitting large chunks instead let small blocks pin them: on
  // bench/pinned_pool.py's variable trace 1.34x the peak live bytes, 1.00
  // with this; the price is backend calls when sizes vary by more than it.
  double reuse_waste = 0.0625;
  // Spare native events kept for reuse by record_event (per device).
  std::size_t spare_events = 64;
  DebugFlags debug;
};

inline constexpr std::size_t kMinAlignment = 16;
inline constexpr std::size_t kMaxAlignment = std::size_t{1} << 16;
inline constexpr std::size_t kMaxChunkSize = std::size_t{1} << 40;
// Requests above this are refused before any rounding can overflow.
inline constexpr std::size_t kMaxRequest = std::size_t{1} << 46;
inline constexpr double kMaxReuseWaste = 1.0;

// Throws std::invalid_argument, e.g. "alignment must be a power of two in
// [16, 65536], got 100".
void validate(const AllocatorOptions& options);

}  // namespace paddle_ext::runtime
