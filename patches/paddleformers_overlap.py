"""part-2 cherry from: [Distributed]Support dp/sharding overlap in virtual pp (#55651), and
[Distributed] dp and sharding overlap together (#56096), carried into the Trainers of
PaddleFormers and of PaddleNLP, its predecessor.

PaddleFormers 1.2.0 refuses `dp_comm_overlap=True` with pipeline parallelism
(TrainingArguments.__post_init__: `ValueError: overlap has accuracy issue`, a TODO about
Paddle's overlap together with delay_scale_loss, which the Trainer always sets); PaddleNLP
2.8.1 refuses the word `enable_dp_comm_overlap` of its `pipeline_parallel_config` string with
the same error. With the plugin's pipeline engine the dp reduction overlapped with the
backward is the same collectives, in the same order, with the same scaling as without
overlap (bitwise equal; parity-tested through both Trainers in
tests/multiproc/test_paddleformers.py and test_paddlenlp.py), so this unit lifts that one
refusal, and only while the pipeline_engine unit serves fleet's models: TrainingArguments
is set up with the switch off and it goes back on afterwards, in the arguments (the Trainer
then leaves the dp reduction to the engine) and in the fleet strategy's pp_configs (the
engine overlaps). TRAINER_ARGS is the table of trainer packages: where each keeps its
TrainingArguments, how it spells the switch, and which attributes hold the degrees.

PaddleNLP's switch is lifted only where nothing else of its set-up reads the word: with
data parallelism alone beside the pipeline. PaddleNLP reads `enable_dp_comm_overlap` and
`enable_sharding_comm_overlap` as one "comm overlap" request, sharding overlap where the
sharding degree is above 1, so with sharding asked for (a `sharding` stage or a sharding
degree) the word stays and PaddleNLP decides as it does; and `enable_sharding_comm_overlap`
beside data parallelism keeps the refusal, since its Trainer, which reads only the dp word,
would all-reduce the gradients the engine already reduced. Under PaddleNLP's
enable_auto_parallel (no fleet.distributed_model) the word is PaddleNLP's to refuse too.

With the plugin's opt-in pp_configs key `early_comm_buffers` (paddle_ext.config),
PaddleFormers' Trainer also shows the engine its optimizer right after wrapping it
(`register_sharding_comm_overlap_hook`), for every checkpoint format: PaddleFormers does so
itself for unified_checkpoint only (after PaddleNLP #9392), and a FlexCheckpoint, its
default format, loaded before the first step otherwise restores no optimizer state under
pp sharding overlap with split_param (pipeline/grad_sync.py: GradReducer.prepare).

The trainer packages are imported by the user, maybe after paddle_ext: the unit patches
each module of MODULES when it is loaded (an import hook), or at once when it already is.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from dataclasses import dataclass
from typing import Any, Callable

from paddle_ext import compat
from paddle_ext.patches._unit import Patcher, PatchUnit

ARGS_MODULE = "paddleformers.trainer.training_args"
TRAINER_MODULE = "paddleformers.trainer.trainer"
NLP_ARGS_MODULE = "paddlenlp.trainer.training_args"
REFUSAL = "overlap has accuracy issue"
NLP_WORD = "enable_dp_comm_overlap"
NLP_SHARDING_WORD = "enable_sharding_comm_overlap"


def _engine_serves() -> bool:
    fleet, _ = compat.fleet_modules()
    return getattr(fleet.distributed_model, "__paddle_ext_unit__", None) == "pipeline_engine"


def _switch_off_field(args: Any) -> Callable[[], None] | None:
    """PaddleFormers: the boolean field dp_comm_overlap (nothing else of its set-up reads it)."""
    if not getattr(args, "dp_comm_overlap", False):
        return None
    args.dp_comm_overlap = False

    def restore() -> None:
        args.dp_comm_overlap = True

    return restore


def _sharding_asked(args: Any) -> bool:
    """Whether PaddleNLP's arguments ask for a sharding degree above 1 (a stage, or a degree:
    PaddleNLP derives one from the stage, and takes a degree given without a stage too)."""
    stage = getattr(args, "sharding", "")
    stages = stage.split() if isinstance(stage, str) else stage
    degree = max(int(getattr(args, "sharding_parallel_degree", -1)), int(getattr(args, "sharding_degree", 0) or 0))
    return bool(stages) or degree > 1


def _switch_off_word(args: Any) -> Callable[[], None] | None:
    """PaddleNLP: the word enable_dp_comm_overlap of pipeline_parallel_config (split on
    spaces, as PaddleNLP splits it), only where it means dp overlap alone (module docstring)."""
    text = getattr(args, "pipeline_parallel_config", "")
    words = text.split(" ") if isinstance(text, str) else []
    if (NLP_WORD not in words or NLP_SHARDING_WORD in words or _sharding_asked(args)
            or getattr(args, "enable_auto_parallel", False)):  # auto parallel refuses the word itself
        return None
    args.pipeline_parallel_config = " ".join(w for w in words if w != NLP_WORD)

    def restore() -> None:
        args.pipeline_parallel_config = text

    return restore


@dataclass(frozen=True)
class TrainerArgs:
    """How one trainer package's TrainingArguments spell the dp-overlap switch.

    switch_off(args) turns the switch off before the arguments' set-up and returns what
    turns it back on, or None where there is nothing to lift; pp / dp name the attributes
    holding the pipeline degree (as given) and the data-parallel degree (after the set-up)."""

    package: str
    switch_off: Callable[[Any], Callable[[], None] | None]
    pp: str
    dp: str


TRAINER_ARGS = {
    ARGS_MODULE: TrainerArgs("PaddleFormers", _switch_off_field, pp="pipeline_model_parallel_size",
                             dp="data_parallel_size"),
    NLP_ARGS_MODULE: TrainerArgs("PaddleNLP", _switch_off_word, pp="pipeline_parallel_degree",
                                 dp="data_parallel_degree"),
}


def _lifted_post_init(original, spelling: TrainerArgs):
    @functools.wraps(original)
    def __post_init__(self) -> None:
        restore = None
        if int(getattr(self, spelling.pp, 1) or 1) > 1 and _engine_serves():
            restore = spelling.switch_off(self)
        if restore is None:
            return original(self)
        try:
            original(self)
        finally:
            restore()
        if int(getattr(self, spelling.dp, 1) or 1) > 1:  # the trainers' own condition for the key
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


def _training_args_patch(spelling: TrainerArgs) -> Callable[[Patcher, Any], None]:
    def patch(patcher: Patcher, module: Any) -> None:
        cls = module.TrainingArguments
        patcher.swap(cls, "__post_init__", _lifted_post_init(vars(cls)["__post_init__"], spelling))

    return patch


def _patch_trainer(patcher: Patcher, module: Any) -> None:
    cls = module.Trainer
    patcher.swap(cls, "_wrap_model", _registering_wrap_model(vars(cls)["_wrap_model"]))


# module -> (its patch, the patched attribute that carries the unit's mark)
MODULES = {**{name: (_training_args_patch(spelling), lambda m: m.TrainingArguments.__post_init__)
              for name, spelling in TRAINER_ARGS.items()},
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


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _unavailable() -> str | None:
    if any(_installed(name.split(".", 1)[0]) for name in TRAINER_ARGS):
        return None
    return ", and ".join(f"{spelling.package} is not installed" for spelling in TRAINER_ARGS.values())


UNIT = PatchUnit(
    name="paddleformers_overlap",
    upstream=(55651, 56096),
    title="Support dp/sharding overlap in virtual pp (PaddleFormers' and PaddleNLP's Trainer)",
    summary="PaddleFormers' and PaddleNLP's TrainingArguments accept dp comm overlap with pp when paddle_ext's engine "
            "serves the model; with early_comm_buffers PaddleFormers' Trainer hands the optimizer to the engine "
            "before loading a checkpoint",
    apply=_apply,
    verify=_verify,
    unavailable=_unavailable,
)
