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

With the plugin's opt-in pp_configs key `early_comm_buffers` (paddle_ext.config), the
Trainer also shows the engine its optimizer right after wrapping it
(`register_sharding_comm_overlap_hook`), for every checkpoint format: PaddleFormers does so
itself for unified_checkpoint only (after PaddleNLP #9392), and a FlexCheckpoint, its
default format, loaded before the first step otherwise restores no optimizer state under
pp sharding overlap with split_param (pipeline/grad_sync.py: GradReducer.prepare).

PaddleFormers is imported by the user, maybe after paddle_ext: the unit patches
`paddleformers.trainer.training_args` and `paddleformers.trainer.trainer` when each is
loaded (an import hook), or at once when it already is.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from typing import Any

from paddle_ext import compat
from paddle_ext.patches._unit import Patcher, PatchUnit

ARGS_MODULE = "paddleformers.trainer.training_args"
TRAINER_MODULE = "paddleformers.trainer.trainer"
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


def _shows_optimizer_early(engine: Any) -> bool:
    """Whether the wrapped model is paddle_ext's engine overlapping the sharding reduction
    under the early_comm_buffers key."""
    from paddle_ext.pipeline.engine import PipelineEngine

    sync = getattr(engine, "_grad_sync", None)
    return (isinstance(engine, PipelineEngine) and sync is not None and sync.settings.early_comm_buffers
            and engine._sharding_comm_overlap)


def _registering_wrap_model(original):
    @functools.wraps(original)
    def _wrap_model(self, model, *args, **kwargs):
        wrapped = original(self, model, *args, **kwargs)
        if getattr(self, "optimizer", None) is not None and _shows_optimizer_early(wrapped):
            wrapped.register_sharding_comm_overlap_hook(self.optimizer)
        return wrapped

    _wrap_model.__paddle_ext_unit__ = "paddleformers_overlap"
    return _wrap_model


def _patch_training_args(patcher: Patcher, module: Any) -> None:
    cls = module.TrainingArguments
    patcher.swap(cls, "__post_init__", _lifted_post_init(vars(cls)["__post_init__"]))


def _patch_trainer(patcher: Patcher, module: Any) -> None:
    cls = module.Trainer
    patcher.swap(cls, "_wrap_model", _registering_wrap_model(vars(cls)["_wrap_model"]))


# module -> (its patch, the patched attribute that carries the unit's mark)
MODULES = {ARGS_MODULE: (_patch_training_args, lambda m: m.TrainingArguments.__post_init__),
           TRAINER_MODULE: (_patch_trainer, lambda m: m.Trainer._wrap_model)}


class _Hook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Patches one module right after it is executed, once. `active` is set through the
    unit's patcher: after the unit is reverted the hook is inert (and leaves
    sys.meta_path at its next call)."""

    active = False

    def __init__(self, patcher: Patcher, module: str) -> None:
        self.patcher = patcher
        self.module = module
        self._loader: Any = None

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not self.active:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            return None
        if fullname != self.module:
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
        MODULES[self.module][0](self.patcher, module)


def _apply(patcher: Patcher) -> None:
    for name, (patch, _) in MODULES.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(patcher, module)
            continue
        hook = _Hook(patcher, name)
        patcher.swap(hook, "active", True)
        sys.meta_path.insert(0, hook)


def _verify() -> bool:
    for name, (_, patched) in MODULES.items():
        module = sys.modules.get(name)
        if module is None:
            if not any(isinstance(f, _Hook) and f.active and f.module == name for f in sys.meta_path):
                return False
        elif getattr(patched(module), "__paddle_ext_unit__", None) != "paddleformers_overlap":
            return False
    return True


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
    summary="PaddleFormers' TrainingArguments accept dp_comm_overlap with pp when paddle_ext's engine serves the model; "
            "with early_comm_buffers its Trainer hands the optimizer to the engine before loading a checkpoint",
    apply=_apply,
    verify=_verify,
    unavailable=_unavailable,
)
