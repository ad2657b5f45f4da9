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

The step after the first still grows the heap (the optimizer's first step made its states
where that step's activations had been: 1,000-2,500 new pages at 16-64 rows).
`FirstStepWarmer` measures how far the first step grew the heap and faults as much in again
at its end (one block allocated, written and freed: kept, it stays resident at the top of
the heap), so the next steps find their pages there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["SWITCH", "FirstStepWarmer", "heap_bytes", "keep_freed_memory", "kept", "prefault"]

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


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _set_thresholds() -> bool:
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_bytes() -> int:
    """The bytes glibc's main heap holds from the kernel (mallinfo2's arena; 0 without it,
    glibc before 2.33)."""
    fn = getattr(_libc(), "mallinfo2", None)
    if fn is None:
        return 0
    fn.restype = _MallInfo2
    return int(fn().arena)


def prefault(nbytes: int) -> None:
    """Faults `nbytes` of heap in: one block allocated, written and freed (kept freed memory
    stays resident)."""
    libc = _libc()
    if libc is None or nbytes <= 0:
        return
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block = libc.malloc(nbytes)
    if block:
        ctypes.memset(block, 0, nbytes)
        libc.free(block)


class FirstStepWarmer:
    """Around a process's first training step (module docstring): `begin()` before it,
    `end()` after its optimizer step; later calls do nothing. Only where freed memory is
    kept (otherwise the block would go straight back to the kernel)."""

    def __init__(self) -> None:
        self._start: int | None = None
        self.done = False
        self.faulted_in = 0  # bytes end() faulted in

    def begin(self) -> None:
        if not self.done and kept():
            self._start = heap_bytes()

    def end(self) -> None:
        if self.done or self._start is None:
            return
        self.done = True
        self.faulted_in = max(0, heap_bytes() - self._start)
        prefault(self.faulted_in)
