"""The auto-growth best-fit allocator core over the fake backend: best fit,
split and merge, growth, alignment, reserved bytes under each release policy,
the out-of-memory path, errors, stats and debug flags."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.runtime.conftest import C, KiB, MiB, layout


def test_invariants_hold_after_every_operation(make_pool):
    pool, _ = make_pool()
    live = []
    for i, size in enumerate([1, 255, 256, 257, 4 * KiB, 300 * KiB, 2 * MiB, 10, 70 * KiB]):
        live.append(pool.allocate(size))
        pool.check_invariants()
        if i % 3 == 2:
            pool.free(live.pop(1))
            pool.check_invariants()
    for p in live:
        pool.free(p)
        pool.check_invariants()
    assert all(state == "free" for *_, state in pool.blocks())
    assert pool.stats()["free_blocks"] == pool.stats()["chunks"]  # merged back: one free block per chunk


def test_best_fit_takes_the_smallest_block_that_fits_lowest_address_first(make_pool):
    pool, _ = make_pool(alignment=256)
    a = pool.allocate(4 * KiB)
    g1 = pool.allocate(256)
    b = pool.allocate(8 * KiB)
    g2 = pool.allocate(256)
    c = pool.allocate(2 * KiB)
    g3 = pool.allocate(256)
    d = pool.allocate(4 * KiB)
    g4 = pool.allocate(256)
    for p in (a, b, c, d):
        pool.free(p)
    # Free: a 4K, b 8K, c 2K, d 4K and the chunk's tail.
    assert pool.allocate(3 * KiB) == a       # 4K beats 8K and the tail; a is below d
    assert pool.allocate(3 * KiB) == d       # the other 4K
    assert pool.allocate(2 * KiB) == c       # exact fit
    assert pool.allocate(5 * KiB) == b       # only 8K (or the tail) fits; 8K is smaller
    assert pool.stats()["growths"] == 1
    for p in (g1, g2, g3, g4):
        pool.free(p)


def test_blocks_split_on_allocate_and_merge_with_free_neighbours(make_pool):
    pool, _ = make_pool(alignment=256, chunk_size=64 * KiB)
    x, y, z = (pool.allocate(1000) for _ in range(3))
    assert layout(pool) == [(0, 0, 1024, "allocated"), (0, 1024, 1024, "allocated"),
                            (0, 2048, 1024, "allocated"), (0, 3072, 64 * KiB - 3072, "free")]
    pool.free(y)
    assert [s for *_, s in layout(pool)] == ["allocated", "free", "allocated", "free"]
    pool.free(z)  # merges with y and with the tail
    assert layout(pool) == [(0, 0, 1024, "allocated"), (0, 1024, 64 * KiB - 1024, "free")]
    pool.free(x)
    assert layout(pool) == [(0, 0, 64 * KiB, "free")]


def test_blocks_never_merge_across_chunks(make_pool):
    pool, _ = make_pool(chunk_size=64 * KiB)
    ptrs = [pool.allocate(48 * KiB) for _ in range(4)]  # one chunk each
    for p in ptrs:
        pool.free(p)
    stats = pool.stats()
    assert stats["chunks"] == 4 and stats["free_blocks"] == 4
    assert [size for *_, size, _ in layout(pool)] == [64 * KiB] * 4


def test_growth_is_max_of_request_and_chunk_size(make_pool):
    pool, backend = make_pool(chunk_size=1 * MiB, granularity=4096)
    pool.allocate(10 * KiB)
    assert pool.stats()["reserved_bytes"] == 1 * MiB
    pool.allocate(3 * MiB + 1)  # a request above the chunk size gets a chunk of its own
    assert pool.stats()["reserved_bytes"] == 1 * MiB + 3 * MiB + 4096
    assert backend.counters()["allocs"] == 2
    pool.allocate(500 * KiB)  # fits the first chunk's tail: no growth
    assert pool.stats()["growths"] == 2 and pool.stats()["cache_hits"] == 1


def test_chunk_size_zero_grows_by_the_request_alone(make_pool):
    pool, _ = make_pool(chunk_size=0, granularity=1)
    pool.allocate(1000)
    assert pool.stats()["reserved_bytes"] == 1024  # rounded to the 256 B alignment only


@pytest.mark.parametrize("alignment", [16, 256, 4096, 64 * KiB])
def test_alignment_is_configurable(make_pool, alignment):
    pool, _ = make_pool(alignment=alignment, chunk_size=256 * KiB)
    ptrs = [pool.allocate(n) for n in (1, 17, 1000, 5000, 70_000)]
    assert all(p % alignment == 0 for p in ptrs)
    assert [pool.block_size(p) for p in ptrs] == [-(-max(n, 1) // alignment) * alignment
                                                  for n in (1, 17, 1000, 5000, 70_000)]


def test_default_alignment_is_well_below_upstreams_64_kib(make_pool):
    pool, _ = make_pool()
    assert pool.options()["alignment"] == 256
    p = pool.allocate(1)
    assert pool.block_size(p) == 256


@pytest.mark.parametrize("options, message", [
    (dict(alignment=100), "alignment must be a power of two in [16, 65536], got 100"),
    (dict(alignment=8), "alignment must be a power of two in [16, 65536], got 8"),
    (dict(alignment=1 << 17), "alignment must be a power of two in [16, 65536], got 131072"),
    (dict(chunk_size=1 << 41), "chunk_size must be in [0, 1099511627776] bytes, got 2199023255552"),
    (dict(fill_value=256), "fill_value must be -1 (off) or a byte value in [0, 255], got 256"),
    (dict(spare_events=5000), "spare_events must be in [0, 4096], got 5000"),
    (dict(reuse_waste=1.5), "reuse_waste must be a fraction in [0, 1], got 1.5"),
    (dict(reuse_waste=-0.25), "reuse_waste must be a fraction in [0, 1], got -0.25"),
])
def test_option_errors_name_argument_value_and_range(options, message):
    with pytest.raises(ValueError) as err:
        C.HostAllocator(C.FakeBackend(), **options)
    assert str(err.value) == message


def test_reserved_bytes_with_default_caching(make_pool):
    pool, backend = make_pool(chunk_size=1 * MiB)
    ptrs = [pool.allocate(700 * KiB) for _ in range(3)]  # three chunks
    for p in ptrs:
        pool.free(p)
    s = pool.stats()
    assert (s["reserved_bytes"], s["allocated_bytes"], s["chunks"]) == (3 * MiB, 0, 3)
    assert backend.used == 3 * MiB
    pool.empty_cache()
    assert pool.stats()["reserved_bytes"] == 0 and backend.used == 0
    assert pool.stats()["idle_chunks_released"] == 3


def test_reserved_bytes_with_free_idle_chunk(make_pool):
    pool, backend = make_pool(chunk_size=1 * MiB, free_idle_chunk=True)
    # two chunks; a2 fits only a's (324 KiB free against b's 124): with equal room in both,
    # best fit's tie went to whichever chunk the backend had put at the lower address
    a, b = pool.allocate(700 * KiB), pool.allocate(900 * KiB)
    a2 = pool.allocate(200 * KiB)  # shares a's chunk
    pool.free(a)
    assert pool.stats()["reserved_bytes"] == 2 * MiB  # a's chunk still holds a2
    pool.free(b)
    assert pool.stats()["reserved_bytes"] == 1 * MiB and backend.used == 1 * MiB
    pool.free(a2)
    assert pool.stats()["reserved_bytes"] == 0 and backend.used == 0


@pytest.mark.parametrize("cap, reserved_after", [(0, 0), (1 * MiB, 1 * MiB), (2 * MiB, 2 * MiB), (None, 3 * MiB)])
def test_reserved_bytes_under_the_cached_bytes_cap(make_pool, cap, reserved_after):
    pool, backend = make_pool(chunk_size=1 * MiB, max_cached_bytes=cap)
    keep = pool.allocate(1 * MiB)  # a full chunk that stays allocated
    ptrs = [pool.allocate(1 * MiB) for _ in range(3)]
    for p in ptrs:
        pool.free(p)
        s = pool.stats()
        assert cap is None or s["reserved_bytes"] - s["allocated_bytes"] <= cap
    assert pool.stats()["reserved_bytes"] == 1 * MiB + reserved_after
    assert backend.used == 1 * MiB + reserved_after
    pool.free(keep)


def test_out_of_memory_frees_idle_chunks_and_retries(make_pool):
    # Trimming would give the idle chunks back before the growth: off, to reach the retry.
    pool, backend = make_pool(capacity=4 * MiB, chunk_size=1 * MiB, trim_on_growth=False)
    live = pool.allocate(1 * MiB)
    for p in [pool.allocate(1 * MiB) for _ in range(2)]:
        pool.free(p)  # two idle cached chunks
    assert backend.used == 3 * MiB
    big = pool.allocate(3 * MiB)  # 3 MiB does not fit beside 3 MiB held: release idle, retry
    s = pool.stats()
    assert (s["oom_retries"], s["idle_chunks_released"], s["backend_alloc_failures"]) == (1, 2, 1)
    assert s["reserved_bytes"] == 4 * MiB == backend.used
    pool.free(big)
    pool.free(live)


def test_trim_on_growth_gives_idle_chunks_back_before_raising_the_peak(make_pool):
    pool, backend = make_pool(chunk_size=1 * MiB)
    a = pool.allocate(1 * MiB)
    pool.free(pool.allocate(2 * MiB))  # an idle 2 MiB chunk; peak reserved 3 MiB
    c = pool.allocate(3 * MiB)  # fits no idle chunk; 3 + 3 > 3: the idle chunk goes first
    s = pool.stats()
    assert (s["reserved_bytes"], s["peak_reserved_bytes"], s["trims"], s["idle_chunks_released"]) == \
        (4 * MiB, 4 * MiB, 1, 1)
    assert backend.used == 4 * MiB and s["oom_retries"] == 0
    pool.free(c)
    pool.empty_cache()
    c = pool.allocate(3 * MiB)  # back under the peak: nothing to trim
    assert pool.stats()["trims"] == 1
    pool.free(a)
    pool.free(c)


def test_a_request_above_the_chunk_size_gets_a_dedicated_chunk_reused_only_within_reuse_waste(make_pool):
    pool, backend = make_pool(chunk_size=1 * MiB, granularity=4096)  # reuse_waste 1/16 by default
    a = pool.allocate(4 * MiB)
    pool.free(a)
    b = pool.allocate(4 * MiB - 200 * KiB)  # 200 KiB <= (4 MiB - 200 KiB) / 16: taken whole
    assert b == a and pool.block_size(b) == 4 * MiB
    s = pool.stats()
    assert (s["allocated_bytes"], s["requested_bytes"], s["growths"]) == (4 * MiB, 4 * MiB - 200 * KiB, 1)
    pool.free(b)
    # 2 MiB would waste 2 MiB of it: a chunk of its own; the idle 4 MiB goes first (trim_on_growth).
    c = pool.allocate(2 * MiB)
    s = pool.stats()
    assert (s["reserved_bytes"], s["peak_reserved_bytes"], s["idle_chunks_released"]) == (2 * MiB, 4 * MiB, 1)
    # A small request never lands in a dedicated chunk's tail: a shared chunk of chunk_size.
    d = pool.allocate(10 * KiB)
    assert pool.stats()["reserved_bytes"] == 3 * MiB == backend.used
    assert sorted(size for *_, size, _ in layout(pool)) == [10 * KiB, 1 * MiB - 10 * KiB, 2 * MiB]
    pool.free(c)
    pool.free(d)


def test_a_dedicated_chunk_is_taken_whole_never_split(make_pool):
    pool, _ = make_pool(chunk_size=1 * MiB, granularity=4096, reuse_waste=1.0)
    a = pool.allocate(3 * MiB + 1)  # page-rounded chunk: 3 MiB + 4 KiB, one block, no free tail
    assert layout(pool) == [(0, 0, 3 * MiB + 4 * KiB, "allocated")]
    pool.free(a)
    b = pool.allocate(2 * MiB)  # wastes 1 MiB + 4 KiB <= 2 MiB: reused, still one block
    assert b == a and layout(pool) == [(0, 0, 3 * MiB + 4 * KiB, "allocated")]
    assert "dedicated" in pool.dump()
    pool.free(b)
    c = pool.allocate(1 * MiB)  # would waste 2 MiB + 4 KiB > 1 MiB: the idle chunk goes, a shared one comes
    s = pool.stats()
    assert (s["chunks"], s["reserved_bytes"], s["idle_chunks_released"]) == (1, 1 * MiB, 1)
    assert layout(pool) == [(1, 0, 1 * MiB, "allocated")]
    pool.free(c)


def test_with_zero_reuse_waste_only_an_exact_fit_reuses_a_dedicated_chunk(make_pool):
    pool, backend = make_pool(chunk_size=0, granularity=4096, reuse_waste=0.0, trim_on_growth=False)
    pool.free(pool.allocate(8 * KiB))
    p = pool.allocate(8 * KiB - 256)  # fits, but wastes 256 B
    q = pool.allocate(8 * KiB)        # the exact fit
    s = pool.stats()
    assert (s["growths"], s["cache_hits"], s["reserved_bytes"]) == (2, 1, 16 * KiB)
    assert pool.block_size(p) == 8 * KiB  # its own page-rounded chunk, handed out whole
    pool.free(p)
    pool.free(q)
    assert backend.used == 16 * KiB


def test_without_trim_the_idle_chunk_stays(make_pool):
    pool, backend = make_pool(chunk_size=1 * MiB, trim_on_growth=False)
    a = pool.allocate(1 * MiB)
    pool.free(pool.allocate(2 * MiB))
    c = pool.allocate(3 * MiB)
    assert pool.stats()["reserved_bytes"] == 6 * MiB == backend.used and pool.stats()["trims"] == 0
    assert pool.options()["trim_on_growth"] is False
    pool.free(a)
    pool.free(c)


def test_out_of_memory_retries_with_the_bare_request_after_the_chunk(make_pool):
    pool, backend = make_pool(capacity=3 * MiB, chunk_size=4 * MiB)
    p = pool.allocate(2 * MiB)  # the 4 MiB chunk fails twice, the 2 MiB request fits
    s = pool.stats()
    assert (s["backend_allocs"], s["backend_alloc_failures"], s["reserved_bytes"]) == (3, 2, 2 * MiB)
    pool.free(p)


def test_out_of_memory_error_carries_code_name_and_the_pools_account(make_pool):
    pool, _ = make_pool(capacity=1 * MiB, chunk_size=1 * MiB, trim_on_growth=False)
    keep = pool.allocate(512 * KiB)
    with pytest.raises(C.OutOfMemoryError) as err:
        pool.allocate(2 * MiB)
    e = err.value
    assert isinstance(e, MemoryError) and isinstance(e, C.DeviceError) and isinstance(e, RuntimeError)
    assert (e.backend, e.code, e.name) == ("fake", 12, "ENOMEM")
    assert "could not grow by 2097152 B for a request of 2097152 B" in str(e)
    assert "reserved 1048576 B in 1 chunks, allocated 524288 B" in str(e)
    pool.free(keep)


def test_other_backend_errors_are_not_retried_and_keep_their_code(make_pool):
    pool, backend = make_pool()
    backend.fail_next(1, out_of_memory=False, code=999, name="FAKE_BROKEN")
    with pytest.raises(C.DeviceError) as err:
        pool.allocate(10)
    assert not isinstance(err.value, MemoryError)
    assert (err.value.code, err.value.name, err.value.backend) == (999, "FAKE_BROKEN", "fake")
    assert pool.stats()["oom_retries"] == 0
    pool.free(pool.allocate(10))  # the pool is still usable


def test_free_of_an_unknown_or_freed_pointer_names_it(make_pool):
    pool, _ = make_pool()
    p = pool.allocate(100)
    with pytest.raises(ValueError, match=f"free: pointer 0x{p + 256:x} is not a live block of this pool"):
        pool.free(p + 256)
    pool.free(p)
    with pytest.raises(ValueError, match="already freed"):
        pool.free(p)


def test_request_bounds(make_pool):
    pool, _ = make_pool()
    p = pool.allocate(0)
    assert pool.block_size(p) == 256
    with pytest.raises(ValueError, match=r"nbytes must be in \[0, 70368744177664\], got 70368744177665"):
        pool.allocate((1 << 46) + 1)


def test_backend_is_not_called_under_the_lock(make_pool):
    """A slow growth (like mlock or cudaHostAlloc) must not stall cache hits of other threads."""
    pool, backend = make_pool(chunk_size=1 * MiB)
    guard = pool.allocate(1 * KiB)  # keeps the first chunk busy, so no growth trims it
    pool.free(pool.allocate(1 * KiB))
    backend.set_delay(0.6)
    grower = threading.Thread(target=lambda: pool.free(pool.allocate(4 * MiB)))
    grower.start()
    time.sleep(0.1)  # the grower is now inside the backend
    start = time.perf_counter()
    for _ in range(100):
        pool.free(pool.allocate(1 * KiB))
    hits = time.perf_counter() - start
    grower.join()
    pool.free(guard)
    assert hits < 0.3, f"100 cache hits took {hits:.3f} s while another thread grew the pool"
    assert pool.stats()["backend_alloc_ns"] >= 0.5e9


def test_stats_account_for_every_call(make_pool):
    pool, backend = make_pool(chunk_size=1 * MiB)
    a = pool.allocate(1000)
    b = pool.allocate(3000)
    s = pool.stats()
    assert s["allocated_bytes"] == 1024 + 3072 and s["requested_bytes"] == 4000
    assert (s["allocations"], s["cache_hits"], s["growths"], s["backend_allocs"]) == (2, 1, 1, 1)
    assert s["largest_free_block"] == 1 * MiB - 4096 and s["free_blocks"] == 1 and s["allocated_blocks"] == 2
    pool.free(a)
    pool.free(b)
    s = pool.stats()
    assert (s["allocated_bytes"], s["requested_bytes"], s["frees"]) == (0, 0, 2)
    assert (s["peak_allocated_bytes"], s["peak_requested_bytes"], s["peak_reserved_bytes"]) == (4096, 4000, 1 * MiB)
    assert s["backend_alloc_ns"] > 0 and backend.counters()["allocs"] == 1


def test_fill_value_flag_fills_every_allocation(make_pool):
    pool, _ = make_pool(fill_value=0xAB)
    block = pool.allocate_block(1000)
    assert (np.frombuffer(block, dtype=np.uint8) == 0xAB).all()
    pool.set_debug_flags(fill_value=-1, sync_after_alloc=False, dump_chunks=False, free_idle_chunk=False)
    assert pool.debug_flags()["fill_value"] == -1


def test_sync_after_alloc_flag_waits_for_the_device(make_pool):
    pool, backend = make_pool(sync_after_alloc=True)
    for _ in range(3):
        pool.free(pool.allocate(100))
    assert pool.stats()["syncs"] == 3 and backend.counters()["syncs"] == 3


def test_dump_chunks_flag_prints_the_layout_on_growth_and_out_of_memory(make_pool, capfd):
    pool, _ = make_pool(capacity=2 * MiB, chunk_size=1 * MiB, dump_chunks=True)
    p = pool.allocate(1000)
    err = capfd.readouterr().err
    assert "paddle_ext pinned pool [fake]: grew by 1048576 B for a request of 1000 B" in err
    assert "chunk 0 @0x" in err and "A1024 F1047552" in err
    with pytest.raises(MemoryError):
        pool.allocate(4 * MiB)
    err = capfd.readouterr().err
    assert "out of memory growing by 4194304 B; releasing 0 idle chunks and retrying" in err
    assert "could not grow by 4194304 B" in err
    pool.free(p)


def test_set_debug_flags_validates(make_pool):
    pool, _ = make_pool()
    with pytest.raises(ValueError, match=r"fill_value must be -1 \(off\) or a byte value in \[0, 255\], got -2"):
        pool.set_debug_flags(fill_value=-2, sync_after_alloc=False, dump_chunks=False, free_idle_chunk=False)


def test_destroying_the_pool_returns_every_chunk(make_pool):
    backend = C.FakeBackend()
    pool = C.HostAllocator(backend, chunk_size=1 * MiB)
    pool.allocate(10)
    pool.free(pool.allocate(5 * MiB))
    assert backend.used == 1 * MiB + 5 * MiB
    del pool
    assert backend.used == 0
