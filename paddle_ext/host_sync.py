"""Device synchronization where the device is the host.

Paddle's CPU kernels finish before they return, in dynamic and static mode alike,
so "wait for the compute on the CPU to finish" has nothing to wait for and
returns at once. Stock Paddle refuses to say so: on a CPU build
paddle.device.synchronize() raises `TypeError: device should be gpu, xpu, ...`
and paddle.device.cuda.synchronize() raises `RuntimeError: ... not compiled with
CUDA`, which stops training loops written for GPUs (PaddleFormers' Trainer
calls paddle.device.synchronize() after every accumulation) on CPU.

Only the host is answered here: every other device (a GPU string on a CPU
build, an int, a custom device) goes to Paddle's own function unchanged, with
its errors.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from paddle_ext import devices


def names_host(device: Any) -> bool:
    """Whether `device`, as paddle.device.synchronize reads it (None: the current
    expected place, a string such as "cpu", or a place), is the CPU."""
    if device is None:
        place = devices.current_expected_place()
    elif isinstance(device, str):
        if device.strip().lower() != "cpu":
            return False
        place = devices.place_from_string(device)
    else:
        place = device
    return devices.is_cpu_place(place)


def host_aware(original: Callable[..., Any], *, explicit_host: bool) -> Callable[..., None]:
    """`original` (a synchronize function of one optional device) returning at once
    when the device is the host. explicit_host=False leaves every device passed
    explicitly to `original`: paddle.device.cuda.synchronize takes CUDA devices
    only, so there only the current device (None) can be the host."""

    @functools.wraps(original)
    def synchronize(device: Any = None) -> None:
        if (device is None or explicit_host) and names_host(device):
            return None
        return original(device)

    return synchronize
