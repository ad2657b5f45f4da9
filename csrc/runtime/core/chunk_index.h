// The pool's bookkeeping, with no locking and no backend calls: chunks (one
// per backend allocation), each cut into an address-ordered list of blocks,
// and an index of the free blocks by (size, address) for best fit. The
// allocator (auto_growth_allocator.h) owns one and guards it with its lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/backend.h"

namespace paddle_ext::runtime {

enum class BlockState : std::uint8_t {
  kFree,       // in the free index
  kAllocated,  // handed out
  kPending,    // freed by the caller, waiting for recorded events
};

struct Chunk;

struct Block {
  char* ptr = nullptr;
  std::size_t size = 0;       // a multiple of the alignment
  std::size_t requested = 0;  // the caller's size while allocated
  BlockState state = BlockState::kFree;
  Chunk* chunk = nullptr;
  Block* prev = nullptr;  // address-ordered neighbours inside the chunk
  Block* next = nullptr;
  // (device, event) recorded on streams that read this block.
  std::vector<std::pair<int, NativeEvent>> events;
};

struct Chunk {
  std::uint64_t id = 0;       // creation order, for dumps
  void* raw = nullptr;        // what the backend returned
  std::size_t raw_size = 0;   // what the backend holds (reserved bytes)
  char* start = nullptr;      // raw aligned up to the pool's alignment
  std::size_t size = 0;       // usable bytes from start, a multiple of the alignment
  Block* head = nullptr;
  // Grown for one request above the chunk size: holds a single block, never
  // split, so once free it is idle and can go back to the backend (a large
  // chunk split for smaller requests stays pinned by whatever small block
  // lands in its tail; that was most of the waste on variable-size traces).
  bool dedicated = false;
};

// A chunk taken out of the index, to be given back to the backend.
struct ReleasedChunk {
  void* raw = nullptr;
  std::size_t raw_size = 0;
};

class ChunkIndex {
 public:
  explicit ChunkIndex(std::size_t alignment) : alignment_(alignment) {}
  ~ChunkIndex();
  ChunkIndex(const ChunkIndex&) = delete;
  ChunkIndex& operator=(const ChunkIndex&) = delete;

  // A new chunk over backend memory, as one free block (returned, indexed).
  Block* add_chunk(void* raw, std::size_t raw_size, bool dedicated = false);
  // The smallest free block of at least `size` bytes, lowest address among
  // equals, where a dedicated chunk's block counts only if it exceeds `size`
  // by at most `max_dedicated_waste` bytes; nullptr if none.
  Block* best_fit(std::size_t size, std::size_t max_dedicated_waste = SIZE_MAX) const;
  // Takes `size` bytes from the start of a free block; the rest stays free.
  // A dedicated chunk's block is taken whole.
  Block* take(Block* free_block, std::size_t size, std::size_t requested);
  // Marks an allocated block pending (out of reach until give_back).
  void hold(Block* block);
  // An allocated or pending block becomes free, merged with free neighbours.
  Block* give_back(Block* block);
  static bool idle(const Chunk* chunk);
  // Removes an idle chunk (its single free block included).
  ReleasedChunk remove(Chunk* chunk);
  // Removes idle chunks, largest first (lowest address among equals), until
  // at least `bytes` of reserved memory were taken out or none are left.
  std::vector<ReleasedChunk> remove_idle(std::size_t bytes);
  // Removes every chunk, whatever its blocks hold (the allocator's teardown).
  std::vector<ReleasedChunk> remove_all();

  std::size_t chunks() const { return chunks_.size(); }
  std::size_t free_blocks() const { return free_.size() + free_dedicated_.size(); }
  std::size_t largest_free() const {
    return std::max(free_.empty() ? 0 : free_.rbegin()->first.first,
                    free_dedicated_.empty() ? 0 : free_dedicated_.rbegin()->first.first);
  }
  std::size_t reserved() const { return reserved_; }

  // Throws std::logic_error naming the first broken invariant: blocks tile
  // each chunk, no two adjacent free blocks, the index holds exactly the free
  // blocks, everything aligned.
  void check() const;
  // One line per chunk: "chunk 3 @0x... 2097152 B (raw 2101248): A4096 F2093056".
  std::string dump(std::size_t max_blocks_per_chunk = 64) const;
  // (chunk id, ptr, size, state) of every block in address order per chunk.
  std::vector<std::tuple<std::uint64_t, std::uintptr_t, std::size_t, BlockState>> blocks() const;

 private:
  using Key = std::pair<std::size_t, std::uintptr_t>;
  static Key key(const Block* b) { return {b->size, reinterpret_cast<std::uintptr_t>(b->ptr)}; }
  void index(Block* b);
  void unindex(Block* b);
  std::map<Key, Block*>& index_of(const Block* b) { return b->chunk->dedicated ? free_dedicated_ : free_; }

  std::size_t alignment_;
  std::map<Key, Block*> free_;            // blocks of shared chunks: split on allocation
  std::map<Key, Block*> free_dedicated_;  // idle dedicated chunks: taken whole
  std::map<std::uintptr_t, Chunk*> chunks_;  // by start address
  std::size_t reserved_ = 0;
  std::uint64_t next_id_ = 0;
};

}  // namespace paddle_ext::runtime
