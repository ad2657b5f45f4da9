// The two interfaces a device backend implements; the allocator core and
// DeviceEvent see nothing else, so this header (and the whole core) includes
// no GPU header and builds on every machine. One backend per file lives in
// csrc/runtime/backends/ and registers itself in core/registry.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace paddle_ext::runtime {

// A stream as the native runtime knows it (cudaStream_t, hipStream_t,
// XPUStream), carried as an integer so Python can pass Paddle's raw handle;
// 0 is the default stream. The cpu backend numbers its streams freely.
using Stream = std::uintptr_t;

// An opaque native event (cudaEvent_t, ...) owned by whoever created it.
using NativeEvent = void*;

// Explicit event options: every default is the cheap, synchronisation-only
// event. Upstream Paddle created its events with cudaEventDefault (timing on),
// which blocks communication/compute overlap under
// CUDA_DEVICE_MAX_CONNECTIONS=1 (PaddlePaddle/Paddle#57574).
struct EventOptions {
  bool enable_timing = false;  // record timestamps (needed by elapsed_ms only)
  bool blocking = false;       // synchronize() sleeps instead of spinning
  bool interprocess = false;   // shareable with other processes (needs timing off)
};

class EventBackend {
 public:
  virtual ~EventBackend() = default;
  virtual const char* name() const = 0;
  // The native creation flags these options map to (cudaEvent* bits on
  // cuda/hip/cpu, 0 where the runtime takes none). Pure: no runtime call.
  virtual unsigned native_flags(const EventOptions& options) const = 0;
  // device < 0: the calling thread's current device.
  virtual NativeEvent create(int device, const EventOptions& options) = 0;
  virtual void record(NativeEvent event, int device, Stream stream) = 0;
  // Non-blocking: has all work captured by the last record completed?
  virtual bool query(NativeEvent event) = 0;
  virtual void synchronize(NativeEvent event) = 0;
  // Work submitted to `stream` after this call waits for the event.
  virtual void stream_wait(int device, Stream stream, NativeEvent event) = 0;
  virtual float elapsed_ms(NativeEvent start, NativeEvent end) = 0;
  virtual void destroy(NativeEvent event) noexcept = 0;
  // Native runtime calls made so far (tests check that constructing a
  // DeviceEvent makes none).
  virtual std::uint64_t native_calls() const = 0;
};

// Page-locked (or, for posix without the privilege, pageable) host memory.
class HostBackend {
 public:
  virtual ~HostBackend() = default;
  virtual const char* name() const = 0;
  // Every pointer allocate returns is aligned to this (a power of two).
  virtual std::size_t base_alignment() const = 0;
  // The backend hands out whole multiples of this anyway (the page), so the
  // allocator asks for multiples of it and accounts for what it really holds.
  virtual std::size_t granularity() const = 0;
  // Throws OutOfMemory when memory runs out (the allocator frees idle chunks
  // and retries), DeviceError on any other failure.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes) = 0;
  // Waits for all device work (the sync-after-alloc debug flag).
  virtual void synchronize() {}
  // The events that say when a stream has finished reading this memory.
  virtual std::shared_ptr<EventBackend> events() = 0;
  // Backend-specific counters for stats (e.g. posix locked/unlocked bytes).
  virtual std::map<std::string, std::int64_t> counters() const { return {}; }
};

}  // namespace paddle_ext::runtime
