// What the allocator counts. Bytes are block bytes (requests rounded up to
// the alignment) unless named "requested"; reserved bytes are what the
// backend holds for the pool. Read as one consistent snapshot under the lock.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace paddle_ext::runtime {

struct AllocatorStats {
  std::int64_t allocated_bytes = 0;       // in blocks handed out and not yet freed
  std::int64_t peak_allocated_bytes = 0;
  std::int64_t requested_bytes = 0;       // what callers asked for, before rounding
  std::int64_t peak_requested_bytes = 0;
  std::int64_t reserved_bytes = 0;        // held from the backend, in chunks
  std::int64_t peak_reserved_bytes = 0;
  std::int64_t pending_bytes = 0;         // freed, waiting for recorded events
  std::int64_t allocated_blocks = 0;
  std::int64_t pending_blocks = 0;
  std::int64_t free_blocks = 0;
  std::int64_t largest_free_block = 0;
  std::int64_t chunks = 0;
  std::int64_t allocations = 0;           // allocate() calls that returned
  std::int64_t frees = 0;
  std::int64_t cache_hits = 0;            // allocations served without growing
  std::int64_t growths = 0;               // chunks obtained from the backend
  std::int64_t backend_allocs = 0;        // backend allocate calls, failed ones included
  std::int64_t backend_alloc_failures = 0;
  std::int64_t backend_frees = 0;
  std::int64_t backend_alloc_ns = 0;      // time spent inside those calls
  std::int64_t backend_free_ns = 0;
  std::int64_t oom_retries = 0;           // out-of-memory -> free idle chunks -> retry
  std::int64_t idle_chunks_released = 0;  // by empty_cache, the cap, flags, trims and retries
  std::int64_t trims = 0;                 // growths that first gave idle chunks back
  std::int64_t events_recorded = 0;
  std::int64_t events_completed = 0;
  std::int64_t syncs = 0;                 // sync-after-alloc waits

  // Flat (name, value) pairs, in declaration order, for the bindings.
  std::vector<std::pair<std::string, std::int64_t>> items() const;
};

}  // namespace paddle_ext::runtime
