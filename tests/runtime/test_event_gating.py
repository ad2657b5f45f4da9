"""Stream-ordered reuse: a block freed after record_event returns to the free
index only once its events completed, polled on allocate and on empty_cache.
The "device" is the cpu event backend with held streams (a manual fake event)."""

from __future__ import annotations

import pytest

from tests.runtime.conftest import C, KiB, MiB


def test_record_event_on_an_unknown_pointer_returns_false(make_pool, stream):
    pool, _ = make_pool()
    s = stream()
    p = pool.allocate(4 * KiB)
    assert pool.record_event(p + 256, s) is False  # inside a block, not its start
    assert pool.record_event(12345, s) is False
    pool.free(p)
    assert pool.record_event(p, s) is False  # freed
    assert pool.stats()["events_recorded"] == 0


def test_freed_block_waits_for_its_event_then_is_reused(make_pool, stream):
    pool, _ = make_pool(chunk_size=64 * KiB)
    s = stream()
    C.cpu_stream_hold(s)
    p = pool.allocate(4 * KiB)
    assert pool.record_event(p, s) is True
    pool.free(p)
    st = pool.stats()
    assert (st["pending_blocks"], st["pending_bytes"], st["allocated_bytes"]) == (1, 4 * KiB, 0)
    q = pool.allocate(4 * KiB)  # the stream may still read p: p must not come back
    assert q != p and q - p >= 4 * KiB
    C.cpu_stream_release(s)  # the "copy" finished
    r = pool.allocate(4 * KiB)  # polled on allocate: p is free again, and the best fit
    assert r == p
    st = pool.stats()
    assert (st["pending_blocks"], st["events_recorded"], st["events_completed"]) == (0, 1, 1)
    pool.free(q)
    pool.free(r)


def test_a_block_waits_for_every_stream_that_read_it(make_pool, stream):
    pool, _ = make_pool()
    s1, s2 = stream(), stream()
    C.cpu_stream_hold(s1)
    C.cpu_stream_hold(s2)
    p = pool.allocate(1 * KiB)
    assert pool.record_event(p, s1) and pool.record_event(p, s2)
    pool.free(p)
    C.cpu_stream_release(s1)
    assert pool.poll_events() == 0 and pool.stats()["pending_blocks"] == 1
    C.cpu_stream_step(s2, 1)
    assert pool.poll_events() == 1 and pool.stats()["pending_blocks"] == 0


def test_events_recorded_later_on_a_stream_do_not_hold_earlier_frees(make_pool, stream):
    pool, _ = make_pool()
    s = stream()
    C.cpu_stream_hold(s)
    a, b = pool.allocate(1 * KiB), pool.allocate(1 * KiB)
    pool.record_event(a, s)
    pool.record_event(b, s)
    pool.free(a)
    pool.free(b)
    C.cpu_stream_step(s, 1)  # only the first submission (a's event) completed
    assert pool.poll_events() == 1
    assert pool.stats()["pending_bytes"] == 1 * KiB
    C.cpu_stream_release(s)
    assert pool.poll_events() == 1


def test_empty_cache_polls_events_before_releasing_idle_chunks(make_pool, stream):
    pool, backend = make_pool(chunk_size=1 * MiB)
    s = stream()
    C.cpu_stream_hold(s)
    p = pool.allocate(100 * KiB)
    pool.record_event(p, s)
    pool.free(p)
    pool.empty_cache()
    assert pool.stats()["reserved_bytes"] == 1 * MiB  # still read by the stream: kept
    C.cpu_stream_release(s)
    pool.empty_cache()
    assert pool.stats()["reserved_bytes"] == 0 and backend.used == 0


def test_pending_blocks_count_as_cached_and_are_not_released(make_pool, stream):
    pool, backend = make_pool(chunk_size=1 * MiB, free_idle_chunk=True)
    s = stream()
    C.cpu_stream_hold(s)
    p = pool.allocate(1 * KiB)
    pool.record_event(p, s)
    pool.free(p)
    assert backend.used == 1 * MiB  # free_idle_chunk waits for the event too
    C.cpu_stream_release(s)
    pool.poll_events()
    assert backend.used == 0


def test_completed_events_are_kept_for_reuse(make_pool, stream):
    pool, _ = make_pool(spare_events=4)
    s = stream()
    before = C.cpu_live_events()
    for _ in range(50):
        p = pool.allocate(1 * KiB)
        pool.record_event(p, s)
        pool.free(p)
        pool.poll_events()
    assert C.cpu_live_events() - before <= 4
    calls = C.event_backend_calls("cpu")
    p = pool.allocate(1 * KiB)
    pool.record_event(p, s)  # a spare: record only, no create
    assert C.event_backend_calls("cpu") - calls == 1
    pool.free(p)
    pool.empty_cache()  # gives the spares back
    assert C.cpu_live_events() - before <= 1


def test_pool_teardown_waits_for_pending_events(stream):
    backend = C.FakeBackend()
    pool = C.HostAllocator(backend)
    s = stream()
    p = pool.allocate(10)
    pool.record_event(p, s)  # an immediate stream: complete already
    pool.free(p)
    del pool
    assert backend.used == 0


@pytest.mark.parametrize("device", [-1, 0])
def test_record_event_passes_the_device(make_pool, stream, device):
    pool, _ = make_pool()
    p = pool.allocate(10)
    assert pool.record_event(p, stream(), device) is True
    pool.free(p)
