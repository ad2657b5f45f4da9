"""paddle_ext.runtime: the Python face of the native runtime (csrc/runtime).

- PinnedPool: pinned host memory from an auto-growth best-fit allocator with
  stream-ordered reuse (record_event), empty_cache, stats and debug flags;
  buffers usable as numpy arrays and as Paddle tensors without a copy.
- Event: a device event, timing-free by default, created lazily.
- DeviceError (.backend, .code, .name) for every native failure, and its
  MemoryError subtype OutOfMemoryError.
- backends(): what this build carries and whether each can run here.

See docs/runtime.md.
"""

from __future__ import annotations

from typing import Any

from paddle_ext.runtime._native import native
from paddle_ext.runtime.config import DebugFlags, RuntimeConfig, from_source
from paddle_ext.runtime.event import CpuStream, Event, stream_handle
from paddle_ext.runtime.pool import PinnedBuffer, PinnedPool, as_tensor, configure, default_pool
from paddle_ext.runtime.stats import PoolStats

_C = native()
DeviceError = _C.DeviceError
OutOfMemoryError = _C.OutOfMemoryError
FakeBackend = _C.FakeBackend
PosixBackend = _C.PosixBackend

__all__ = [
    "CpuStream", "DebugFlags", "DeviceError", "Event", "FakeBackend", "OutOfMemoryError", "PinnedBuffer",
    "PinnedPool", "PoolStats", "PosixBackend", "RuntimeConfig", "as_tensor", "backends", "configure",
    "default_pool", "from_source", "stream_handle",
]


def backends() -> dict[str, dict[str, Any]]:
    """{name: {"host": bool, "events": bool, "usable": bool, "reason": str}} for every
    backend compiled into this build (asks each runtime whether it has a device)."""
    out = {}
    for name in _C.build_info()["backends"]:
        reason = _C.unavailable_reason(name)
        out[name] = {"host": bool(_C.has_host_backend(name)), "events": bool(_C.has_event_backend(name)),
                     "usable": reason == "", "reason": reason}
    return out
