"""Paddle's device API as paddle_ext uses it: what the build is for, places, streams, events.

The same in every supported release (2.6.2, 3.0-3.3.x); where the releases differ the
function lives in paddle_ext.compat instead.
"""

from __future__ import annotations

from typing import Any


def device_build() -> str:
    """'cuda', 'rocm', 'xpu' or 'cpu': what the installed Paddle was compiled for."""
    import paddle

    if paddle.is_compiled_with_rocm():
        return "rocm"
    if paddle.is_compiled_with_cuda():
        return "cuda"
    if paddle.is_compiled_with_xpu():
        return "xpu"
    return "cpu"


def tensor_device_kind() -> str:
    """'cpu' when new tensors go to the CPU, 'gpu' for CUDA/ROCm places, else the
    device type Paddle reports (xpu, npu, ...)."""
    import paddle

    device = paddle.get_device()
    kind = device.split(":", 1)[0]
    return "gpu" if kind in ("gpu", "cuda") else kind


def current_expected_place() -> Any:
    """The place new tensors go to (paddle.set_device's): paddle.framework's
    _current_expected_place_ (2.6.2 and 3.x alike; its _current_expected_place answers a
    generic Place while a PIR program is being built)."""
    from paddle import framework

    return framework._current_expected_place_()


def place_from_string(device: str) -> Any:
    """A device string ("cpu", "gpu:0") as the place paddle.device.synchronize reads it."""
    import paddle

    return paddle.device._convert_to_place(device)


def is_cpu_place(place: Any) -> bool:
    """CPUPlace, or a generic Place that holds the CPU (both releases have both)."""
    from paddle.base import core

    if isinstance(place, core.CPUPlace):
        return True
    return isinstance(place, core.Place) and place.is_cpu_place()


def new_stream() -> Any:
    """A new stream on the current device (paddle.device.Stream on 2.6 and 3.x)."""
    import paddle

    return paddle.device.Stream()


def current_stream() -> Any:
    import paddle

    return paddle.device.current_stream()


def stream_guard(stream: Any) -> Any:
    """Context in which ops (and calc-stream collectives) run on `stream`."""
    import paddle

    return paddle.device.stream_guard(stream)


def raw_stream(stream: Any) -> Any:
    """What paddle_ext.runtime.Event takes for a Paddle stream: its stream_base, which
    carries the native handle (.cuda_stream) on 2.6 and 3.x."""
    return getattr(stream, "stream_base", stream)


class _PaddleEvent:
    """Paddle's device event with record(stream) / wait(stream) (a stream waits on it)."""

    def __init__(self, enable_timing: bool) -> None:
        import paddle

        # 2.6: Event(device=None, enable_timing=...); 3.x: Event(enable_timing=...)
        self.event = paddle.device.Event(enable_timing=enable_timing)

    def record(self, stream: Any) -> None:
        self.event.record(stream)

    def wait(self, stream: Any) -> None:
        stream.wait_event(self.event)


def paddle_device_event(enable_timing: bool = False) -> Any:
    return _PaddleEvent(enable_timing)
