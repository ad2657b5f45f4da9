// The CUDA and HIP backends share their logic; each of cuda.cc and hip.cc
// supplies a runtime traits struct R (its types, constants and a thin
// function per runtime call, written once for both in gpu_runtime_traits.inc)
// and registers these templates. This header includes no GPU header itself,
// so it cannot drift towards one runtime.
//
// R provides: types Error, Event, StreamT; constants kName, kSuccess,
// kNotReady, kOutOfMemory, kDisableTiming, kBlockingSync, kInterprocess;
// functions error_name, error_string, get_last_error, device_count,
// get_device, set_device, host_alloc, host_free, device_synchronize,
// event_create, event_record, event_query, event_synchronize,
// stream_wait_event, event_elapsed, event_destroy.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/backend.h"
#include "core/error.h"

namespace paddle_ext::runtime::gpu {

template <class R>
class Calls {
 public:
  // Counts, then makes, a runtime call.
  template <class F>
  static typename R::Error make(F&& f) {
    count().fetch_add(1, std::memory_order_relaxed);
    return f();
  }
  static std::atomic<std::uint64_t>& count() {
    static std::atomic<std::uint64_t> n{0};
    return n;
  }
};

template <class R>
DeviceError error(typename R::Error e, const std::string& during) {
  // Clears the thread's last error, which a failed call leaves behind for
  // the next unrelated cudaGetLastError to trip over.
  (void)Calls<R>::make([] { return R::get_last_error(); });
  return DeviceError(R::kName, static_cast<int>(e), R::error_name(e), R::error_string(e), during);
}

template <class R>
void check(typename R::Error e, const char* during) {
  if (e != R::kSuccess) throw error<R>(e, during);
}

// Switches to `device` for a scope (no call at all for device < 0).
template <class R>
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (device < 0) return;
    check<R>(Calls<R>::make([&] { return R::get_device(&previous_); }), "get current device");
    if (previous_ != device) {
      check<R>(Calls<R>::make([&] { return R::set_device(device); }), "set device");
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) (void)Calls<R>::make([&] { return R::set_device(previous_); });
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

template <class R>
class EventBackendImpl final : public EventBackend {
 public:
  const char* name() const override { return R::kName; }
  unsigned native_flags(const EventOptions& o) const override {
    return (o.enable_timing ? 0u : static_cast<unsigned>(R::kDisableTiming)) |
           (o.blocking ? static_cast<unsigned>(R::kBlockingSync) : 0u) |
           (o.interprocess ? static_cast<unsigned>(R::kInterprocess) : 0u);
  }
  NativeEvent create(int device, const EventOptions& o) override {
    DeviceGuard<R> guard(device);
    typename R::Event ev{};
    const unsigned flags = native_flags(o);
    check<R>(Calls<R>::make([&] { return R::event_create(&ev, flags); }), "create event");
    return static_cast<NativeEvent>(ev);
  }
  void record(NativeEvent ev, int device, Stream stream) override {
    DeviceGuard<R> guard(device);
    check<R>(Calls<R>::make([&] { return R::event_record(event(ev), stream_of(stream)); }), "record event");
  }
  bool query(NativeEvent ev) override {
    const typename R::Error e = Calls<R>::make([&] { return R::event_query(event(ev)); });
    if (e == R::kSuccess) return true;
    if (e == R::kNotReady) {
      (void)Calls<R>::make([] { return R::get_last_error(); });  // "not ready" is no error
      return false;
    }
    throw error<R>(e, "query event");
  }
  void synchronize(NativeEvent ev) override {
    check<R>(Calls<R>::make([&] { return R::event_synchronize(event(ev)); }), "synchronize event");
  }
  void stream_wait(int device, Stream stream, NativeEvent ev) override {
    DeviceGuard<R> guard(device);
    check<R>(Calls<R>::make([&] { return R::stream_wait_event(stream_of(stream), event(ev)); }), "stream wait event");
  }
  float elapsed_ms(NativeEvent start, NativeEvent end) override {
    float ms = 0.f;
    check<R>(Calls<R>::make([&] { return R::event_elapsed(&ms, event(start), event(end)); }), "event elapsed time");
    return ms;
  }
  void destroy(NativeEvent ev) noexcept override {
    (void)Calls<R>::make([&] { return R::event_destroy(event(ev)); });
  }
  std::uint64_t native_calls() const override { return Calls<R>::count().load(); }

  static std::shared_ptr<EventBackend> instance() {
    static const auto backend = std::make_shared<EventBackendImpl<R>>();
    return backend;
  }

 private:
  static typename R::Event event(NativeEvent ev) { return static_cast<typename R::Event>(ev); }
  static typename R::StreamT stream_of(Stream s) { return reinterpret_cast<typename R::StreamT>(s); }
};

template <class R>
class HostBackendImpl final : public HostBackend {
 public:
  const char* name() const override { return R::kName; }
  // Pinned allocations come back page-aligned and page-granular.
  std::size_t base_alignment() const override { return 4096; }
  std::size_t granularity() const override { return 4096; }
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    const typename R::Error e = Calls<R>::make([&] { return R::host_alloc(&p, bytes); });
    if (e == R::kSuccess) return p;
    const std::string during = "pinned host allocation of " + std::to_string(bytes) + " B";
    if (e == R::kOutOfMemory) {
      (void)Calls<R>::make([] { return R::get_last_error(); });
      throw OutOfMemory(R::kName, static_cast<int>(e), R::error_name(e), R::error_string(e), during);
    }
    throw error<R>(e, during);
  }
  void deallocate(void* ptr, std::size_t) override {
    check<R>(Calls<R>::make([&] { return R::host_free(ptr); }), "free pinned host memory");
  }
  void synchronize() override {
    check<R>(Calls<R>::make([] { return R::device_synchronize(); }), "device synchronize");
  }
  std::shared_ptr<EventBackend> events() override { return EventBackendImpl<R>::instance(); }
};

// The registry's factories (BackendEntry) for runtime R.
template <class R>
std::shared_ptr<HostBackend> host_backend() {
  return std::make_shared<HostBackendImpl<R>>();
}
template <class R>
std::shared_ptr<EventBackend> event_backend() {
  return EventBackendImpl<R>::instance();
}

// "" when a device is there, else the runtime's reason.
template <class R>
std::string unavailable() {
  int n = 0;
  const typename R::Error e = Calls<R>::make([&] { return R::device_count(&n); });
  if (e != R::kSuccess) return error<R>(e, "device count").what();
  return n > 0 ? std::string() : std::string(R::kName) + ": no device";
}

}  // namespace paddle_ext::runtime::gpu
