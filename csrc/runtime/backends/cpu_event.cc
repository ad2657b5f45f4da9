#include "backends/cpu_event.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "core/registry.h"

namespace paddle_ext::runtime {

struct CpuEventBackend::Event {
  EventOptions options;
  Stream stream = 0;
  std::uint64_t ticket = 0;  // 0: never recorded
  bool done = false;
  std::chrono::steady_clock::time_point done_at;
};

std::shared_ptr<CpuEventBackend> CpuEventBackend::instance() {
  static const auto backend = std::make_shared<CpuEventBackend>();
  return backend;
}

unsigned CpuEventBackend::native_flags(const EventOptions& o) const {
  return (o.enable_timing ? 0u : kEventDisableTiming) | (o.blocking ? kEventBlockingSync : 0u) |
         (o.interprocess ? kEventInterprocess : 0u);
}

NativeEvent CpuEventBackend::create(int, const EventOptions& options) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++calls_;
  ++live_;
  auto* e = new Event();
  e->options = options;
  return e;
}

bool CpuEventBackend::done_locked(const Event* e) const { return e->ticket == 0 || e->done; }

void CpuEventBackend::advance_locked() {
  // Completion can unblock waits on other streams: repeat until stable.
  for (bool moved = true; moved;) {
    moved = false;
    for (auto& [id, s] : streams_) {
      auto& w = s.waits;
      w.erase(std::remove_if(w.begin(), w.end(),
                             [this](const std::pair<Stream, std::uint64_t>& dep) {
                               return streams_[dep.first].completed >= dep.second;
                             }),
              w.end());
      const std::uint64_t target = !w.empty() ? s.completed : s.held ? std::min(s.limit, s.submitted) : s.submitted;
      if (target > s.completed) {
        s.completed = target;
        moved = true;
      }
    }
  }
  const auto now = std::chrono::steady_clock::now();
  bool stamped = false;
  watching_.erase(std::remove_if(watching_.begin(), watching_.end(),
                                 [&](Event* e) {
                                   if (streams_[e->stream].completed < e->ticket) return false;
                                   e->done = true;
                                   e->done_at = now;
                                   stamped = true;
                                   return true;
                                 }),
                  watching_.end());
  if (stamped) changed_.notify_all();
}

void CpuEventBackend::record(NativeEvent event, int, Stream stream) {
  auto* e = static_cast<Event*>(event);
  std::lock_guard<std::mutex> lock(mutex_);
  ++calls_;
  watching_.erase(std::remove(watching_.begin(), watching_.end(), e), watching_.end());
  StreamState& s = streams_[stream];
  e->stream = stream;
  e->ticket = ++s.submitted;
  e->done = false;
  watching_.push_back(e);
  advance_locked();
}

bool CpuEventBackend::query(NativeEvent event) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++calls_;
  return done_locked(static_cast<Event*>(event));
}

void CpuEventBackend::synchronize(NativeEvent event) {
  auto* e = static_cast<Event*>(event);
  std::unique_lock<std::mutex> lock(mutex_);
  ++calls_;
  changed_.wait(lock, [&] { return done_locked(e); });
}

void CpuEventBackend::stream_wait(int, Stream stream, NativeEvent event) {
  auto* e = static_cast<Event*>(event);
  std::lock_guard<std::mutex> lock(mutex_);
  ++calls_;
  if (done_locked(e)) return;
  streams_[stream].waits.emplace_back(e->stream, e->ticket);
}

float CpuEventBackend::elapsed_ms(NativeEvent start, NativeEvent end) {
  auto* a = static_cast<Event*>(start);
  auto* b = static_cast<Event*>(end);
  std::lock_guard<std::mutex> lock(mutex_);
  ++calls_;
  if (!a->options.enable_timing || !b->options.enable_timing)
    throw std::invalid_argument("elapsed_ms needs events created with enable_timing=True");
  if (!a->done || !b->done) throw std::invalid_argument("elapsed_ms: an event has not completed yet");
  return std::chrono::duration<float, std::milli>(b->done_at - a->done_at).count();
}

void CpuEventBackend::destroy(NativeEvent event) noexcept {
  auto* e = static_cast<Event*>(event);
  std::lock_guard<std::mutex> lock(mutex_);
  ++calls_;
  --live_;
  watching_.erase(std::remove(watching_.begin(), watching_.end(), e), watching_.end());
  delete e;
}

std::uint64_t CpuEventBackend::native_calls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_;
}

void CpuEventBackend::hold(Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  StreamState& s = streams_[stream];
  s.held = true;
  s.limit = s.completed;
}

void CpuEventBackend::step(Stream stream, std::uint64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  StreamState& s = streams_[stream];
  s.limit = std::min(s.submitted, s.completed + n);
  advance_locked();
}

void CpuEventBackend::release(Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  StreamState& s = streams_[stream];
  s.held = false;
  s.limit = UINT64_MAX;
  advance_locked();
}

std::uint64_t CpuEventBackend::outstanding(Stream stream) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = streams_.find(stream);
  return it == streams_.end() ? 0 : it->second.submitted - it->second.completed;
}

std::uint64_t CpuEventBackend::live_events() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_;
}

namespace {
const Registrar registrar({"cpu", 0, nullptr, [] { return std::static_pointer_cast<EventBackend>(CpuEventBackend::instance()); }, nullptr});
}  // namespace

}  // namespace paddle_ext::runtime
