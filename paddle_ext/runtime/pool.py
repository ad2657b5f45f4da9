"""PinnedPool: page-locked host buffers from the auto-growth best-fit allocator
(upstream PaddlePaddle/Paddle#57625), usable as numpy arrays and, without a
copy, as Paddle CPU tensors.

    pool = PinnedPool()                          # backend from config / environment
    x = pool.empty((8, 1024), np.float32)        # numpy array in pinned memory
    ...                                          # start an async copy from x on `stream`
    pool.record_event(x, stream)                 # x's block waits for `stream` once freed
    del x                                        # freed; reused after the copy completed

A block is freed when the last reference to it goes away: its PinnedBuffer,
every numpy view and every tensor made from it.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Sequence, Union

import numpy as np

from paddle_ext.runtime import config as config_module
from paddle_ext.runtime._native import native
from paddle_ext.runtime.config import DebugFlags, RuntimeConfig
from paddle_ext.runtime.event import StreamLike, stream_handle
from paddle_ext.runtime.stats import PoolStats

Shape = Union[int, Sequence[int]]


class PinnedBuffer:
    """One block of a pinned pool; ``ptr`` and ``nbytes`` describe it."""

    def __init__(self, pool: PinnedPool, block: Any, nbytes: int) -> None:
        self._pool = pool
        self._block = block
        self.nbytes = nbytes

    @property
    def ptr(self) -> int:
        return int(self._block.ptr)

    def numpy(self, dtype: Any = np.uint8, shape: Shape | None = None) -> np.ndarray:
        """A writable numpy view of the block (no copy)."""
        dtype = np.dtype(dtype)
        count = self.nbytes // dtype.itemsize
        array = np.frombuffer(self._block, dtype=dtype, count=count)
        return array if shape is None else array.reshape(shape)

    def tensor(self, dtype: Any = np.float32, shape: Shape | None = None) -> Any:
        """A Paddle CPU tensor over the block, shared through DLPack (no copy)."""
        return as_tensor(self.numpy(dtype, shape))

    def record_event(self, stream: StreamLike = None, device: int = -1) -> bool:
        return self._pool.record_event(self, stream, device)

    def __repr__(self) -> str:
        return f"PinnedBuffer(ptr=0x{self.ptr:x}, nbytes={self.nbytes}, backend={self._pool.backend!r})"


def as_tensor(array: np.ndarray) -> Any:
    """A Paddle tensor sharing `array`'s memory (which keeps its block alive).
    Paddle >= 3.0 only: 2.6 cannot share host memory without a copy."""
    from paddle_ext import compat

    return compat.tensor_sharing_host_memory(array)


def _block_of(obj: Any) -> Any:
    """The native block behind a PinnedBuffer or an array viewing one, else None."""
    C = native()
    if isinstance(obj, PinnedBuffer):
        return obj._block
    seen = 0
    while obj is not None and seen < 64:
        if isinstance(obj, C.Block):
            return obj
        obj = obj.obj if isinstance(obj, memoryview) else getattr(obj, "base", None)
        seen += 1
    return None


def choose_backend(name: str) -> str:
    """'auto' -> the first usable of cuda, hip, xpu, else posix."""
    if name != "auto":
        return name
    C = native()
    for candidate in ("cuda", "hip", "xpu"):
        if C.has_host_backend(candidate) and C.unavailable_reason(candidate) == "":
            return candidate
    return "posix"


class PinnedPool:
    """A caching pool of pinned host memory over one backend (thread-safe)."""

    def __init__(self, backend: str | Any = None, *, config: RuntimeConfig | None = None,
                 alignment: int | None = None, chunk_size: int | None = None,
                 max_cached_bytes: int | None = None, trim_on_growth: bool | None = None,
                 reuse_waste: float | None = None, mlock: str | None = None, flags: DebugFlags | None = None) -> None:
        """backend: 'auto', 'posix', 'cuda', 'hip', 'xpu', 'fake', or a backend object
        (paddle_ext.runtime.FakeBackend / PosixBackend); None takes config.backend.
        config: defaults to paddle_ext.runtime.config.from_source() (environment).
        The keyword arguments override single settings of config."""
        C = native()
        cfg = config if config is not None else config_module.from_source()
        overrides = {k: v for k, v in (("alignment", alignment), ("chunk_size", chunk_size),
                                       ("max_cached_bytes", max_cached_bytes),
                                       ("trim_on_growth", trim_on_growth), ("reuse_waste", reuse_waste),
                                       ("mlock", mlock),
                                       ("flags", flags)) if v is not None}
        if isinstance(backend, str):
            overrides["backend"] = backend
        if overrides:
            cfg = dataclasses.replace(cfg, **overrides)
        self.config = cfg
        run = cfg.effective()
        if backend is None or isinstance(backend, str):
            name = choose_backend(cfg.backend)
            backend = C.PosixBackend(mlock=cfg.mlock) if name == "posix" else C.make_host_backend(name)
        elif not isinstance(backend, C.HostBackend):
            raise TypeError(f"backend must be a name or a paddle_ext.runtime backend object, "
                            f"got {type(backend).__name__}")
        self._native = C.HostAllocator(
            backend, alignment=run.alignment, chunk_size=run.chunk_size,
            max_cached_bytes=run.max_cached_bytes, trim_on_growth=run.trim_on_growth,
            reuse_waste=run.reuse_waste, fill_value=run.flags.fill_value,
            sync_after_alloc=run.flags.sync_after_alloc, dump_chunks=run.flags.dump_chunks,
            free_idle_chunk=run.flags.free_idle_chunk)
        self.backend_object = backend

    @property
    def backend(self) -> str:
        return str(self._native.backend)

    def allocate(self, nbytes: int) -> PinnedBuffer:
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
        return PinnedBuffer(self, self._native.allocate_block(int(nbytes)), int(nbytes))

    def empty(self, shape: Shape, dtype: Any = np.float32) -> np.ndarray:
        """An uninitialised numpy array in pinned memory."""
        dtype = np.dtype(dtype)
        dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in dims):
            raise ValueError(f"shape must be non-negative ints, got {shape!r}")
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        return self.allocate(count * dtype.itemsize).numpy(dtype, dims)

    def copy_of(self, array: Any) -> np.ndarray:
        """A pinned copy of an array (numpy, or anything np.asarray takes: a CPU tensor)."""
        source = np.asarray(array.numpy() if hasattr(array, "numpy") and not isinstance(array, np.ndarray)
                            else array)
        out = self.empty(source.shape, source.dtype)
        np.copyto(out, source)
        return out

    def record_event(self, obj: PinnedBuffer | np.ndarray | int, stream: StreamLike = None,
                     device: int = -1) -> bool:
        """Marks obj's block as read by `stream`: once freed, it is reused only after
        the work now on `stream` completed. obj: a PinnedBuffer, an array viewing one
        (any offset) or the block's start address. False if obj is no live block here."""
        if isinstance(obj, int) and not isinstance(obj, bool):
            ptr = obj
        else:
            block = _block_of(obj)
            if block is None or block.pool is not self._native:
                return False
            ptr = int(block.ptr)
        return bool(self._native.record_event(ptr, stream_handle(stream), device))

    def poll(self) -> int:
        """Returns pending blocks whose events completed; how many."""
        return int(self._native.poll_events())

    def empty_cache(self) -> None:
        """Polls events, then gives every entirely free chunk back to the backend."""
        self._native.empty_cache()

    def stats(self) -> PoolStats:
        return PoolStats.from_native(self._native.stats())

    def backend_counters(self) -> dict[str, int]:
        """Backend-specific counters, e.g. posix locked_bytes / unlocked_bytes / mlock_failures."""
        return dict(self._native.backend_counters())

    @property
    def flags(self) -> DebugFlags:
        return DebugFlags(**self._native.debug_flags())

    def set_flags(self, flags: DebugFlags) -> None:
        if not isinstance(flags, DebugFlags):
            raise TypeError(f"flags must be a DebugFlags, got {type(flags).__name__}")
        self._native.set_debug_flags(fill_value=flags.fill_value, sync_after_alloc=flags.sync_after_alloc,
                                     dump_chunks=flags.dump_chunks, free_idle_chunk=flags.free_idle_chunk)

    def dump(self) -> str:
        """The chunk layout: one line per chunk, blocks as A(llocated)/F(ree)/P(ending) + size."""
        return str(self._native.dump())

    def check(self) -> None:
        """Raises RuntimeError if an internal invariant is broken (a bug)."""
        self._native.check_invariants()

    def __repr__(self) -> str:
        s = self.stats()
        return (f"PinnedPool(backend={self.backend!r}, reserved={s.reserved_bytes}, "
                f"allocated={s.allocated_bytes}, chunks={s.chunks})")


_default_lock = threading.Lock()
_default: PinnedPool | None = None


def default_pool() -> PinnedPool:
    """The process's pool, built on first use from the environment or configure()."""
    global _default
    with _default_lock:
        if _default is None:
            _default = PinnedPool(config=_configured)
        return _default


_configured: RuntimeConfig | None = None


def configure(source: Any = None) -> RuntimeConfig:
    """Sets the config of the default pool from a strategy-style mapping (before it
    is first used; afterwards a ValueError)."""
    global _configured
    cfg = config_module.from_source(source)
    with _default_lock:
        if _default is not None:
            raise ValueError("configure() must run before the default pinned pool is first used")
        _configured = cfg
    return cfg
