// The fake host backend, for tests: ordinary heap memory behind the
// HostBackend interface, with a capacity limit, failure injection and a
// ledger that rejects any deallocate not matching an allocate (so allocator
// bugs surface as errors, not as corruption). Its events are the cpu ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/backend.h"

namespace paddle_ext::runtime {

struct FakeOptions {
  std::size_t capacity = SIZE_MAX;   // bytes the backend may hold at once
  std::size_t granularity = 4096;    // allocations are multiples of this
  std::size_t base_alignment = 4096; // returned pointers are aligned to this
};

class FakeHostBackend final : public HostBackend {
 public:
  explicit FakeHostBackend(FakeOptions options = {});
  ~FakeHostBackend() override;

  const char* name() const override { return "fake"; }
  std::size_t base_alignment() const override { return options_.base_alignment; }
  std::size_t granularity() const override { return options_.granularity; }
  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) override;
  void synchronize() override;
  std::shared_ptr<EventBackend> events() override;
  std::map<std::string, std::int64_t> counters() const override;

  // The next `count` allocate calls fail: with OutOfMemory (ENOMEM) when
  // out_of_memory, else with DeviceError(code, name).
  void fail_next(int count, bool out_of_memory = true, int code = 12, const std::string& name = "ENOMEM");
  void set_capacity(std::size_t bytes);
  // Every allocate sleeps this long first, like a slow cudaHostAlloc / mlock
  // (tests use it to show that other threads' cache hits do not wait).
  void set_delay(double seconds);
  std::size_t used() const;

 private:
  FakeOptions options_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, std::size_t> live_;
  std::size_t used_ = 0;
  std::int64_t delay_ns_ = 0;
  int fail_count_ = 0;
  bool fail_oom_ = true;
  int fail_code_ = 12;
  std::string fail_name_ = "ENOMEM";
  std::int64_t allocs_ = 0, frees_ = 0, syncs_ = 0, failures_ = 0;
};

}  // namespace paddle_ext::runtime
