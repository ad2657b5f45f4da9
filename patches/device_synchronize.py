"""cherry from: #56451, device synchronization on the host.

On a CPU build stock Paddle refuses to synchronize the CPU:
paddle.device.synchronize() (also reached through paddle.cuda.synchronize on
3.x) raises `TypeError: device should be gpu, xpu, ...`, and the deprecated
paddle.device.cuda.synchronize() with no device raises `RuntimeError: Paddle is
not compiled with CUDA`. Training loops written for GPUs call them between
steps (PaddleFormers' Trainer after every accumulation, fleet's perf probes),
so they stop on CPU. CPU kernels finish before they return; this unit makes
both functions return for the host (paddle_ext.host_sync) and leaves every
other device to Paddle, errors included.

Applied on CPU builds only: a GPU, ROCm or XPU build keeps Paddle's functions
exactly (the unit reports itself skipped there). Code that imported the
functions before enable() keeps the objects it imported.
"""

from __future__ import annotations

import functools

from paddle_ext import devices
from paddle_ext.host_sync import host_aware
from paddle_ext.patches._unit import Patcher, PatchUnit, Wrap, install, resolve

NAME = "synchronize"
# explicit_host: whether an explicitly named CPU device is answered too
TABLE = (Wrap("paddle.device", NAME, functools.partial(host_aware, explicit_host=True)),
         Wrap("paddle.device.cuda", NAME, functools.partial(host_aware, explicit_host=False)))


def owners() -> list:
    return [resolve(row.owner) for row in TABLE]


def _apply(patcher: Patcher) -> None:
    install(patcher, TABLE)


def _unavailable() -> str | None:
    build = devices.device_build()
    if build != "cpu":
        return f"a {build} build: Paddle's own synchronize serves it"
    return None


UNIT = PatchUnit(
    name="device_synchronize",
    upstream=(56451,),
    title="device synchronize on the host",
    summary="paddle.device.synchronize() and paddle.device.cuda.synchronize() return for the CPU on CPU builds",
    apply=_apply,
    requires=_unavailable,
)
