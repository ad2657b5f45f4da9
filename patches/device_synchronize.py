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

import importlib

from paddle_ext import compat
from paddle_ext.host_sync import host_aware
from paddle_ext.patches._unit import Patcher, PatchUnit

# (module, whether an explicitly named CPU device is answered too)
TARGETS = (("paddle.device", True), ("paddle.device.cuda", False))
NAME = "synchronize"
MARK = "device_synchronize"


def owners() -> list:
    return [importlib.import_module(module) for module, _ in TARGETS]


def _apply(patcher: Patcher) -> None:
    for owner, (_, explicit_host) in zip(owners(), TARGETS):
        wrapper = host_aware(getattr(owner, NAME), explicit_host=explicit_host)
        wrapper.__paddle_ext_unit__ = MARK
        patcher.swap(owner, NAME, wrapper)


def _verify() -> bool:
    return all(getattr(getattr(owner, NAME), "__paddle_ext_unit__", None) == MARK for owner in owners())


def _unavailable() -> str | None:
    build = compat.device_build()
    if build != "cpu":
        return f"a {build} build: Paddle's own synchronize serves it"
    return None


UNIT = PatchUnit(
    name="device_synchronize",
    upstream=(56451,),
    title="device synchronize on the host",
    summary="paddle.device.synchronize() and paddle.device.cuda.synchronize() return for the CPU on CPU builds",
    apply=_apply,
    verify=_verify,
    unavailable=_unavailable,
)
