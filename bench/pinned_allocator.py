"""Pinned pool (paddle_ext.runtime) on mixed allocation traces, against
references measured or replayed in the same run:

- time: the raw posix backend (mmap + mlock per allocation, munmap per free),
  i.e. pinned memory without a cache. Figure: how many times faster the pool
  serves the trace once its chunks exist (every step after the first);
- memory: a power-of-two rounding cache (PyTorch's CachingHostAllocator
  policy: round each request up to a power of two, reuse only blocks of that
  exact class, never split) replayed on the same trace. Figure: peak reserved
  / peak requested bytes, side by side.

Traces (sizes 4 KiB to 256 MiB, fixed seeds):
- staging (the figures the targets apply to): what the pipeline does with the
  pool; per micro-batch a set of input buffers (4 KiB ... 256 MiB) is staged,
  `--window` micro-batches stay in flight, the oldest is freed first;
- random: distinct sizes allocated in a new random order every step, random
  frees interleaved, live bytes capped: an adversarial mix, printed for
  reference (best fit over separate chunks fragments on it);
- variable: staging with every micro-batch scaled by a random factor in
  [0.5, 1] (variable sequence lengths), printed for reference.

Run: python bench/pinned_allocator.py [--steps 4] [--micro-batches 8] [--window 2] [--seed 0]
Needs root (or a large RLIMIT_MEMLOCK) for mlock; otherwise the raw backend
and the pool fall back to pageable memory (said in the output) and the time
ratio shrinks to what mmap + page faults cost.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from dataclasses import dataclass

from paddle_ext import _C
from paddle_ext.runtime import PinnedPool, PosixBackend, RuntimeConfig

KiB, MiB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class Op:
    kind: str  # "a" allocate, "f" free
    key: int
    size: int = 0


Trace = list[list[Op]]  # one list of calls per step


def staging_trace(seed: int, steps: int, micro_batches: int, window: int, variable: bool) -> Trace:
    """Per micro-batch: token ids, labels, a mask, position ids, an activation
    offload and a 256 MiB block; `window` micro-batches in flight, FIFO frees."""
    rng = random.Random(seed)
    shapes = [4 * KiB, 64 * KiB, 520 * KiB, 3 * MiB + 4 * KiB, 72 * MiB, 256 * MiB]
    trace, key = [], 0
    for _ in range(steps):
        ops: list[Op] = []
        in_flight: list[list[int]] = []
        for _ in range(micro_batches):
            scale = rng.uniform(0.5, 1.0) if variable else 1.0
            keys = []
            for size in shapes:
                ops.append(Op("a", key, max(4 * KiB, int(size * scale))))
                keys.append(key)
                key += 1
            in_flight.append(keys)
            if len(in_flight) > window:
                ops += [Op("f", k) for k in in_flight.pop(0)]
        ops += [Op("f", k) for keys in in_flight for k in keys]
        trace.append(ops)
    return trace


def random_trace(seed: int, steps: int, n_sizes: int = 24, max_live: int = 768 * MiB) -> Trace:
    rng = random.Random(seed)
    small = max(1, (2 * n_sizes) // 3)
    sizes = [4 * KiB, 256 * MiB]
    sizes += [int(2 ** rng.uniform(12, 20)) for _ in range(small - 1)]
    sizes += [int(2 ** rng.uniform(20, 28)) for _ in range(n_sizes - len(sizes))]
    trace, key = [], 0
    for _ in range(steps):
        ops: list[Op] = []
        live: dict[int, int] = {}
        for size in rng.sample(sizes, len(sizes)):
            while live and (sum(live.values()) + size > max_live or rng.random() < 0.35):
                victim = rng.choice(sorted(live))
                ops.append(Op("f", victim))
                del live[victim]
            ops.append(Op("a", key, size))
            live[key] = size
            key += 1
        ops += [Op("f", k) for k in rng.sample(sorted(live), len(live))]
        trace.append(ops)
    return trace


def peak_requested(trace: Trace) -> int:
    live, peak, sizes = 0, 0, {}
    for step in trace:
        for op in step:
            if op.kind == "a":
                sizes[op.key] = op.size
                live += op.size
                peak = max(peak, live)
            else:
                live -= sizes.pop(op.key)
    return peak


def pow2_cache_reserved(trace: Trace) -> int:
    """Peak bytes a power-of-two rounding cache holds on the trace (it never releases)."""
    free: dict[int, int] = {}
    held, cls = 0, {}
    for step in trace:
        for op in step:
            if op.kind == "a":
                c = 1 << max(0, math.ceil(math.log2(op.size)))
                if free.get(c):
                    free[c] -= 1
                else:
                    held += c
                cls[op.key] = c
            else:
                c = cls.pop(op.key)
                free[c] = free.get(c, 0) + 1
    return held


def replay(alloc, free, trace: Trace) -> list[float]:
    """Seconds per step spent in alloc / free calls."""
    times = []
    for step in trace:
        ptrs: dict[int, int] = {}
        start = time.perf_counter()
        for op in step:
            if op.kind == "a":
                ptrs[op.key] = alloc(op.size)
            else:
                free(ptrs.pop(op.key))
        times.append(time.perf_counter() - start)
    return times


def replay_pool(trace: Trace) -> tuple[list[float], object]:
    pool = PinnedPool(PosixBackend(mlock="try"), config=RuntimeConfig())
    native = pool._native
    times = replay(native.allocate, native.free, trace)
    stats = pool.stats()
    pool.check()
    return times, stats


def describe(trace: Trace) -> str:
    sizes = sorted({op.size for s in trace for op in s if op.kind == "a"})
    calls = sum(len(s) for s in trace)
    return (f"{len(trace)} steps, {calls} calls, {len(sizes)} sizes {sizes[0] // KiB} KiB .. "
            f"{sizes[-1] / MiB:.0f} MiB, peak live {peak_requested(trace) / MiB:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--window", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    traces = {
        "staging": staging_trace(args.seed, args.steps, args.micro_batches, args.window, variable=False),
        "random": random_trace(args.seed, args.steps + 2),
        "variable": staging_trace(args.seed, args.steps, args.micro_batches, args.window, variable=True),
    }
    for name, trace in traces.items():
        print(f"trace {name:9s}: {describe(trace)}")

    # Time: the staging trace through the raw backend and through the pool.
    trace = traces["staging"]
    raw = PosixBackend(mlock="try")
    raw_sizes: dict[int, int] = {}

    def raw_alloc(n: int) -> int:
        p = raw.raw_allocate(n)
        raw_sizes[p] = n
        return p

    raw_times = replay(raw_alloc, lambda p: raw.raw_deallocate(p, raw_sizes.pop(p)), trace)
    locked = raw.counters()["mlock_failures"] == 0
    pool_times, stats = replay_pool(trace)
    calls = len(trace[1])
    raw_reuse, pool_reuse = statistics.median(raw_times[1:]), statistics.median(pool_times[1:])
    print()
    print(f"time per step of the staging trace, median of steps 2..{len(trace)}; "
          f"raw = mmap + {'mlock' if locked else 'mlock REFUSED (pageable)'} + munmap")
    print(f"{'':40s} {'seconds':>10s} {'us/call':>10s}")
    print(f"{'raw posix backend (reference)':40s} {raw_reuse:10.4f} {raw_reuse / calls * 1e6:10.1f}")
    print(f"{'paddle_ext pool':40s} {pool_reuse:10.6f} {pool_reuse / calls * 1e6:10.2f}")
    print(f"{'paddle_ext pool, first step (growth)':40s} {pool_times[0]:10.4f}")
    speedup = raw_reuse / pool_reuse
    print(f"pool vs raw on reuse: {speedup:.0f}x faster (target >= 100x); pool stats: {stats.growths} growths, "
          f"{stats.cache_hits} cache hits, {stats.backend_alloc_ns / 1e6:.0f} ms in the backend")

    # Memory: peak reserved / peak requested, the pool against power-of-two rounding.
    print()
    print(f"{'peak reserved / peak requested':40s} {'pool':>8s} {'pow2':>8s}   (pool MiB / pow2 MiB)")
    ratios = {}
    for name, trace in traces.items():
        requested = peak_requested(trace)
        st = stats if name == "staging" else replay_pool(trace)[1]
        ours, pow2 = st.peak_reserved_bytes / requested, pow2_cache_reserved(trace) / requested
        ratios[name] = ours
        note = "  <- target <= 1.1" if name == "staging" else "  (reference only)"
        print(f"{'trace ' + name:40s} {ours:8.3f} {pow2:8.3f}   ({st.peak_reserved_bytes / MiB:.0f} / "
              f"{pow2 * requested / MiB:.0f}){note}")
    print(f"build: {_C.build_info()['compiler']}")
    if speedup < 100 or ratios["staging"] > 1.1:
        raise SystemExit("a target was missed")


if __name__ == "__main__":
    main()
