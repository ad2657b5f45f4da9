"""part-2 cherry from: [Distributed]Support dp/sharding overlap in virtual pp (#55651), and
[Distributed] dp and sharding overlap together (#56096), carried into PaddleFormers' Trainer.

PaddleFormers 1.2.0 refuses `dp_comm_overlap=True` with pipeline parallelism
(TrainingArguments.__post_init__: `ValueError: overlap has accuracy issue`, a TODO about
Paddle's overlap together with delay_scale_loss, which the Trainer always sets). With the
plugin's pipeline engine the dp reduction overlapped with the backward is the same
collectives, in the same order, with the same scaling as without overlap (bitwise equal;
parity-tested through the Trainer in tests/multiproc/test_paddleformers.py), so this unit
lifts that one refusal, and only while the pipeline_engine unit serves fleet's models:
TrainingArguments is set up with the flag off (nothing else in its set-up reads it) and
the flag goes back on afterwards, in the arguments (the Trainer then leaves the dp
reduction to the engine) and in the fleet strategy's pp_configs (the engine overlaps).

PaddleFormers is imported by the user, maybe after paddle_ext: the unit patches
`paddleformers.trainer.training_args` when that module is loaded (an import hook), or at
once when it already is.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from typing import Any

from paddle_ext import compat
from paddle_ext.patches._unit import Patcher, PatchUnit

MODULE = "paddleformers.trainer.training_args"
REFUSAL = "overlap has accuracy issue"


def _engine_serves() -> bool:
    fleet, _ = compat.fleet_modules()
    return getattr(fleet.distributed_model, "__paddle_ext_unit__", None) == "pipeline_engine"


def _lifted_post_init(original):
    @functools.wraps(original)
    def __post_init__(self) -> None:
        lift = (bool(getattr(self, "dp_comm_overlap", False)) and int(getattr(self, "pipeline_model_parallel_size", 1)) > 1
                and _engine_serves())
        if not lift:
            return original(self)
        self.dp_comm_overlap = False
        try:
            original(self)
        finally:
            self.dp_comm_overlap = True
        if int(getattr(self, "data_parallel_size", 1)) > 1:  # PaddleFormers' own condition for the key
            strategy = compat.fleet_strategy()
            if strategy is not None:
                strategy.hybrid_configs = {"pp_configs": {"dp_comm_overlap": True}}

    __post_init__.__paddle_ext_unit__ = "paddleformers_overlap"
    return __post_init__


def _patch_module(patcher: Patcher, module: Any) -> None:
    cls = module.TrainingArguments
    patcher.swap(cls, "__post_init__", _lifted_post_init(vars(cls)["__post_init__"]))


class _Hook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Patches the module right after it is executed, once. `active` is set through the
    unit's patcher: after the unit is reverted the hook is inert (and leaves
    sys.meta_path at its next call)."""

    active = False

    def __init__(self, patcher: Patcher) -> None:
        self.patcher = patcher
        self._loader: Any = None

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not self.active:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            return None
        if fullname != MODULE:
            return None
        sys.meta_path.remove(self)  # find the real spec, and hook only once
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _patch_module(self.patcher, module)


def _apply(patcher: Patcher) -> None:
    module = sys.modules.get(MODULE)
    if module is not None:
        _patch_module(patcher, module)
        return
    hook = _Hook(patcher)
    patcher.swap(hook, "active", True)
    sys.meta_path.insert(0, hook)


def _verify() -> bool:
    module = sys.modules.get(MODULE)
    if module is None:
        return any(isinstance(f, _Hook) and f.active for f in sys.meta_path)
    return getattr(module.TrainingArguments.__post_init__, "__paddle_ext_unit__", None) == "paddleformers_overlap"


def _unavailable() -> str | None:
    try:
        found = importlib.util.find_spec("paddleformers") is not None
    except (ImportError, ValueError):
        found = False
    return None if found else "PaddleFormers is not installed"


UNIT = PatchUnit(
    name="paddleformers_overlap",
    upstream=(55651, 56096),
    title="Support dp/sharding overlap in virtual pp (PaddleFormers' Trainer)",
    summary="PaddleFormers' TrainingArguments accept dp_comm_overlap with pp when paddle_ext's engine serves the model",
    apply=_apply,
    verify=_verify,
    unavailable=_unavailable,
)
