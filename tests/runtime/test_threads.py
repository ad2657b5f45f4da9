"""Concurrent allocate / free / record_event from Python threads (the bindings
release the GIL, so the threads really run the allocator in parallel): live
blocks never overlap, every block keeps its contents, and the stats add up."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from tests.runtime.conftest import C, KiB, MiB

THREADS, ROUNDS = 8, 400


def run_threads(pool, stream_id: int | None) -> tuple[list[str], list[tuple[int, int]]]:
    errors: list[str] = []
    overlap_lock = threading.Lock()
    live: dict[int, int] = {}
    spans: list[tuple[int, int]] = []
    barrier = threading.Barrier(THREADS + 1)

    def worker(tid: int) -> None:
        rng = random.Random(tid)
        mine: list[tuple[object, np.ndarray, int]] = []
        barrier.wait()
        try:
            for r in range(ROUNDS):
                if mine and (rng.random() < 0.45 or len(mine) > 12):
                    block, view, tag = mine.pop(rng.randrange(len(mine)))
                    if not (view == tag).all():
                        errors.append(f"thread {tid}: block {block.ptr:#x} was overwritten")
                    with overlap_lock:
                        del live[block.ptr]
                    if stream_id is not None and rng.random() < 0.3:
                        pool.record_event(block.ptr, stream_id)
                    del block, view  # the last references: frees the block
                else:
                    n = int(2 ** rng.uniform(4, 18))
                    try:
                        block = pool.allocate_block(n)
                    except MemoryError:  # the capped fake backend: a legal outcome under contention
                        continue
                    size = pool.block_size(block.ptr)
                    with overlap_lock:
                        for start, end in ((p, p + s) for p, s in live.items()):
                            if block.ptr < end and start < block.ptr + size:
                                errors.append(f"thread {tid}: {block.ptr:#x}+{size} overlaps {start:#x}..{end:#x}")
                        live[block.ptr] = size
                        spans.append((block.ptr, size))
                    tag = (tid * 37 + r) % 251 + 1
                    view = np.frombuffer(block, dtype=np.uint8)
                    view[:] = tag
                    mine.append((block, view, tag))
        except Exception as err:  # reported by the main thread
            errors.append(f"thread {tid}: {type(err).__name__}: {err}")
        finally:
            with overlap_lock:
                for block, _, _ in mine:
                    live.pop(block.ptr, None)
            mine.clear()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    barrier.wait()
    checker_errors = []
    while any(t.is_alive() for t in threads):  # invariants hold while the workers race
        try:
            pool.check_invariants()
        except Exception as err:
            checker_errors.append(str(err))
    for t in threads:
        t.join()
    return errors + checker_errors, spans


@pytest.mark.parametrize("capacity, with_events", [(None, False), (6 * MiB, True)])
def test_concurrent_allocate_free_keeps_blocks_disjoint_and_stats_consistent(make_pool, stream, capacity,
                                                                               with_events):
    pool, backend = make_pool(capacity=capacity, chunk_size=256 * KiB, max_cached_bytes=2 * MiB)
    sid = stream() if with_events else None
    if sid is not None:
        C.cpu_stream_hold(sid)
        releaser = threading.Timer(0.05, C.cpu_stream_release, args=(sid,))
        releaser.start()
    errors, spans = run_threads(pool, sid)
    if sid is not None:
        releaser.join()
        C.cpu_stream_release(sid)
    assert not errors, errors[:5]
    pool.empty_cache()
    pool.check_invariants()
    s = pool.stats()
    assert len(spans) == s["allocations"] == s["frees"]
    assert (s["allocated_bytes"], s["requested_bytes"], s["allocated_blocks"], s["pending_blocks"]) == (0, 0, 0, 0)
    assert s["reserved_bytes"] == 0 == backend.used
    assert s["events_completed"] == s["events_recorded"]
    assert s["cache_hits"] + s["growths"] == s["allocations"]
