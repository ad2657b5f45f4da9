// A CPU implementation of gpu/warp_mma.cuh's primitives, so that the
// tensor-core kernels (gpu/flash_attn_tc_kernels.cuh) run, unchanged, where no
// GPU is: include this, then the kernels header.
//
// A block's threads are coroutines (ucontext) on one OS thread. A thread runs
// until it reaches a collective (mma, ldmatrix, shuffle: its warp's 32 lanes)
// or the block barrier (all the block's live threads), where it yields; the
// scheduler resumes it when every participant has arrived. Inputs of a
// collective go into per-warp slots (two sets, alternating, so a fast lane
// writing the next collective's inputs never overwrites ones a slow lane still
// reads); the first lane resumed computes every lane's result.
//
// What it checks besides the arithmetic (each a std::abort with a message):
// collectives reached in a different order by a warp's lanes, a deadlock,
// ldmatrix / cp.async addresses that are not 16-byte aligned or leave the
// block's dynamic shared memory, and it makes missing cp.async waits show:
// a copy lands only when a cp_async_wait covers its group, and shared memory
// starts as NaN (0xFF bytes) in every block; and shared-memory races between
// warps (a missing block barrier; see Shadow).
//
// Semantics are the PTX ISA's (see the layouts in gpu/warp_mma.cuh); products
// are summed in float in k order, where the hardware's order is unspecified.
#pragma once

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "common/half.h"

#define PE_TC_DEVICE inline
#define PE_TC_KERNEL
#define PE_TC_UNROLL
#define PE_TC_TARGET on_cpu_emulator  // the kernels' inline namespace (gpu/flash_attn_tc_kernels.cuh)

namespace paddle_ext::flash_attn::tc {

namespace emu {

constexpr int kMaxThreads = 128;
constexpr size_t kStackBytes = 256 * 1024;

[[noreturn]] inline void fail(const char* what, int thread) {
  std::fprintf(stderr, "warp_emulator: %s (thread %d)\n", what, thread);
  std::abort();
}

enum class Wait { kNone, kWarp, kBlock, kDone };

struct Copy {
  void* dst;
  const void* src;
  bool valid;
};

struct Lane {
  ucontext_t context;
  Wait wait = Wait::kNone;
  int64_t warp_ops = 0;   // collectives this lane has arrived at
  int64_t barriers = 0;   // block barriers this lane has arrived at
  int op_kind = 0;        // of the collective it waits at (checked across the warp)
  std::vector<std::vector<Copy>> groups;  // committed cp.async groups, oldest first
  std::vector<Copy> open;                 // issued, not yet committed
};

// One collective's inputs from each lane, and its results for each lane.
struct Slots {
  uint32_t in[32][10];
  const void* addr[32];
  uint32_t out[32][4];
  int64_t checked = -1;  // the warp op index the first lane resumed has checked (and computed)
};

// What a 4-byte word of shared memory last saw, for the hazard check: a
// barrier epoch is the number of block barriers a thread has passed, and two
// warps' accesses in one epoch are unordered. A read of a word another warp
// wrote (or has a cp.async in flight to) in the same epoch, a write of a word
// another warp read or wrote in it, and a cp.async issued over such a read are
// races (compute-sanitizer's racecheck on a GPU). Tracked: ldmatrix reads,
// cp.async writes (issued, then landed at the wait), st_shared_u32 / _f32 and
// ld_shared_f32: the kernels touch shared memory through nothing else.
struct Shadow {
  int64_t write_epoch = -1, read_epoch = -1;
  int8_t write_warp = -1, pending_warp = -1;
  uint8_t read_warps = 0;  // warps that read it in read_epoch
};

struct Block {
  int threads = 0;
  int64_t x = 0, y = 0, z = 0;
  std::vector<char> smem;
  std::vector<Shadow> shadow;  // one per 4-byte word of smem
  Lane lanes[kMaxThreads];
  Slots slots[kMaxThreads / 32][2];
  ucontext_t scheduler;
  int current = 0;
};

inline Block*& block() {
  static Block* b = nullptr;
  return b;
}
inline Lane& me() { return block()->lanes[block()->current]; }
inline int lane_id() { return block()->current % 32; }
inline int warp_id() { return block()->current / 32; }

inline void yield(Wait w) {
  Lane& l = me();
  l.wait = w;
  swapcontext(&l.context, &block()->scheduler);
}

// A collective of kind `kind`: this lane's inputs in[0..n), its address; then
// waits for the warp and returns the slot set holding everyone's inputs. The
// first lane resumed checks that all 32 arrived at the same kind of
// collective and sets *first (it computes results that `out` carries).
inline Slots& arrive(int kind, const uint32_t* in, int n, const void* addr, bool* first = nullptr) {
  Lane& l = me();
  const int64_t op = l.warp_ops;
  Slots& s = block()->slots[warp_id()][op % 2];
  for (int i = 0; i < n; ++i) s.in[lane_id()][i] = in[i];
  s.addr[lane_id()] = addr;
  l.op_kind = kind;
  ++l.warp_ops;
  yield(Wait::kWarp);
  const bool is_first = s.checked != op;
  if (is_first) {
    for (int j = 0; j < 32; ++j)
      if (block()->lanes[warp_id() * 32 + j].op_kind != kind) fail("a warp's lanes reached different collectives", block()->current);
    s.checked = op;
  }
  if (first != nullptr) *first = is_first;
  return s;
}

inline float half_value(uint32_t bits16, bool bf16) {
  const uint16_t h = static_cast<uint16_t>(bits16);
  return bf16 ? bf16_to_float(h) : fp16_to_float(h);
}

inline void check_smem(const void* p, int thread, const char* what) {
  const char* c = static_cast<const char*>(p);
  const std::vector<char>& smem = block()->smem;
  if (c < smem.data() || c + 16 > smem.data() + smem.size()) fail(what, thread);
  if ((c - smem.data()) % 16 != 0) fail(what, thread);
}

inline void race(const char* what) { fail(what, block()->current); }

inline Shadow* shadow_of(const void* p) {
  return &block()->shadow[static_cast<size_t>(static_cast<const char*>(p) - block()->smem.data()) / 4];
}

// Before this thread reads / writes `bytes` of shared memory at p.
inline void note_read(const void* p, int bytes) {
  const int warp = warp_id();
  const int64_t epoch = me().barriers;
  Shadow* w = shadow_of(p);
  for (int i = 0; i < bytes / 4; ++i, ++w) {
    if (w->write_epoch == epoch && w->write_warp != warp) race("shared-memory race: read of another warp's write with no barrier between");
    if (w->pending_warp >= 0 && w->pending_warp != warp) race("shared-memory race: read of a word another warp's cp.async is still writing");
    if (w->read_epoch != epoch) w->read_epoch = epoch, w->read_warps = 0;
    w->read_warps |= static_cast<uint8_t>(1u << warp);
  }
}
inline void check_unread(Shadow* w, int warp, int64_t epoch) {
  if (w->read_epoch == epoch && (w->read_warps & ~(1u << warp)) != 0) race("shared-memory race: write over another warp's read with no barrier between");
}
inline void note_write(const void* p, int bytes) {
  const int warp = warp_id();
  const int64_t epoch = me().barriers;
  Shadow* w = shadow_of(p);
  for (int i = 0; i < bytes / 4; ++i, ++w) {
    check_unread(w, warp, epoch);
    if (w->write_epoch == epoch && w->write_warp != warp) race("shared-memory race: two warps write one word with no barrier between");
    w->write_epoch = epoch, w->write_warp = static_cast<int8_t>(warp), w->pending_warp = -1;
  }
}

inline void run_copies(std::vector<Copy>& group) {
  for (const Copy& c : group) {
    note_write(c.dst, 16);
    if (c.valid) {
      std::memcpy(c.dst, c.src, 16);
    } else {
      std::memset(c.dst, 0, 16);
    }
  }
  group.clear();
}

// The kernel body of the block being run (set by launch()).
inline void (*&body())(void*) {
  static void (*f)(void*) = nullptr;
  return f;
}
inline void*& body_arg() {
  static void* a = nullptr;
  return a;
}

inline void lane_main() {
  Block* b = block();
  body()(body_arg());
  me().wait = Wait::kDone;
  if (!me().open.empty()) fail("cp.async issued and never committed and waited for", b->current);
  swapcontext(&me().context, &b->scheduler);
}


inline bool runnable(const Block& b, int i) {
  const Lane& l = b.lanes[i];
  switch (l.wait) {
    case Wait::kNone:
      return true;
    case Wait::kDone:
      return false;
    case Wait::kWarp: {
      const int w0 = (i / 32) * 32;
      for (int j = w0; j < w0 + 32 && j < b.threads; ++j) {
        const Lane& o = b.lanes[j];
        if (o.warp_ops >= l.warp_ops) continue;
        if (o.wait == Wait::kDone) fail("a lane left before a collective its warp waits at", i);
        return false;
      }
      return true;
    }
    case Wait::kBlock:
      for (int j = 0; j < b.threads; ++j) {
        const Lane& o = b.lanes[j];
        if (o.wait != Wait::kDone && o.barriers < l.barriers) return false;
      }
      return true;
  }
  return false;
}

}  // namespace emu

// ---- the primitives -------------------------------------------------------------

inline int thread_rank() { return emu::block()->current; }
inline int64_t block_x() { return emu::block()->x; }
inline int64_t block_y() { return emu::block()->y; }
inline int64_t block_z() { return emu::block()->z; }
inline char* dynamic_smem() { return emu::block()->smem.data(); }

inline void block_sync() {
  ++emu::me().barriers;
  emu::yield(emu::Wait::kBlock);
}

inline float shfl_xor(float v, int mask) {
  uint32_t bits = float_to_bits(v);
  const int lane = emu::lane_id();
  emu::Slots& s = emu::arrive(1, &bits, 1, nullptr);
  return bits_to_float(s.in[lane ^ mask][0]);
}

// The lanes run one at a time, switching only at collectives: a plain add is atomic.
inline void atomic_add2(float* p, float a, float b) {
  if (reinterpret_cast<uintptr_t>(p) % 8 != 0) emu::fail("atomic_add2 address not 8-byte aligned", thread_rank());
  p[0] += a;
  p[1] += b;
}

template <bool kBf16>
inline void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  uint32_t in[10] = {a[0], a[1], a[2], a[3], b0, b1};
  for (int i = 0; i < 4; ++i) std::memcpy(&in[6 + i], &d[i], 4);
  const int lane = emu::lane_id();
  bool first = false;
  emu::Slots& s = emu::arrive(kBf16 ? 2 : 3, in, 10, nullptr, &first);
  if (first) {
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      const uint32_t* r = s.in[l];
      for (int e = 0; e < 2; ++e) {
        A[g][2 * t + e] = emu::half_value(r[0] >> (16 * e), kBf16);
        A[g + 8][2 * t + e] = emu::half_value(r[1] >> (16 * e), kBf16);
        A[g][2 * t + 8 + e] = emu::half_value(r[2] >> (16 * e), kBf16);
        A[g + 8][2 * t + 8 + e] = emu::half_value(r[3] >> (16 * e), kBf16);
        B[2 * t + e][g] = emu::half_value(r[4] >> (16 * e), kBf16);
        B[2 * t + 8 + e][g] = emu::half_value(r[5] >> (16 * e), kBf16);
      }
    }
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
        float acc;
        std::memcpy(&acc, &s.in[l][6 + i], 4);
        for (int kk = 0; kk < 16; ++kk) acc += A[row][kk] * B[kk][col];
        std::memcpy(&s.out[l][i], &acc, 4);
      }
    }
  }
  for (int i = 0; i < 4; ++i) std::memcpy(&d[i], &s.out[lane][i], 4);
}

inline float fast_exp2(float x) { return std::exp2(x); }

template <bool kBf16>
inline uint32_t pack2(float lo, float hi) {
  const uint16_t a = kBf16 ? float_to_bf16(lo) : float_to_fp16(lo);
  const uint16_t b = kBf16 ? float_to_bf16(hi) : float_to_fp16(hi);
  return static_cast<uint32_t>(a) | static_cast<uint32_t>(b) << 16;
}

namespace emu {
// ldmatrix .x4: lane (g, t) gets from matrix i the pair (row g, cols 2t, 2t+1),
// or, transposed, (rows 2t, 2t+1, col g); matrix i's rows come from lanes 8i..8i+7.
inline void ldmatrix(uint32_t r[4], const void* row, bool trans) {
  const int lane = lane_id();
  check_smem(row, block()->current, "ldmatrix row address unaligned or outside shared memory");
  note_read(row, 16);
  Slots& s = arrive(trans ? 5 : 4, nullptr, 0, row);
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (!trans) {
      const uint16_t* p = static_cast<const uint16_t*>(s.addr[8 * i + g]);
      lo = p[2 * t];
      hi = p[2 * t + 1];
    } else {
      lo = static_cast<const uint16_t*>(s.addr[8 * i + 2 * t])[g];
      hi = static_cast<const uint16_t*>(s.addr[8 * i + 2 * t + 1])[g];
    }
    r[i] = static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
  }
}
}  // namespace emu

inline void ldmatrix_x4(uint32_t r[4], const void* row) { emu::ldmatrix(r, row, false); }
inline void ldmatrix_x4_trans(uint32_t r[4], const void* row) { emu::ldmatrix(r, row, true); }

inline void cp_async_16(void* dst, const void* src, bool valid) {
  emu::check_smem(dst, thread_rank(), "cp.async destination unaligned or outside shared memory");
  if (valid && reinterpret_cast<uintptr_t>(src) % 16 != 0) emu::fail("cp.async source not 16-byte aligned", thread_rank());
  emu::Shadow* w = emu::shadow_of(dst);
  for (int i = 0; i < 4; ++i, ++w) {
    emu::check_unread(w, emu::warp_id(), emu::me().barriers);
    w->pending_warp = static_cast<int8_t>(emu::warp_id());
  }
  emu::me().open.push_back({dst, src, valid});
}

namespace emu {
inline void check_smem4(const void* p, const char* what) {
  const char* c = static_cast<const char*>(p);
  const std::vector<char>& smem = block()->smem;
  if (c < smem.data() || c + 4 > smem.data() + smem.size() || (c - smem.data()) % 4 != 0) fail(what, block()->current);
}
}  // namespace emu

inline void st_shared_u32(void* p, uint32_t v) {
  emu::check_smem4(p, "shared store unaligned or outside shared memory");
  emu::note_write(p, 4);
  std::memcpy(p, &v, 4);
}
inline void st_shared_f32(float* p, float v) { st_shared_u32(p, float_to_bits(v)); }
inline float ld_shared_f32(const float* p) {
  emu::check_smem4(p, "shared load unaligned or outside shared memory");
  emu::note_read(p, 4);
  return *p;
}

inline void cp_async_commit() {
  emu::Lane& l = emu::me();
  l.groups.push_back(std::move(l.open));
  l.open.clear();
}

template <int kPending>
inline void cp_async_wait() {
  emu::Lane& l = emu::me();
  while (static_cast<int>(l.groups.size()) > kPending) {
    emu::run_copies(l.groups.front());
    l.groups.erase(l.groups.begin());
  }
}

// ---- launching ------------------------------------------------------------------

namespace emu {

// Runs `kernel` (any callable: the kernel with its arguments bound) on every
// block of a gx x gy x gz grid, `threads` threads each, block after block.
template <class Kernel>
void launch(int64_t gx, int64_t gy, int64_t gz, int threads, int smem_bytes, Kernel&& kernel) {
  static std::vector<std::vector<char>> stacks(kMaxThreads, std::vector<char>(kStackBytes));
  if (threads > kMaxThreads || threads % 32 != 0) fail("block size must be a multiple of 32, at most 128", 0);
  using K = std::remove_reference_t<Kernel>;
  body() = [](void* k) { (*static_cast<K*>(k))(); };
  body_arg() = &kernel;
  for (int64_t z = 0; z < gz; ++z)
    for (int64_t y = 0; y < gy; ++y)
      for (int64_t x = 0; x < gx; ++x) {
        auto b = std::make_unique<Block>();
        b->threads = threads;
        b->x = x, b->y = y, b->z = z;
        b->smem.assign(static_cast<size_t>(smem_bytes) + 16, static_cast<char>(0xFF));
        b->shadow.assign(b->smem.size() / 4, Shadow{});
        block() = b.get();
        for (int i = 0; i < threads; ++i) {
          ucontext_t& c = b->lanes[i].context;
          getcontext(&c);
          c.uc_stack.ss_sp = stacks[i].data();
          c.uc_stack.ss_size = kStackBytes;
          c.uc_link = nullptr;
          makecontext(&c, lane_main, 0);
        }
        for (;;) {
          bool progressed = false, all_done = true;
          for (int i = 0; i < threads; ++i) {
            if (b->lanes[i].wait == Wait::kDone) continue;
            all_done = false;
            if (!runnable(*b, i)) continue;
            b->current = i;
            b->lanes[i].wait = Wait::kNone;
            swapcontext(&b->scheduler, &b->lanes[i].context);
            progressed = true;
          }
          if (all_done) break;
          if (!progressed) fail("deadlock: no thread can go on", -1);
        }
        block() = nullptr;
      }
}

}  // namespace emu

}  // namespace paddle_ext::flash_attn::tc

