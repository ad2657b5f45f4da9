"""Event: a device event that is timing-free unless asked otherwise, and CpuStream,
the cpu backend's streams (the test double of a device queue).

    ev = Event("cuda")                       # no runtime call yet
    ev.record(paddle.device.current_stream())
    ev.wait(comm_stream)                     # comm_stream waits on the GPU, not the host

Timing is off by default because a timing event serialises the GPU's queues
under CUDA_DEVICE_MAX_CONNECTIONS=1 and so kills communication/compute
overlap (upstream PaddlePaddle/Paddle#57574); ask for enable_timing=True only
to call elapsed_time.
"""

from __future__ import annotations

from typing import Any, Union

from paddle_ext.runtime._native import native

DEVICES = ("cpu", "cuda", "hip", "xpu", "gpu")
_STREAM_ATTRS = ("cuda_stream", "hip_stream", "xpu_stream", "raw_stream", "stream_id")

StreamLike = Union[int, "CpuStream", Any, None]


def stream_handle(stream: StreamLike) -> int:
    """The native handle of a stream: None -> 0 (the default stream), an int as
    is, a CpuStream its id, a Paddle stream its raw handle (``.cuda_stream``,
    through ``.stream_base`` for paddle.device.Stream)."""
    if stream is None:
        return 0
    if isinstance(stream, CpuStream):
        return stream.id
    if isinstance(stream, int) and not isinstance(stream, bool):
        if stream < 0:
            raise ValueError(f"stream must be a non-negative handle, got {stream}")
        return stream
    # paddle.device.Stream (2.6 and 3.x) wraps the core stream that carries the handle.
    stream = getattr(stream, "stream_base", stream)
    for attr in _STREAM_ATTRS:
        value = getattr(stream, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise TypeError(
        f"stream must be None, an int handle, a CpuStream or a Paddle stream (with one of "
        f"{list(_STREAM_ATTRS)}), got {type(stream).__name__}")


def resolve_device(device: str) -> tuple[str, int]:
    """'cuda', 'gpu:1', 'xpu:0', 'cpu' -> (event backend, device id or -1)."""
    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'cpu', 'cuda', 'gpu:0', got {device!r}")
    kind, _, index = device.partition(":")
    kind = kind.strip().lower()
    if kind not in DEVICES:
        raise ValueError(f"device must be one of {list(DEVICES)} (optionally ':N'), got {device!r}")
    device_id = -1
    if index:
        if not index.isdigit():
            raise ValueError(f"device index must be a non-negative int, got {device!r}")
        device_id = int(index)
    if kind == "gpu":
        C = native()
        kind = "cuda" if C.has_event_backend("cuda") else "hip" if C.has_event_backend("hip") else "cuda"
    return kind, device_id


class Event:
    """A device event with explicit options; the native event is created at the
    first record(), so constructing one never touches the runtime."""

    def __init__(self, device: str = "cpu", *, device_id: int | None = None, enable_timing: bool = False,
                 blocking: bool = False, interprocess: bool = False) -> None:
        for name, value in (("enable_timing", enable_timing), ("blocking", blocking),
                            ("interprocess", interprocess)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {value!r}")
        backend, index = resolve_device(device)
        if device_id is not None:
            if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < -1:
                raise ValueError(f"device_id must be an int >= -1 (-1: the current device), got {device_id!r}")
            index = device_id
        self._event = native().DeviceEvent(backend, device=index, enable_timing=enable_timing,
                                           blocking=blocking, interprocess=interprocess)

    def record(self, stream: StreamLike = None) -> None:
        """Captures the work submitted to `stream` so far."""
        self._event.record(stream_handle(stream))

    def query(self) -> bool:
        """True once the captured work completed (or if never recorded)."""
        return bool(self._event.query())

    def synchronize(self) -> None:
        """Blocks the calling thread until the captured work completed."""
        self._event.synchronize()

    def wait(self, stream: StreamLike = None) -> None:
        """Work submitted to `stream` from now on waits for this event (no host wait)."""
        self._event.wait(stream_handle(stream))

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds from this event to `end`; both need enable_timing=True."""
        if not isinstance(end, Event):
            raise TypeError(f"end must be an Event, got {type(end).__name__}")
        return float(self._event.elapsed_ms(end._event))

    @property
    def backend(self) -> str:
        return str(self._event.backend)

    @property
    def created(self) -> bool:
        """Whether the native event exists yet (it is made by the first record)."""
        return bool(self._event.created)

    @property
    def native_flags(self) -> int:
        """The runtime's creation flags for these options (cudaEventDisableTiming = 2, ...)."""
        return int(self._event.native_flags)

    @property
    def options(self) -> dict[str, bool]:
        return dict(self._event.options)

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"Event({self.backend!r}, {opts}, created={self.created})"


class CpuStream:
    """A stream of the cpu backend. Work on it completes at once unless the
    stream is held, which lets tests play the device: hold(), then step(n) or
    release() to complete what was recorded."""

    def __init__(self, id: int) -> None:
        if isinstance(id, bool) or not isinstance(id, int) or id < 0:
            raise ValueError(f"id must be a non-negative int, got {id!r}")
        self.id = id

    def hold(self) -> None:
        native().cpu_stream_hold(self.id)

    def step(self, count: int = 1) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"count must be a non-negative int, got {count!r}")
        native().cpu_stream_step(self.id, count)

    def release(self) -> None:
        native().cpu_stream_release(self.id)

    @property
    def outstanding(self) -> int:
        """Recorded work not completed yet."""
        return int(native().cpu_stream_outstanding(self.id))

    def __repr__(self) -> str:
        return f"CpuStream({self.id})"
