// DeviceEvent: one constructor with explicit options, timing disabled unless
// asked for (the cudaEventDisableTiming fix, PaddlePaddle/Paddle#57574: a
// timing event makes NCCL/GEMM overlap impossible under
// CUDA_DEVICE_MAX_CONNECTIONS=1). The native event is created lazily at the
// first record, so constructing one (e.g. at import, or on a machine without
// a device) makes no runtime call. Safe to share between threads.
#pragma once

#include <memory>
#include <mutex>

#include "core/backend.h"

namespace paddle_ext::runtime {

class DeviceEvent {
 public:
  // device < 0: the current device at the first record. Throws
  // std::invalid_argument for a contradictory set of options.
  explicit DeviceEvent(std::shared_ptr<EventBackend> backend, int device = -1, EventOptions options = {});
  ~DeviceEvent();
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;

  // Captures the work submitted to `stream` so far; creates the native event
  // on first use.
  void record(Stream stream);
  // True once that work completed; true (without a runtime call) if never recorded.
  bool query();
  // Blocks until that work completed; returns at once if never recorded.
  void synchronize();
  // Work submitted to `stream` from now on waits for this event.
  void wait(Stream stream);
  // Milliseconds between this event and `end`; both need enable_timing and a record.
  float elapsed_ms(DeviceEvent& end);

  bool created() const;
  bool recorded() const;
  int device() const { return device_; }
  const EventOptions& options() const { return options_; }
  unsigned native_flags() const { return backend_->native_flags(options_); }
  const char* backend_name() const { return backend_->name(); }

 private:
  NativeEvent ensure_locked();

  const std::shared_ptr<EventBackend> backend_;
  const int device_;
  const EventOptions options_;
  mutable std::mutex mutex_;
  NativeEvent native_ = nullptr;
  bool recorded_ = false;
};

}  // namespace paddle_ext::runtime
