#include "core/stats.h"

namespace paddle_ext::runtime {

std::vector<std::pair<std::string, std::int64_t>> AllocatorStats::items() const {
  return {
      {"allocated_bytes", allocated_bytes},
      {"peak_allocated_bytes", peak_allocated_bytes},
      {"requested_bytes", requested_bytes},
      {"peak_requested_bytes", peak_requested_bytes},
      {"reserved_bytes", reserved_bytes},
      {"peak_reserved_bytes", peak_reserved_bytes},
      {"pending_bytes", pending_bytes},
      {"allocated_blocks", allocated_blocks},
      {"pending_blocks", pending_blocks},
      {"free_blocks", free_blocks},
      {"largest_free_block", largest_free_block},
      {"chunks", chunks},
      {"allocations", allocations},
      {"frees", frees},
      {"cache_hits", cache_hits},
      {"growths", growths},
      {"backend_allocs", backend_allocs},
      {"backend_alloc_failures", backend_alloc_failures},
      {"backend_frees", backend_frees},
      {"backend_alloc_ns", backend_alloc_ns},
      {"backend_free_ns", backend_free_ns},
      {"oom_retries", oom_retries},
      {"idle_chunks_released", idle_chunks_released},
      {"trims", trims},
      {"events_recorded", events_recorded},
      {"events_completed", events_completed},
      {"syncs", syncs},
  };
}

}  // namespace paddle_ext::runtime
