#include "core/chunk_index.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <stdexcept>

namespace paddle_ext::runtime {
namespace {

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

char state_letter(BlockState s) {
  switch (s) {
    case BlockState::kFree: return 'F';
    case BlockState::kAllocated: return 'A';
    case BlockState::kPending: return 'P';
  }
  return '?';
}

[[noreturn]] void broken(const Chunk* c, const Block* b, const std::string& what) {
  char where[96];
  std::snprintf(where, sizeof(where), "chunk %llu, block @%p: ", static_cast<unsigned long long>(c->id),
                static_cast<const void*>(b != nullptr ? b->ptr : nullptr));
  throw std::logic_error(std::string("allocator invariant broken in ") + where + what);
}

}  // namespace

ChunkIndex::~ChunkIndex() { remove_all(); }

void ChunkIndex::index(Block* b) { index_of(b).emplace(key(b), b); }

void ChunkIndex::unindex(Block* b) { index_of(b).erase(key(b)); }

Block* ChunkIndex::add_chunk(void* raw, std::size_t raw_size, bool dedicated) {
  const std::uintptr_t start = (addr(raw) + alignment_ - 1) & ~(alignment_ - 1);
  const std::size_t usable = (raw_size - (start - addr(raw))) & ~(alignment_ - 1);
  auto* chunk = new Chunk{next_id_++, raw, raw_size, reinterpret_cast<char*>(start), usable, nullptr, dedicated};
  auto* block = new Block();
  block->ptr = chunk->start;
  block->size = usable;
  block->chunk = chunk;
  chunk->head = block;
  chunks_.emplace(start, chunk);
  reserved_ += raw_size;
  index(block);
  return block;
}

Block* ChunkIndex::best_fit(std::size_t size, std::size_t max_dedicated_waste) const {
  auto it = free_.lower_bound({size, 0});
  Block* shared = it == free_.end() ? nullptr : it->second;
  // Only the smallest dedicated block can qualify: larger ones waste more.
  auto dt = free_dedicated_.lower_bound({size, 0});
  Block* dedicated = dt == free_dedicated_.end() || dt->first.first - size > max_dedicated_waste ? nullptr : dt->second;
  if (shared == nullptr) return dedicated;
  if (dedicated == nullptr) return shared;
  return key(dedicated) < key(shared) ? dedicated : shared;
}

Block* ChunkIndex::take(Block* b, std::size_t size, std::size_t requested) {
  unindex(b);
  if (b->size > size && !b->chunk->dedicated) {
    // Keep the low addresses for the caller: a chunk then fills from its
    // start, which leaves the tail in one piece for the next large request.
    auto* rest = new Block();
    rest->ptr = b->ptr + size;
    rest->size = b->size - size;
    rest->chunk = b->chunk;
    rest->prev = b;
    rest->next = b->next;
    if (b->next != nullptr) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    index(rest);
  }
  b->state = BlockState::kAllocated;
  b->requested = requested;
  return b;
}

void ChunkIndex::hold(Block* b) { b->state = BlockState::kPending; }

Block* ChunkIndex::give_back(Block* b) {
  b->state = BlockState::kFree;
  b->requested = 0;
  if (Block* p = b->prev; p != nullptr && p->state == BlockState::kFree) {
    unindex(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next != nullptr) b->next->prev = p;
    delete b;
    b = p;
  }
  if (Block* n = b->next; n != nullptr && n->state == BlockState::kFree) {
    unindex(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    delete n;
  }
  index(b);
  return b;
}

bool ChunkIndex::idle(const Chunk* c) { return c->head->state == BlockState::kFree && c->head->next == nullptr; }

ReleasedChunk ChunkIndex::remove(Chunk* c) {
  unindex(c->head);
  delete c->head;
  chunks_.erase(addr(c->start));
  reserved_ -= c->raw_size;
  const ReleasedChunk out{c->raw, c->raw_size};
  delete c;
  return out;
}

std::vector<ReleasedChunk> ChunkIndex::remove_idle(std::size_t bytes) {
  std::vector<Chunk*> idle_chunks;
  for (auto& [start, c] : chunks_)
    if (idle(c)) idle_chunks.push_back(c);
  // Stable: among equal sizes the lower address goes first (chunks_ is address-ordered).
  std::stable_sort(idle_chunks.begin(), idle_chunks.end(),
            [](const Chunk* a, const Chunk* b) { return a->raw_size > b->raw_size; });
  std::vector<ReleasedChunk> out;
  std::size_t taken = 0;
  for (Chunk* c : idle_chunks) {
    if (taken >= bytes) break;
    taken += c->raw_size;
    out.push_back(remove(c));
  }
  return out;
}

std::vector<ReleasedChunk> ChunkIndex::remove_all() {
  std::vector<ReleasedChunk> out;
  for (auto& [start, c] : chunks_) {
    for (Block* b = c->head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
    out.push_back({c->raw, c->raw_size});
    delete c;
  }
  chunks_.clear();
  free_.clear();
  free_dedicated_.clear();
  reserved_ = 0;
  return out;
}

void ChunkIndex::check() const {
  std::size_t free_seen = 0, reserved = 0;
  for (const auto& [start, c] : chunks_) {
    reserved += c->raw_size;
    if (addr(c->start) != start) broken(c, nullptr, "chunk keyed under a different address");
    if (addr(c->start) % alignment_ != 0 || c->size % alignment_ != 0) broken(c, nullptr, "chunk not aligned");
    if (c->start < static_cast<char*>(c->raw) || c->start + c->size > static_cast<char*>(c->raw) + c->raw_size)
      broken(c, nullptr, "usable range outside the backend allocation");
    if (c->head == nullptr || c->head->prev != nullptr || c->head->ptr != c->start)
      broken(c, c->head, "first block does not start the chunk");
    std::size_t sum = 0;
    for (const Block* b = c->head; b != nullptr; b = b->next) {
      if (b->chunk != c) broken(c, b, "block points to another chunk");
      if (b->size == 0 || b->size % alignment_ != 0 || addr(b->ptr) % alignment_ != 0)
        broken(c, b, "block size or address not aligned (size " + std::to_string(b->size) + ")");
      if (b->ptr != c->start + sum) broken(c, b, "blocks do not tile the chunk");
      if (b->next != nullptr && b->next->prev != b) broken(c, b, "broken neighbour links");
      if (c->dedicated && (b != c->head || b->next != nullptr)) broken(c, b, "a dedicated chunk was split");
      if (b->state == BlockState::kFree) {
        ++free_seen;
        if (b->next != nullptr && b->next->state == BlockState::kFree) broken(c, b, "two adjacent free blocks");
        const auto& idx = c->dedicated ? free_dedicated_ : free_;
        auto it = idx.find(key(b));
        if (it == idx.end() || it->second != b) broken(c, b, "free block missing from the index");
      } else if (b->state == BlockState::kAllocated && b->requested > b->size) {
        broken(c, b, "requested bytes exceed the block");
      }
      sum += b->size;
    }
    if (sum != c->size)
      broken(c, nullptr, "block sizes sum to " + std::to_string(sum) + ", chunk has " + std::to_string(c->size));
  }
  if (free_seen != free_blocks())
    throw std::logic_error("allocator invariant broken: index holds " + std::to_string(free_blocks()) +
                           " free blocks, chunks hold " + std::to_string(free_seen));
  if (reserved != reserved_) throw std::logic_error("allocator invariant broken: reserved bytes out of step");
}

std::string ChunkIndex::dump(std::size_t max_blocks) const {
  std::ostringstream out;
  for (const auto& [start, c] : chunks_) {
    out << "  chunk " << c->id << " @" << static_cast<const void*>(c->start) << " " << c->size << " B (raw "
        << c->raw_size << (c->dedicated ? ", dedicated" : "") << "):";
    std::size_t shown = 0, hidden = 0;
    for (const Block* b = c->head; b != nullptr; b = b->next) {
      if (shown++ < max_blocks)
        out << ' ' << state_letter(b->state) << b->size;
      else
        ++hidden;
    }
    if (hidden != 0) out << " ... " << hidden << " more";
    out << '\n';
  }
  return out.str();
}

std::vector<std::tuple<std::uint64_t, std::uintptr_t, std::size_t, BlockState>> ChunkIndex::blocks() const {
  std::vector<std::tuple<std::uint64_t, std::uintptr_t, std::size_t, BlockState>> out;
  for (const auto& [start, c] : chunks_)
    for (const Block* b = c->head; b != nullptr; b = b->next) out.emplace_back(c->id, addr(b->ptr), b->size, b->state);
  return out;
}

}  // namespace paddle_ext::runtime
