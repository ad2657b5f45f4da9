"""part-1 cherry from: [FlexCheckpoint] Upgrade some macros and optimize load_state_dict
communication (#75282), extended to CPU builds.

#75282 merged FlexCheckpoint's read tasks into one broadcast per tensor and stages each
tensor a rank sends or receives on the GPU (`Tensor.cuda()`), so on a CPU build
`paddle.distributed.load_state_dict` fails with "No available device found" as soon as a
checkpoint has to be exchanged between ranks: PaddleFormers' `resume_from_checkpoint`
under tensor parallelism, say. This unit keeps that staging on the host
(paddle_ext.host_checkpoint): the broadcasts run on gloo. CPU builds only (GPU builds
stage as Paddle does); releases without FlexCheckpoint (2.6, 3.0, 3.1) skip the unit.
The function is rebound where a module took it by name (`paddle.distributed`'s
`load_state_dict` is the same object).
"""

from __future__ import annotations

import importlib

from paddle_ext import devices
from paddle_ext.host_checkpoint import host_staged
from paddle_ext.patches._unit import Patcher, PatchUnit

MODULE = "paddle.distributed.flex_checkpoint.dcp.load_state_dict"
NAME = "load_state_dict"


def owner():
    return importlib.import_module(MODULE)


def _apply(patcher: Patcher) -> None:
    module = owner()
    patcher.swap(module, NAME, host_staged(getattr(module, NAME)), imported=True)


def _unavailable() -> str | None:
    build = devices.device_build()
    if build != "cpu":
        return f"a {build} build: Paddle stages the checkpoint's tensors on its device"
    try:
        owner()
    except ImportError:
        return "this Paddle has no FlexCheckpoint (paddle.distributed.flex_checkpoint: 3.2 and later)"
    return None


UNIT = PatchUnit(
    name="host_checkpoint",
    upstream=(75282,),
    title="Upgrade some macros and optimize load_state_dict communication",
    summary="paddle.distributed.load_state_dict (FlexCheckpoint) reshards over gloo on CPU builds",
    apply=_apply,
    requires=_unavailable,  # the doctor names the release FlexCheckpoint came with (3.2)
)
