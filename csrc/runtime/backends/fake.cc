#include "backends/fake.h"

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "backends/cpu_event.h"
#include "core/error.h"
#include "core/registry.h"

namespace paddle_ext::runtime {

FakeHostBackend::FakeHostBackend(FakeOptions options) : options_(options) {
  const auto pow2 = [](std::size_t v) { return v != 0 && (v & (v - 1)) == 0; };
  if (!pow2(options_.base_alignment) || options_.base_alignment < sizeof(void*) || options_.base_alignment > (1u << 20))
    throw std::invalid_argument("base_alignment must be a power of two in [8, 1048576], got " +
                                std::to_string(options_.base_alignment));
  if (options_.granularity == 0 || options_.granularity > (1u << 30))
    throw std::invalid_argument("granularity must be in [1, 1073741824], got " + std::to_string(options_.granularity));
}

FakeHostBackend::~FakeHostBackend() {
  for (auto& [p, n] : live_) std::free(p);
}

void* FakeHostBackend::allocate(std::size_t bytes) {
  std::int64_t delay = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    delay = delay_ns_;
  }
  if (delay > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(delay));
  std::lock_guard<std::mutex> lock(mutex_);
  if (fail_count_ > 0) {
    --fail_count_;
    ++failures_;
    if (fail_oom_)
      throw OutOfMemory("fake", fail_code_, fail_name_, "injected out-of-memory",
                        "allocate " + std::to_string(bytes) + " B");
    throw DeviceError("fake", fail_code_, fail_name_, "injected failure", "allocate " + std::to_string(bytes) + " B");
  }
  if (bytes > options_.capacity || used_ > options_.capacity - bytes) {
    ++failures_;
    throw OutOfMemory("fake", 12, "ENOMEM",
                      "capacity " + std::to_string(options_.capacity) + " B, in use " + std::to_string(used_) + " B",
                      "allocate " + std::to_string(bytes) + " B");
  }
  const std::size_t a = options_.base_alignment;
  void* p = std::aligned_alloc(a, (bytes + a - 1) / a * a);
  if (p == nullptr) throw OutOfMemory("fake", 12, "ENOMEM", "aligned_alloc failed", "allocate " + std::to_string(bytes) + " B");
  live_.emplace(p, bytes);
  used_ += bytes;
  ++allocs_;
  return p;
}

void FakeHostBackend::deallocate(void* ptr, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end() || it->second != bytes)
    throw std::logic_error("fake backend: deallocate(" + std::to_string(reinterpret_cast<std::uintptr_t>(ptr)) + ", " +
                           std::to_string(bytes) + ") matches no allocation");
  std::free(ptr);
  used_ -= bytes;
  live_.erase(it);
  ++frees_;
}

void FakeHostBackend::synchronize() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++syncs_;
}

std::shared_ptr<EventBackend> FakeHostBackend::events() { return CpuEventBackend::instance(); }

std::map<std::string, std::int64_t> FakeHostBackend::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {{"used_bytes", static_cast<std::int64_t>(used_)},
          {"live_allocations", static_cast<std::int64_t>(live_.size())},
          {"allocs", allocs_},
          {"frees", frees_},
          {"failures", failures_},
          {"syncs", syncs_}};
}

void FakeHostBackend::fail_next(int count, bool out_of_memory, int code, const std::string& name) {
  if (count < 0) throw std::invalid_argument("count must be >= 0, got " + std::to_string(count));
  std::lock_guard<std::mutex> lock(mutex_);
  fail_count_ = count;
  fail_oom_ = out_of_memory;
  fail_code_ = code;
  fail_name_ = name;
}

void FakeHostBackend::set_capacity(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  options_.capacity = bytes;
}

void FakeHostBackend::set_delay(double seconds) {
  if (!(seconds >= 0.0 && seconds <= 60.0))
    throw std::invalid_argument("delay must be in [0, 60] seconds, got " + std::to_string(seconds));
  std::lock_guard<std::mutex> lock(mutex_);
  delay_ns_ = static_cast<std::int64_t>(seconds * 1e9);
}

std::size_t FakeHostBackend::used() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

namespace {
const Registrar registrar({"fake", 2, [] { return std::static_pointer_cast<HostBackend>(std::make_shared<FakeHostBackend>()); },
                           nullptr, nullptr});
}  // namespace

}  // namespace paddle_ext::runtime
