// The pinned auto-growth best-fit allocator (upstream PaddlePaddle/Paddle
// #57625), over any HostBackend:
//  - best fit over a (size, address) index, blocks of shared chunks split on allocation and
//    merged with free neighbours on free, never across chunks;
//  - growth by max(request, chunk_size); a request above chunk_size gets a
//    dedicated chunk, never split, reused whole by a request it exceeds by at
//    most reuse_waste (options.h); on out-of-memory, idle chunks go
//    back to the backend and the growth is retried (then with the bare
//    request); empty_cache() and the max_cached_bytes cap release idle chunks,
//    and so does a growth that would lift reserved bytes above their peak
//    (trim_on_growth, see options.h);
//  - stream-ordered reuse: record_event(ptr, stream) marks a block as read by
//    a stream; once freed, it returns to the index only after those events
//    complete, polled on allocate and on empty_cache;
//  - the backend is never called while the lock is held, so a slow
//    cudaHostAlloc or mlock of one thread does not stall the others' cache hits
//    (upstream's AutoGrowthBestFitAllocator calls it under its lock).
// Thread-safe; every public method may be called from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/backend.h"
#include "core/chunk_index.h"
#include "core/options.h"
#include "core/stats.h"

namespace paddle_ext::runtime {

class AutoGrowthAllocator {
 public:
  AutoGrowthAllocator(std::shared_ptr<HostBackend> backend, AllocatorOptions options = {});
  // Waits for the events of pending blocks, then gives every chunk back.
  ~AutoGrowthAllocator();
  AutoGrowthAllocator(const AutoGrowthAllocator&) = delete;
  AutoGrowthAllocator& operator=(const AutoGrowthAllocator&) = delete;

  // At least nbytes (0 counts as 1), aligned to options().alignment. Throws
  // OutOfMemory after the free-idle-and-retry path, std::invalid_argument
  // above kMaxRequest.
  void* allocate(std::size_t nbytes);
  // Throws std::invalid_argument for a pointer this pool did not hand out.
  void free(void* ptr);
  // Records an event on `stream` (device < 0: the current device) that the
  // block starting at ptr must wait for once freed. False if ptr is not the
  // start of a live block of this pool.
  bool record_event(void* ptr, Stream stream, int device = -1);
  // Returns the pending blocks whose events completed to the free index;
  // how many blocks were returned.
  std::size_t poll_events();
  // Polls events, then gives every idle chunk and spare event back.
  void empty_cache();

  void set_debug_flags(const DebugFlags& flags);
  DebugFlags debug_flags() const;
  AllocatorStats stats() const;
  std::string dump() const;
  void check_invariants() const;  // throws std::logic_error
  // The block size behind a live pointer, 0 if unknown.
  std::size_t block_size(const void* ptr) const;
  std::vector<std::tuple<std::uint64_t, std::uintptr_t, std::size_t, BlockState>> blocks() const;

  const AllocatorOptions& options() const { return options_; }
  HostBackend& backend() const { return *backend_; }
  EventBackend& events() const { return *events_; }

 private:
  Block* take_locked(Block* free_block, std::size_t size, std::size_t requested);
  void* grow(std::size_t size, std::size_t requested, const DebugFlags& flags);
  void* backend_allocate(std::size_t raw_size);
  void release(const std::vector<ReleasedChunk>& chunks);
  std::vector<ReleasedChunk> over_cap_locked();
  std::vector<NativeEvent> keep_spares_locked(const std::vector<std::pair<int, NativeEvent>>& events);
  std::size_t raw_size_for(std::size_t size) const;
  std::size_t max_reuse_waste(std::size_t size) const;
  std::string account_locked() const;
  void emit(const std::string& text) const;

  const std::shared_ptr<HostBackend> backend_;
  const std::shared_ptr<EventBackend> events_;
  const AllocatorOptions options_;

  mutable std::mutex mutex_;
  DebugFlags debug_;
  ChunkIndex index_;
  std::unordered_map<void*, Block*> live_;
  std::vector<Block*> pending_;
  std::map<int, std::vector<NativeEvent>> spare_events_;
  AllocatorStats stats_;
  // Lets allocate skip the poll without taking the lock when nothing waits.
  std::atomic<std::size_t> pending_count_{0};
};

}  // namespace paddle_ext::runtime
