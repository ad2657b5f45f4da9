"""paddle_ext.runtime's Python face: PinnedPool buffers as numpy arrays and as
Paddle tensors without a copy, lifetimes, record_event on arrays, config from
the paddle_ext config and the environment, stats."""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest

from paddle_ext import runtime
from paddle_ext.runtime import (
    CpuStream,
    DebugFlags,
    FakeBackend,
    PinnedPool,
    PoolStats,
    RuntimeConfig,
    from_source,
)
from paddle_ext.runtime import config as config_module
from tests.runtime.conftest import C, KiB, MiB


@pytest.fixture
def pool() -> PinnedPool:
    return PinnedPool(FakeBackend(), config=RuntimeConfig(), chunk_size=1 * MiB)


def test_empty_gives_a_writable_numpy_array_in_the_pool(pool):
    x = pool.empty((4, 256), np.float32)
    assert x.shape == (4, 256) and x.dtype == np.float32 and x.flags.writeable
    x[:] = 7
    s = pool.stats()
    assert s.allocated_bytes == 4096 and s.requested_bytes == 4096 and s.allocated_blocks == 1


def test_block_lives_until_the_last_view_is_gone(pool):
    buf = pool.allocate(1000)
    a = buf.numpy(np.uint8)
    b = buf.numpy(np.int32, (25, 10))
    del buf
    a[:4] = [1, 0, 0, 0]
    assert b[0, 0] == 1  # the same memory
    del a
    assert pool.stats().allocated_blocks == 1
    del b
    gc.collect()
    assert pool.stats().allocated_blocks == 0


def test_paddle_tensor_shares_the_pinned_memory():
    paddle = pytest.importorskip("paddle")
    from paddle_ext import compat

    if compat.paddle_version() < (3, 0, 0):
        pool = PinnedPool(FakeBackend(), config=RuntimeConfig())
        with pytest.raises(NotImplementedError, match="no zero-copy path"):
            pool.allocate(64).tensor(np.float32, (4, 4))
        return
    pool = PinnedPool(FakeBackend(), config=RuntimeConfig())
    buf = pool.allocate(64)
    t = buf.tensor(np.float32, (4, 4))
    assert isinstance(t, paddle.Tensor) and t.shape == [4, 4]
    view = buf.numpy(np.float32, (4, 4))
    view[1, 2] = 42.0
    assert float(t[1, 2]) == 42.0  # no copy: the tensor sees the write
    del buf, view
    gc.collect()
    assert pool.stats().allocated_blocks == 1  # the tensor keeps the block alive
    del t
    gc.collect()
    assert pool.stats().allocated_blocks == 0


def test_copy_of_makes_a_pinned_copy(pool):
    src = np.arange(12, dtype=np.int64).reshape(3, 4)
    out = pool.copy_of(src)
    assert np.array_equal(out, src) and out.ctypes.data != src.ctypes.data
    assert pool.stats().requested_bytes == src.nbytes


def test_record_event_on_arrays_and_views_gates_the_whole_block(pool):
    s = CpuStream(30_001)
    s.hold()
    try:
        x = pool.empty(1024, np.float32)
        ptr = x.ctypes.data
        assert pool.record_event(x[100:200], s) is True  # a view at an offset: its block
        del x
        assert pool.stats().pending_blocks == 1
        y = pool.empty(1024, np.float32)
        assert y.ctypes.data != ptr
    finally:
        s.release()
    z = pool.empty(1024, np.float32)
    assert z.ctypes.data == ptr
    assert pool.record_event(np.zeros(4), s) is False  # not pool memory
    other = PinnedPool(FakeBackend(), config=RuntimeConfig())
    assert other.record_event(z, s) is False  # another pool's block


def test_buffer_record_event_and_repr(pool):
    buf = pool.allocate(10)
    assert buf.record_event(None) is True
    assert repr(buf).startswith("PinnedBuffer(ptr=0x") and "backend='fake'" in repr(buf)
    assert "PinnedPool(backend='fake'" in repr(pool)


def test_argument_errors_are_named(pool):
    with pytest.raises(ValueError, match="nbytes must be a non-negative int, got -1"):
        pool.allocate(-1)
    with pytest.raises(ValueError, match=r"shape must be non-negative ints, got \(2, -3\)"):
        pool.empty((2, -3))
    with pytest.raises(TypeError, match="backend must be a name or a paddle_ext.runtime backend object, got list"):
        PinnedPool([1])
    with pytest.raises(ValueError, match=r"backend must be one of \['auto', 'posix', 'cuda', 'hip', 'xpu', 'fake'\], got 'tpu'"):
        PinnedPool("tpu")


def test_stats_dataclass_matches_the_native_counters(pool):
    native = pool._native.stats()
    assert {f.name for f in dataclasses.fields(PoolStats)} == set(native)
    x = pool.empty(100, np.uint8)
    s = pool.stats()
    assert s.cached_bytes == s.reserved_bytes - s.allocated_bytes == 1 * MiB - 256
    assert s.as_dict()["allocations"] == 1
    del x


def test_flags_round_trip(pool):
    pool.set_flags(DebugFlags(fill_value=0, free_idle_chunk=True))
    assert pool.flags == DebugFlags(fill_value=0, free_idle_chunk=True)
    x = pool.empty(16, np.uint8)
    assert (x == 0).all()
    del x
    assert pool.stats().reserved_bytes == 0  # free_idle_chunk gave the chunk back


def test_auto_growth_off_is_the_uncached_allocator():
    pool = PinnedPool(FakeBackend(granularity=4096), config=RuntimeConfig(auto_growth=False))
    x = pool.empty(1000, np.uint8)
    assert pool.stats().reserved_bytes == 4096  # just the request, page-rounded
    del x
    assert pool.stats().reserved_bytes == 0


def test_config_from_the_paddle_ext_section_and_the_environment():
    source = {"paddle_ext": {"runtime": {"alignment": 512, "chunk_size": "4MiB", "fill_value": 7,
                                         "free_idle_chunk": True, "backend": "fake"}}}
    cfg = from_source(source, environ={})
    assert (cfg.alignment, cfg.chunk_size, cfg.backend) == (512, 4 * MiB, "fake")
    assert cfg.flags == DebugFlags(fill_value=7, free_idle_chunk=True)
    env = {"PADDLE_EXT_PINNED_CHUNK_SIZE": "64KiB", "PADDLE_EXT_ALLOC_FILL_VALUE": "0x5a",
           "PADDLE_EXT_SYNC_AFTER_ALLOC": "on", "PADDLE_EXT_ALLOC_DUMP_CHUNKS": "1",
           "PADDLE_EXT_PINNED_MAX_CACHED_BYTES": "1GiB", "PADDLE_EXT_PINNED_MLOCK": "require",
           "PADDLE_EXT_PINNED_AUTO_GROWTH": "false", "PADDLE_EXT_PINNED_TRIM_ON_GROWTH": "no"}
    cfg = from_source(source, environ=env)  # the environment wins
    assert (cfg.chunk_size, cfg.max_cached_bytes, cfg.mlock, cfg.auto_growth) == (64 * KiB, 1 << 30, "require", False)
    assert cfg.trim_on_growth is False
    assert cfg.flags == DebugFlags(fill_value=0x5A, sync_after_alloc=True, dump_chunks=True, free_idle_chunk=True)
    assert from_source({"runtime": {"alignment": 64}}, environ={}).alignment == 64
    assert from_source({"alignment": 64}, environ={}).alignment == 64
    assert from_source({"alignment": "64"}, environ={}).alignment == 64  # sizes as text are parsed
    assert from_source(None, environ={}) == RuntimeConfig()


def test_reuse_waste_from_config_environment_and_keyword():
    assert RuntimeConfig().reuse_waste == 0.0625
    assert from_source({"reuse_waste": "0.25"}, environ={}).reuse_waste == 0.25
    assert from_source({"reuse_waste": 0.25}, environ={"PADDLE_EXT_PINNED_REUSE_WASTE": "0"}).reuse_waste == 0.0
    pool = PinnedPool(FakeBackend(), config=RuntimeConfig(), reuse_waste=0.5)
    assert pool._native.options()["reuse_waste"] == 0.5


@pytest.mark.parametrize("source, env, error, message", [
    ({"runtime": {"colour": 1}}, {}, ValueError, r"unknown paddle_ext runtime config keys \['colour'\]; allowed: \["),
    ({"alignment": 100}, {}, ValueError, r"alignment must be a power of two in \[16, 65536\], got 100"),
    ({"chunk_size": -1}, {}, ValueError, r"chunk_size must be in \[0, 1099511627776\], got -1"),
    ({"chunk_size": 1.5}, {}, TypeError, r"chunk_size must be an int in \[0, 1099511627776\], got 1.5"),
    ({}, {"PADDLE_EXT_PINNED_CHUNK_SIZE": "2 parsecs"}, ValueError,
     r"PADDLE_EXT_PINNED_CHUNK_SIZE: expected a byte count such as 4096, 64KiB or 2MiB, got '2 parsecs'"),
    ({}, {"PADDLE_EXT_FREE_IDLE_CHUNK": "maybe"}, ValueError,
     r"PADDLE_EXT_FREE_IDLE_CHUNK: expected one of 1/0, on/off, true/false, yes/no, got 'maybe'"),
    ({}, {"PADDLE_EXT_ALLOC_FILL_VALUE": "300"}, ValueError,
     r"fill_value must be -1 \(off\) or a byte value in \[0, 255\], got 300"),
    ({"mlock": "sometimes"}, {}, ValueError, r"mlock must be one of \['try', 'require', 'off'\], got 'sometimes'"),
    ({"paddle_ext": []}, {}, TypeError, r"config\['paddle_ext'\] must be a mapping, got list"),
    ({"reuse_waste": 1.5}, {}, ValueError, r"reuse_waste must be a fraction in \[0, 1\], got 1.5"),
    ({"reuse_waste": float("nan")}, {}, ValueError, r"reuse_waste must be a fraction in \[0, 1\], got nan"),
    ({"reuse_waste": "lots"}, {}, ValueError,
     r"paddle_ext.runtime.reuse_waste: expected a fraction in \[0, 1\] such as 0.0625, got 'lots'"),
    ({}, {"PADDLE_EXT_PINNED_REUSE_WASTE": "-0.1"}, ValueError, r"reuse_waste must be a fraction in \[0, 1\], got -0.1"),
])
def test_config_errors_name_the_key_value_and_range(source, env, error, message):
    with pytest.raises(error, match=message):
        from_source(source, environ=env)


def test_default_pool_follows_configure(monkeypatch):
    monkeypatch.setattr(runtime.pool, "_default", None)
    monkeypatch.setattr(runtime.pool, "_configured", None)
    cfg = runtime.configure({"paddle_ext": {"runtime": {"backend": "fake", "alignment": 1024}}})
    assert cfg.backend == "fake"
    pool = runtime.default_pool()
    assert pool is runtime.default_pool() and pool.backend == "fake"
    assert pool._native.options()["alignment"] == 1024
    with pytest.raises(ValueError, match="configure\\(\\) must run before the default pinned pool is first used"):
        runtime.configure({})


def test_auto_backend_picks_posix_without_a_device():
    assert runtime.pool.choose_backend("auto") in ("cuda", "hip", "xpu", "posix")
    report = runtime.backends()
    if not any(report.get(b, {}).get("usable") for b in ("cuda", "hip", "xpu")):
        assert PinnedPool(config=RuntimeConfig()).backend == "posix"
    assert report["cpu"] == {"host": False, "events": True, "usable": True, "reason": ""}
    assert report["posix"]["host"] and report["fake"]["host"]


def test_build_info_lists_exactly_the_compiled_backends():
    built = C.build_info()["backends"]
    assert built[:3] == ["cpu", "posix", "fake"] and "xpu" in built
    assert set(built) <= {"cpu", "posix", "fake", "cuda", "hip", "xpu"}
    for name in built:
        assert C.has_host_backend(name) or C.has_event_backend(name)


def test_module_docstring_table_names_every_key():
    for key, var in config_module.ENV.items():
        assert key in config_module.__doc__ and var in config_module.__doc__
