#include "core/auto_growth_allocator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <stdexcept>
#include <utility>

#include "core/error.h"

namespace paddle_ext::runtime {
namespace {

using Clock = std::chrono::steady_clock;

std::int64_t ns_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
}

std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

void bump_peak(std::int64_t value, std::int64_t& peak) { peak = std::max(peak, value); }

}  // namespace

AutoGrowthAllocator::AutoGrowthAllocator(std::shared_ptr<HostBackend> backend, AllocatorOptions options)
    : backend_(std::move(backend)),
      events_(backend_ ? backend_->events() : nullptr),
      options_((validate(options), options)),
      debug_(options.debug),
      index_(options.alignment) {
  if (!backend_) throw std::invalid_argument("backend must not be null");
  if (!events_) throw std::invalid_argument(std::string("backend '") + backend_->name() + "' has no event backend");
}

AutoGrowthAllocator::~AutoGrowthAllocator() {
  // No other thread can use the pool any more, so the lock is not needed;
  // streams may still read pending (and live) blocks, so wait for them before
  // the memory goes back. Errors are swallowed: a destructor cannot report.
  const auto wait_and_destroy = [this](std::vector<std::pair<int, NativeEvent>>& evs) {
    for (auto& [device, ev] : evs) {
      try {
        events_->synchronize(ev);
      } catch (...) {
      }
      events_->destroy(ev);
    }
    evs.clear();
  };
  for (Block* b : pending_) wait_and_destroy(b->events);
  for (auto& [ptr, b] : live_) wait_and_destroy(b->events);
  for (auto& [device, evs] : spare_events_)
    for (NativeEvent ev : evs) events_->destroy(ev);
  for (const ReleasedChunk& c : index_.remove_all()) {
    try {
      backend_->deallocate(c.raw, c.raw_size);
    } catch (...) {
    }
  }
}

std::size_t AutoGrowthAllocator::raw_size_for(std::size_t size) const {
  // Backend pointers are aligned to base_alignment(); a larger pool alignment
  // needs room to move the chunk start up.
  const std::size_t base = backend_->base_alignment();
  const std::size_t pad = options_.alignment > base ? options_.alignment - base : 0;
  return round_up(size + pad, std::max<std::size_t>(backend_->granularity(), 1));
}

std::size_t AutoGrowthAllocator::max_reuse_waste(std::size_t size) const {
  return static_cast<std::size_t>(static_cast<double>(size) * options_.reuse_waste);
}

Block* AutoGrowthAllocator::take_locked(Block* free_block, std::size_t size, std::size_t requested) {
  Block* b = index_.take(free_block, size, requested);
  live_.emplace(b->ptr, b);
  stats_.allocated_bytes += static_cast<std::int64_t>(b->size);
  stats_.requested_bytes += static_cast<std::int64_t>(requested);
  bump_peak(stats_.allocated_bytes, stats_.peak_allocated_bytes);
  bump_peak(stats_.requested_bytes, stats_.peak_requested_bytes);
  ++stats_.allocations;
  return b;
}

void* AutoGrowthAllocator::allocate(std::size_t nbytes) {
  if (nbytes > kMaxRequest)
    throw std::invalid_argument("nbytes must be in [0, " + std::to_string(kMaxRequest) + "], got " +
                                std::to_string(nbytes));
  const std::size_t size = round_up(std::max<std::size_t>(nbytes, 1), options_.alignment);
  if (pending_count_.load(std::memory_order_relaxed) != 0) poll_events();
  DebugFlags flags;
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    flags = debug_;
    if (Block* b = index_.best_fit(size, max_reuse_waste(size))) {
      ptr = take_locked(b, size, nbytes)->ptr;
      ++stats_.cache_hits;
    }
  }
  if (ptr == nullptr) ptr = grow(size, nbytes, flags);
  // The caller owns the block now: filling and syncing need no lock.
  if (flags.fill_value >= 0) std::memset(ptr, flags.fill_value, nbytes);
  if (flags.sync_after_alloc) {
    backend_->synchronize();
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.syncs;
  }
  return ptr;
}

void* AutoGrowthAllocator::backend_allocate(std::size_t raw_size) {
  const auto start = Clock::now();
  void* mem = nullptr;
  std::exception_ptr failure;
  try {
    mem = backend_->allocate(raw_size);
  } catch (...) {
    failure = std::current_exception();
  }
  const std::int64_t spent = ns_since(start);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.backend_allocs;
    stats_.backend_alloc_ns += spent;
    if (failure) ++stats_.backend_alloc_failures;
  }
  if (failure) std::rethrow_exception(failure);
  return mem;
}

void* AutoGrowthAllocator::grow(std::size_t size, std::size_t requested, const DebugFlags& flags) {
  std::size_t raw = raw_size_for(std::max(size, options_.chunk_size));
  if (options_.trim_on_growth) {
    // None of the idle chunks could serve this request (best fit failed), so
    // growing past the peak would only add to memory nobody uses now.
    std::vector<ReleasedChunk> trimmed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto peak = static_cast<std::size_t>(stats_.peak_reserved_bytes);
      if (index_.reserved() + raw > peak) trimmed = index_.remove_idle(index_.reserved() + raw - peak);
      stats_.idle_chunks_released += static_cast<std::int64_t>(trimmed.size());
      stats_.trims += trimmed.empty() ? 0 : 1;
    }
    release(trimmed);
  }
  void* mem = nullptr;
  std::optional<OutOfMemory> last;
  const auto attempt = [&](std::size_t bytes) {
    try {
      mem = backend_allocate(bytes);
      raw = bytes;
      return true;
    } catch (const OutOfMemory& e) {
      last.emplace(e);
      return false;
    }
  };
  std::size_t released = 0;
  if (!attempt(raw)) {
    // Idle chunks may be exactly what the backend lacks: give them back,
    // then retry, finally with the bare request instead of a whole chunk.
    std::vector<ReleasedChunk> idle;
    std::string report;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      idle = index_.remove_idle(SIZE_MAX);
      released = idle.size();
      ++stats_.oom_retries;
      stats_.idle_chunks_released += static_cast<std::int64_t>(released);
      if (flags.dump_chunks)
        report = std::string("paddle_ext pinned pool [") + backend_->name() + "]: out of memory growing by " +
                 std::to_string(raw) + " B; releasing " + std::to_string(released) + " idle chunks and retrying\n" +
                 index_.dump();
    }
    if (!report.empty()) emit(report);
    release(idle);
    const std::size_t bare = raw_size_for(size);
    if (!attempt(raw) && !(bare < raw && attempt(bare))) {
      std::string context;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        context = std::string("pinned pool [") + backend_->name() + "] could not grow by " + std::to_string(raw) +
                  " B for a request of " + std::to_string(requested) + " B after releasing " +
                  std::to_string(released) + " idle chunks; " + account_locked();
        if (flags.dump_chunks) report = "paddle_ext " + context + "\n" + index_.dump();
      }
      if (flags.dump_chunks) emit(report);
      throw OutOfMemory(*last, context);
    }
  }
  void* ptr = nullptr;
  std::string report;
  std::vector<ReleasedChunk> over;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Block* fresh = index_.add_chunk(mem, raw, size > options_.chunk_size);
    ++stats_.growths;
    bump_peak(static_cast<std::int64_t>(index_.reserved()), stats_.peak_reserved_bytes);
    ptr = take_locked(fresh, size, requested)->ptr;
    over = over_cap_locked();
    if (flags.dump_chunks)
      report = std::string("paddle_ext pinned pool [") + backend_->name() + "]: grew by " + std::to_string(raw) +
               " B for a request of " + std::to_string(requested) + " B; " + account_locked() + "\n" + index_.dump();
  }
  if (!report.empty()) emit(report);
  release(over);
  return ptr;
}

void AutoGrowthAllocator::release(const std::vector<ReleasedChunk>& chunks) {
  std::exception_ptr first;
  for (const ReleasedChunk& c : chunks) {
    const auto start = Clock::now();
    try {
      backend_->deallocate(c.raw, c.raw_size);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    const std::int64_t spent = ns_since(start);
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.backend_frees;
    stats_.backend_free_ns += spent;
  }
  if (first) std::rethrow_exception(first);
}

std::vector<ReleasedChunk> AutoGrowthAllocator::over_cap_locked() {
  if (options_.max_cached_bytes == SIZE_MAX) return {};
  const std::size_t reserved = index_.reserved();
  const auto allocated = static_cast<std::size_t>(stats_.allocated_bytes);
  if (reserved - allocated <= options_.max_cached_bytes) return {};
  auto out = index_.remove_idle(reserved - allocated - options_.max_cached_bytes);
  stats_.idle_chunks_released += static_cast<std::int64_t>(out.size());
  return out;
}

void AutoGrowthAllocator::free(void* ptr) {
  std::vector<ReleasedChunk> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end())
      throw std::invalid_argument("free: pointer " + hex(ptr) +
                                  " is not a live block of this pool (never allocated here, or already freed)");
    Block* b = it->second;
    live_.erase(it);
    stats_.allocated_bytes -= static_cast<std::int64_t>(b->size);
    stats_.requested_bytes -= static_cast<std::int64_t>(b->requested);
    ++stats_.frees;
    if (!b->events.empty()) {
      // A stream may still read it: out of reach until its events complete.
      index_.hold(b);
      pending_.push_back(b);
      stats_.pending_bytes += static_cast<std::int64_t>(b->size);
      ++stats_.pending_blocks;
      pending_count_.store(pending_.size(), std::memory_order_relaxed);
    } else {
      Block* merged = index_.give_back(b);
      if (debug_.free_idle_chunk && ChunkIndex::idle(merged->chunk)) {
        out.push_back(index_.remove(merged->chunk));
        ++stats_.idle_chunks_released;
      }
    }
    auto over = over_cap_locked();
    out.insert(out.end(), over.begin(), over.end());
  }
  release(out);
}

bool AutoGrowthAllocator::record_event(void* ptr, Stream stream, int device) {
  NativeEvent ev = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (live_.find(ptr) == live_.end()) return false;
    auto& spare = spare_events_[device];
    if (!spare.empty()) {
      ev = spare.back();
      spare.pop_back();
    }
  }
  // Creating and recording are runtime calls: outside the lock.
  try {
    if (ev == nullptr) ev = events_->create(device, EventOptions{});
    events_->record(ev, device, stream);
  } catch (...) {
    if (ev != nullptr) events_->destroy(ev);
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it != live_.end()) {
      it->second->events.emplace_back(device, ev);
      ++stats_.events_recorded;
      return true;
    }
  }
  events_->destroy(ev);  // freed by another thread meanwhile
  return false;
}

std::vector<NativeEvent> AutoGrowthAllocator::keep_spares_locked(
    const std::vector<std::pair<int, NativeEvent>>& events) {
  std::vector<NativeEvent> extra;
  for (const auto& [device, ev] : events) {
    auto& spare = spare_events_[device];
    if (spare.size() < options_.spare_events)
      spare.push_back(ev);
    else
      extra.push_back(ev);
  }
  return extra;
}

std::size_t AutoGrowthAllocator::poll_events() {
  std::vector<Block*> batch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    batch.swap(pending_);
  }
  if (batch.empty()) return 0;
  // Pending blocks are reachable from no other path (not live, not free), so
  // their event lists can be read and trimmed without the lock while the
  // queries, which are runtime calls, run.
  std::vector<std::pair<int, NativeEvent>> done;
  std::exception_ptr failure;
  try {
    for (Block* b : batch) {
      auto& evs = b->events;
      for (std::size_t i = 0; i < evs.size();) {
        if (events_->query(evs[i].second)) {
          done.push_back(evs[i]);
          evs[i] = evs.back();
          evs.pop_back();
        } else {
          ++i;
        }
      }
    }
  } catch (...) {
    failure = std::current_exception();
  }
  std::size_t returned = 0;
  std::vector<ReleasedChunk> out;
  std::vector<NativeEvent> extra;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Block* b : batch) {
      if (!b->events.empty()) {
        pending_.push_back(b);
        continue;
      }
      stats_.pending_bytes -= static_cast<std::int64_t>(b->size);
      --stats_.pending_blocks;
      ++returned;
      Block* merged = index_.give_back(b);
      if (debug_.free_idle_chunk && ChunkIndex::idle(merged->chunk)) {
        out.push_back(index_.remove(merged->chunk));
        ++stats_.idle_chunks_released;
      }
    }
    pending_count_.store(pending_.size(), std::memory_order_relaxed);
    stats_.events_completed += static_cast<std::int64_t>(done.size());
    extra = keep_spares_locked(done);
    auto over = over_cap_locked();
    out.insert(out.end(), over.begin(), over.end());
  }
  for (NativeEvent ev : extra) events_->destroy(ev);
  release(out);
  if (failure) std::rethrow_exception(failure);
  return returned;
}

void AutoGrowthAllocator::empty_cache() {
  poll_events();
  std::vector<ReleasedChunk> out;
  std::vector<NativeEvent> spares;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    out = index_.remove_idle(SIZE_MAX);
    stats_.idle_chunks_released += static_cast<std::int64_t>(out.size());
    for (auto& [device, evs] : spare_events_) spares.insert(spares.end(), evs.begin(), evs.end());
    spare_events_.clear();
  }
  for (NativeEvent ev : spares) events_->destroy(ev);
  release(out);
}

void AutoGrowthAllocator::set_debug_flags(const DebugFlags& flags) {
  AllocatorOptions probe = options_;
  probe.debug = flags;
  validate(probe);
  std::lock_guard<std::mutex> lock(mutex_);
  debug_ = flags;
}

DebugFlags AutoGrowthAllocator::debug_flags() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return debug_;
}

AllocatorStats AutoGrowthAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  AllocatorStats s = stats_;
  s.reserved_bytes = static_cast<std::int64_t>(index_.reserved());
  s.allocated_blocks = static_cast<std::int64_t>(live_.size());
  s.free_blocks = static_cast<std::int64_t>(index_.free_blocks());
  s.largest_free_block = static_cast<std::int64_t>(index_.largest_free());
  s.chunks = static_cast<std::int64_t>(index_.chunks());
  return s;
}

std::string AutoGrowthAllocator::account_locked() const {
  return "reserved " + std::to_string(index_.reserved()) + " B in " + std::to_string(index_.chunks()) +
         " chunks, allocated " + std::to_string(stats_.allocated_bytes) + " B in " + std::to_string(live_.size()) +
         " blocks, pending " + std::to_string(stats_.pending_bytes) + " B, largest free block " +
         std::to_string(index_.largest_free()) + " B";
}

std::string AutoGrowthAllocator::dump() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::string("paddle_ext pinned pool [") + backend_->name() + "]: " + account_locked() + "\n" +
         index_.dump();
}

void AutoGrowthAllocator::emit(const std::string& text) const {
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
}

void AutoGrowthAllocator::check_invariants() const {
  std::lock_guard<std::mutex> lock(mutex_);
  index_.check();
  std::int64_t allocated = 0;
  for (const auto& [ptr, b] : live_) {
    if (b->state != BlockState::kAllocated || b->ptr != ptr)
      throw std::logic_error("allocator invariant broken: live map entry " + hex(ptr) + " is not an allocated block");
    allocated += static_cast<std::int64_t>(b->size);
  }
  if (allocated != stats_.allocated_bytes)
    throw std::logic_error("allocator invariant broken: live blocks hold " + std::to_string(allocated) +
                           " B, stats say " + std::to_string(stats_.allocated_bytes));
  std::size_t allocated_seen = 0, pending_seen = 0;
  for (const auto& [chunk, ptr, size, state] : index_.blocks()) {
    if (state == BlockState::kAllocated) ++allocated_seen;
    if (state == BlockState::kPending) ++pending_seen;
  }
  if (allocated_seen != live_.size())
    throw std::logic_error("allocator invariant broken: " + std::to_string(allocated_seen) +
                           " allocated blocks in chunks, " + std::to_string(live_.size()) + " in the live map");
  if (static_cast<std::int64_t>(pending_seen) != stats_.pending_blocks)
    throw std::logic_error("allocator invariant broken: pending block count out of step");
}

std::size_t AutoGrowthAllocator::block_size(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(const_cast<void*>(ptr));
  return it == live_.end() ? 0 : it->second->size;
}

std::vector<std::tuple<std::uint64_t, std::uintptr_t, std::size_t, BlockState>> AutoGrowthAllocator::blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return index_.blocks();
}

}  // namespace paddle_ext::runtime
