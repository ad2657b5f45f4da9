#include "core/device_event.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace paddle_ext::runtime {
namespace {

const EventOptions& checked(const EventOptions& o) {
  // The CUDA and HIP rule, enforced for every backend so that code written
  // against the cpu double cannot fail later on a GPU.
  if (o.interprocess && o.enable_timing)
    throw std::invalid_argument("interprocess=True needs enable_timing=False (got enable_timing=True)");
  return o;
}

}  // namespace

DeviceEvent::DeviceEvent(std::shared_ptr<EventBackend> backend, int device, EventOptions options)
    : backend_(std::move(backend)), device_(device), options_(checked(options)) {
  if (!backend_) throw std::invalid_argument("backend must not be null");
}

DeviceEvent::~DeviceEvent() {
  if (native_ != nullptr) backend_->destroy(native_);
}

NativeEvent DeviceEvent::ensure_locked() {
  if (native_ == nullptr) native_ = backend_->create(device_, options_);
  return native_;
}

void DeviceEvent::record(Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  backend_->record(ensure_locked(), device_, stream);
  recorded_ = true;
}

bool DeviceEvent::query() {
  std::lock_guard<std::mutex> lock(mutex_);
  return !recorded_ || backend_->query(native_);
}

void DeviceEvent::synchronize() {
  NativeEvent ev = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!recorded_) return;
    ev = native_;
  }
  // Not under the lock: another thread may record or query meanwhile.
  backend_->synchronize(ev);
}

void DeviceEvent::wait(Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recorded_) return;  // nothing captured: nothing to wait for
  backend_->stream_wait(device_, stream, native_);
}

float DeviceEvent::elapsed_ms(DeviceEvent& end) {
  if (!options_.enable_timing || !end.options_.enable_timing)
    throw std::invalid_argument(
        "elapsed_ms needs enable_timing=True on both events; got start enable_timing=" +
        std::string(options_.enable_timing ? "True" : "False") +
        ", end enable_timing=" + (end.options_.enable_timing ? "True" : "False"));
  if (end.backend_ != backend_) throw std::invalid_argument("elapsed_ms: the events belong to different backends");
  NativeEvent a = nullptr, b = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    a = recorded_ ? native_ : nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(end.mutex_);
    b = end.recorded_ ? end.native_ : nullptr;
  }
  if (a == nullptr || b == nullptr)
    throw std::invalid_argument(std::string("elapsed_ms: the ") + (a == nullptr ? "start" : "end") +
                                " event was never recorded");
  return backend_->elapsed_ms(a, b);
}

bool DeviceEvent::created() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return native_ != nullptr;
}

bool DeviceEvent::recorded() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return recorded_;
}

}  // namespace paddle_ext::runtime
