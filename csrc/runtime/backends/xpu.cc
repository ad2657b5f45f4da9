// The Kunlun XPU backend: pinned host memory from xpu_host_alloc and XRE
// events, through the runtime that csrc/runtime/device/xpu_runtime.cc loads
// with dlopen, so it is compiled into every build (no SDK needed) and reports
// "no XPU runtime" as a DeviceError where there is none.
//
// XRE events take no creation flags: the options are recorded (and checked
// by DeviceEvent) but ignored, so native_flags() is 0. XRE has no
// non-blocking event query either: query() waits for the event, which keeps
// stream-ordered reuse correct at the price of blocking the polling thread.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/registry.h"
#include "device/xpu_runtime.h"

namespace paddle_ext::runtime {
namespace {

namespace xrt = paddle_ext::runtime::xpu;

// XRE codes may come back negated; names and texts come from the loader.
DeviceError xpu_error(int code, const std::string& during) {
  const std::string text = xrt::describe(code);  // "XPUERR_NOMEM (705): device memory not enough"
  const auto paren = text.find(" (");
  const auto colon = text.find("): ");
  return DeviceError("xpu", code, text.substr(0, paren), colon == std::string::npos ? text : text.substr(colon + 3),
                     during);
}

const xrt::Api& runtime(const char* during) {
  const xrt::Api* rt = xrt::api();
  if (rt == nullptr) throw DeviceError("xpu", -1, "XPU_RUNTIME_NOT_FOUND", xrt::unavailable_reason(), during);
  return *rt;
}

std::atomic<std::uint64_t>& calls() {
  static std::atomic<std::uint64_t> n{0};
  return n;
}

void check(int code, const char* during) {
  if (code != XPU_SUCCESS) throw xpu_error(code, during);
}

// Makes a counted runtime call.
template <class F>
int call(F&& f) {
  calls().fetch_add(1, std::memory_order_relaxed);
  return f();
}

class DeviceGuard {
 public:
  DeviceGuard(const xrt::Api& rt, int device) : rt_(rt) {
    if (device < 0) return;
    check(call([&] { return rt_.current_device(&previous_); }), "xpu_current_device");
    if (previous_ != device) {
      check(call([&] { return rt_.set_device(device); }), "xpu_set_device");
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) call([&] { return rt_.set_device(previous_); });
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  const xrt::Api& rt_;
  int previous_ = -1;
  bool switched_ = false;
};

class XpuEvents final : public EventBackend {
 public:
  const char* name() const override { return "xpu"; }
  unsigned native_flags(const EventOptions&) const override { return 0; }
  NativeEvent create(int device, const EventOptions&) override {
    const xrt::Api& rt = runtime("xpu_event_create");
    DeviceGuard guard(rt, device);
    XPUEvent ev = nullptr;
    check(call([&] { return rt.event_create(&ev); }), "xpu_event_create");
    return ev;
  }
  void record(NativeEvent ev, int device, Stream stream) override {
    const xrt::Api& rt = runtime("xpu_event_record");
    DeviceGuard guard(rt, device);
    check(call([&] { return rt.event_record(ev, reinterpret_cast<XPUStream>(stream)); }), "xpu_event_record");
  }
  bool query(NativeEvent ev) override {
    synchronize(ev);
    return true;
  }
  void synchronize(NativeEvent ev) override {
    const xrt::Api& rt = runtime("xpu_event_wait");
    check(call([&] { return rt.event_wait(ev); }), "xpu_event_wait");
  }
  void stream_wait(int device, Stream stream, NativeEvent ev) override {
    const xrt::Api& rt = runtime("xpu_stream_wait_event");
    if (rt.stream_wait_event == nullptr) {  // older runtimes: the host waits instead, a stronger order
      synchronize(ev);
      return;
    }
    DeviceGuard guard(rt, device);
    check(call([&] { return rt.stream_wait_event(reinterpret_cast<XPUStream>(stream), ev); }),
          "xpu_stream_wait_event");
  }
  float elapsed_ms(NativeEvent, NativeEvent) override {
    throw DeviceError("xpu", XPUERR_NOSUPPORT, "XPUERR_NOSUPPORT", "XPU runtime events carry no timestamps",
                      "elapsed_ms");
  }
  void destroy(NativeEvent ev) noexcept override {
    if (const xrt::Api* rt = xrt::api()) call([&] { return rt->event_destroy(ev); });
  }
  std::uint64_t native_calls() const override { return calls().load(); }

  static std::shared_ptr<EventBackend> instance() {
    static const auto backend = std::make_shared<XpuEvents>();
    return backend;
  }
};

class XpuHost final : public HostBackend {
 public:
  const char* name() const override { return "xpu"; }
  // Nothing in XRE promises more than malloc's alignment; the pool pads.
  std::size_t base_alignment() const override { return 16; }
  std::size_t granularity() const override { return 4096; }
  void* allocate(std::size_t bytes) override {
    const std::string during = "xpu_host_alloc of " + std::to_string(bytes) + " B";
    const xrt::Api& rt = runtime(during.c_str());
    if (rt.host_alloc == nullptr)
      throw DeviceError("xpu", XPUERR_NOSUPPORT, "XPUERR_NOSUPPORT", rt.library + " has no xpu_host_alloc", during);
    void* p = nullptr;
    const int code = call([&] { return rt.host_alloc(&p, bytes, 0); });
    if (code == XPU_SUCCESS) return p;
    if (std::abs(code) == XPUERR_NOCPUMEM || std::abs(code) == XPUERR_NOMEM) {
      const DeviceError e = xpu_error(code, during);
      throw OutOfMemory("xpu", code, e.name(), "host memory not enough", during);
    }
    throw xpu_error(code, during);
  }
  void deallocate(void* ptr, std::size_t) override {
    const xrt::Api& rt = runtime("xpu_host_free");
    if (rt.host_free == nullptr)
      throw DeviceError("xpu", XPUERR_NOSUPPORT, "XPUERR_NOSUPPORT", rt.library + " has no xpu_host_free", "free");
    check(call([&] { return rt.host_free(ptr); }), "xpu_host_free");
  }
  void synchronize() override {
    const xrt::Api& rt = runtime("xpu_wait");
    check(call([&] { return rt.wait(nullptr); }), "xpu_wait");
  }
  std::shared_ptr<EventBackend> events() override { return XpuEvents::instance(); }
};

std::string unavailable() {
  if (xrt::api() == nullptr) return xrt::unavailable_reason();
  try {
    return xrt::device_count() > 0 ? std::string() : std::string("xpu: no device");
  } catch (const std::exception& e) {
    return e.what();
  }
}

const Registrar registrar({"xpu", 5, [] { return std::static_pointer_cast<HostBackend>(std::make_shared<XpuHost>()); },
                           [] { return XpuEvents::instance(); }, unavailable});

}  // namespace
}  // namespace paddle_ext::runtime
