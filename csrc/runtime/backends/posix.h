// The posix host backend: anonymous mmap, page-locked with mlock so that a
// device copy can DMA from it like from cudaHostAlloc memory, and so that
// benchmarks here measure the real cost of pinning (page faults + locking).
//
// mlock needs CAP_IPC_LOCK or room under RLIMIT_MEMLOCK (8 MiB by default
// for ordinary users). What happens when it is refused is the lock mode:
//   try      (default) keep the mapping pageable, count it (counters
//            "unlocked_bytes", "mlock_failures", "last_mlock_errno") and warn
//            once on stderr: the pool keeps working, just without pinning;
//   require  give the mapping back and fail: ENOMEM/EAGAIN as OutOfMemory
//            (the pool frees idle chunks, which unlocks memory, and retries),
//            anything else as DeviceError;
//   off      never lock (pageable memory, e.g. to compare).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/backend.h"

namespace paddle_ext::runtime {

enum class LockMode { kTry, kRequire, kOff };

// "try" / "require" / "off"; throws std::invalid_argument naming the choices.
LockMode parse_lock_mode(const std::string& text);
const char* to_string(LockMode mode);

class PosixHostBackend final : public HostBackend {
 public:
  explicit PosixHostBackend(LockMode mode = LockMode::kTry);

  const char* name() const override { return "posix"; }
  std::size_t base_alignment() const override { return page_; }
  std::size_t granularity() const override { return page_; }
  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) override;
  std::shared_ptr<EventBackend> events() override;
  std::map<std::string, std::int64_t> counters() const override;

  LockMode mode() const { return mode_; }

 private:
  const LockMode mode_;
  const std::size_t page_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, bool> locked_;  // live mappings: locked or not
  std::int64_t locked_bytes_ = 0, unlocked_bytes_ = 0, mlock_failures_ = 0;
  int last_errno_ = 0;
  bool warned_ = false;
};

}  // namespace paddle_ext::runtime
