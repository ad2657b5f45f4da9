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
engine overlaps). paddle_ext.trainer_overlap.TRAINER_ARGS is the table of trainer packages: where each keeps
its TrainingArguments, how it spells the switch, and which attributes hold the degrees.

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
each module of MODULES when it is loaded (an import hook, patches/_unit.on_import), or at
once when it already is.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from paddle_ext import trainer_overlap as impl
from paddle_ext.patches._unit import Patcher, PatchUnit, import_hook_problems, on_import


def _patch_training_args(spelling: impl.TrainerArgs):
    def patch(patcher: Patcher, module: Any) -> None:
        cls = module.TrainingArguments
        patcher.swap(cls, "__post_init__", impl.lifted_post_init(vars(cls)["__post_init__"], spelling))

    return patch


def _patch_trainer(patcher: Patcher, module: Any) -> None:
    cls = module.Trainer
    patcher.swap(cls, "_wrap_model", impl.registering_wrap_model(vars(cls)["_wrap_model"]))


# module -> its patch, run when the module is loaded (at once where it already is)
MODULES = {**{name: _patch_training_args(spelling) for name, spelling in impl.TRAINER_ARGS.items()},
           impl.TRAINER_MODULE: _patch_trainer}


def _apply(patcher: Patcher) -> None:
    for name, patch in MODULES.items():
        on_import(patcher, name, patch)


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _unavailable() -> str | None:
    if any(_installed(name.split(".", 1)[0]) for name in impl.TRAINER_ARGS):
        return None
    return ", and ".join(f"{spelling.package} is not installed" for spelling in impl.TRAINER_ARGS.values())


UNIT = PatchUnit(
    name="paddleformers_overlap",
    upstream=(55651, 56096),
    title="Support dp/sharding overlap in virtual pp (PaddleFormers' and PaddleNLP's Trainer)",
    summary="PaddleFormers' and PaddleNLP's TrainingArguments accept dp comm overlap with pp when paddle_ext's engine "
            "serves the model; with early_comm_buffers PaddleFormers' Trainer hands the optimizer to the engine "
            "before loading a checkpoint",
    apply=_apply,
    requires=_unavailable,
    # beyond the swaps: a trainer module not imported yet still has its import hook waiting
    check=import_hook_problems,
)
