"""Keep freed host memory in the process (glibc's malloc), so that training steps on CPU
stop page-faulting once warm.

Paddle's CPU tensors come from glibc's malloc. By default glibc gives memory back to the
kernel whenever the top of its heap holds more than 128 KiB free (M_TRIM_THRESHOLD) and
serves blocks above a moving threshold (128 KiB up to 32 MiB) with a fresh mmap each time:
every step then shrinks the heap at its end and grows it again in the next, and each
page it grows by is a page fault plus a zeroed page (seen in a pp2 CPU pipeline: brk
growing and shrinking by 1 MiB every step, 250-1,000 minor faults a step once warm, 1,000-2,000
in the steps after the first; issue 41). Paddle's GPU allocator keeps what it allocated
for the same reason.

`keep_freed_memory()` sets the trim threshold to 1 GiB and the mmap threshold to glibc's
largest, 32 MiB (a fixed value also stops glibc's own adjusting): freed blocks under 32 MiB
stay in the heap for the next step. The cost is that the process keeps its peak heap
(less 1 GiB of slack it would still return). The pipeline engine calls it when its
transfers run on gloo (a CPU job); PADDLE_EXT_HOST_HEAP=default leaves glibc's settings
alone. Where the C library is not glibc (no mallopt) nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["SWITCH", "keep_freed_memory", "kept"]

SWITCH = "PADDLE_EXT_HOST_HEAP"  # "keep" (default) or "default" (glibc's own)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
TRIM_THRESHOLD = 1 << 30
MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: larger is refused
_STATE: dict[str, bool] = {}


def kept() -> bool:
    """Whether this process keeps freed heap memory (keep_freed_memory took effect)."""
    return _STATE.get("kept", False)


def keep_freed_memory() -> bool:
    """Sets glibc's trim and mmap thresholds as the module docstring says, once per
    process; True when they are set (now or before)."""
    if "kept" in _STATE:
        return _STATE["kept"]
    choice = os.environ.get(SWITCH, "keep").strip().lower() or "keep"
    if choice not in ("keep", "default"):
        raise ValueError(f"{SWITCH} = {os.environ.get(SWITCH)!r} is not allowed: 'keep' or 'default'")
    _STATE["kept"] = choice == "keep" and _set_thresholds()
    return _STATE["kept"]


def _set_thresholds() -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
