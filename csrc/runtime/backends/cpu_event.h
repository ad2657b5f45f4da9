// The cpu event backend: a state machine standing in for a device runtime,
// the test double of every event path. Streams are plain integers; a record
// is one submission on its stream, and a stream completes its submissions at
// once unless it is held (hold / step / release let a test decide when "the
// device" finishes). stream_wait makes a stream's later submissions wait for
// another stream's event, as cudaStreamWaitEvent does.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/backend.h"

namespace paddle_ext::runtime {

// cudaEvent* bit values, so native_flags() reads the same on cpu and cuda.
inline constexpr unsigned kEventBlockingSync = 0x1;
inline constexpr unsigned kEventDisableTiming = 0x2;
inline constexpr unsigned kEventInterprocess = 0x4;

class CpuEventBackend final : public EventBackend {
 public:
  // The process-wide instance: every cpu event and pool shares its streams.
  static std::shared_ptr<CpuEventBackend> instance();

  const char* name() const override { return "cpu"; }
  unsigned native_flags(const EventOptions& options) const override;
  NativeEvent create(int device, const EventOptions& options) override;
  void record(NativeEvent event, int device, Stream stream) override;
  bool query(NativeEvent event) override;
  void synchronize(NativeEvent event) override;
  void stream_wait(int device, Stream stream, NativeEvent event) override;
  float elapsed_ms(NativeEvent start, NativeEvent end) override;
  void destroy(NativeEvent event) noexcept override;
  std::uint64_t native_calls() const override;

  // Test controls.
  void hold(Stream stream);                    // stop completing submissions
  void step(Stream stream, std::uint64_t n);   // complete the n oldest, stay held
  void release(Stream stream);                 // complete everything, stop holding
  std::uint64_t outstanding(Stream stream) const;  // submitted, not completed
  std::uint64_t live_events() const;

 private:
  struct Event;
  struct StreamState {
    std::uint64_t submitted = 0;
    std::uint64_t completed = 0;
    std::uint64_t limit = UINT64_MAX;  // while held: complete up to here
    bool held = false;
    // (stream, ticket) pairs that later submissions wait for.
    std::vector<std::pair<Stream, std::uint64_t>> waits;
  };
  bool done_locked(const Event* e) const;
  void advance_locked();

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<Stream, StreamState> streams_;
  std::vector<Event*> watching_;  // recorded, not yet complete: stamped on completion
  std::uint64_t calls_ = 0;
  std::uint64_t live_ = 0;
};

}  // namespace paddle_ext::runtime
