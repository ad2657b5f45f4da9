"""part-1 cherry from: [Dygraph] Add group sharded api (#40129), with dygraph sharding stage 2
(#37707) and stage 3 (#38052), sharding stage 1 with split parameters (#57715) and with fused
optimizer states (#69625), extended to CPU builds.

`paddle.distributed.sharding.group_sharded_parallel` and the stage-2 optimizer's and
stage-3 model's constructors assert a GPU, XPU or custom device, so on a CPU build
PaddleFormers' `sharding="stage2"` / `"stage3"` without pipeline parallelism failed before
its first step. This unit runs Paddle's own classes on the host over the group's gloo
collectives (paddle_ext.host_sharding: the dispatcher builds them with device "cpu"; their
constructors pass their device checks; parameter storage and the clip's norm stay on the
host). Stage 1 with split_param (PaddleFormers' default) failed in fleet's tensor fusion
helper, which knows no host device: it answers "cpu" there now, as does the optimizer's
fused state storage (paddle.optimizer.fusion_utils, 3.x: sharding's
enable_fuse_optimizer_states), which keeps a copy of that lookup. It acts on the device "cpu" only, which Paddle refuses; CPU builds only (GPU builds
keep Paddle's classes as they are). The dispatcher is rebound where a module took it by
name (`paddle.distributed.sharding` exports it).
"""

from __future__ import annotations

import importlib

from paddle_ext import compat, devices
from paddle_ext.host_sharding import (
    clipped_on_host,
    constructed_on_host,
    fusion_alignment_on_host,
    fusion_device_on_host,
    group_sharded_parallel_on_host,
    params_added_on_host,
)
from paddle_ext.patches._unit import Patcher, PatchUnit

PACKAGE = "paddle.distributed.fleet.meta_parallel.sharding"


def _module(name: str):
    return importlib.import_module(f"{PACKAGE}.{name}")


def fusion_module():
    return importlib.import_module("paddle.distributed.fleet.utils.tensor_fusion_helper")


def dispatcher_module():
    return importlib.import_module("paddle.distributed.sharding.group_sharded")


def _targets() -> list[tuple[object, str, object]]:
    """(owner, attribute, the module whose globals it reads) of each constructor patched."""
    optimizer = _module("group_sharded_optimizer_stage2")
    stage3 = _module("group_sharded_stage3")
    return [(optimizer.GroupShardedOptimizerStage2, "__init__", optimizer),
            (stage3.GroupShardedStage3, "__init__", stage3)]


def _apply(patcher: Patcher) -> None:
    dispatcher = dispatcher_module()
    patcher.swap(dispatcher, "group_sharded_parallel",
                 group_sharded_parallel_on_host(dispatcher.group_sharded_parallel, dispatcher), imported=True)
    for owner, name, module in _targets():
        patcher.swap(owner, name, constructed_on_host(vars(owner)[name], module))
    storage = _module("group_sharded_storage").ParamStorage
    patcher.swap(storage, "add_rank_params", params_added_on_host(storage.add_rank_params))
    clip = _module("group_sharded_utils").GroupShardedClipGrad
    patcher.swap(clip, "_dygraph_clip", clipped_on_host(clip._dygraph_clip))
    fusions = [fusion_module()] if compat.tensor_fusion_device_aware() else []  # 2.6 aligns as for gpu
    fusions += [m for m in (compat.optimizer_fusion_module(),) if m is not None]
    for fusion in fusions:
        # imported=True: auto_parallel's modules took both by name
        patcher.swap(fusion, "alignment", fusion_alignment_on_host(fusion.alignment), imported=True)
        patcher.swap(fusion, "get_current_device_type", fusion_device_on_host(fusion.get_current_device_type),
                     imported=True)


def _unavailable() -> str | None:
    build = devices.device_build()
    return None if build == "cpu" else f"a {build} build: group sharding runs on its device"


UNIT = PatchUnit(
    name="host_sharding",
    upstream=(40129, 37707, 38052, 57715, 69625),
    title="Add group sharded api (sharding stage 2 and 3), split param sharding stage 1",
    summary="sharding stage 2 / 3 (group_sharded_parallel) and stage 1 with split_param run on CPU builds",
    apply=_apply,
    requires=_unavailable,
)
