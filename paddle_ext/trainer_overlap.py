"""dp comm overlap with pipeline parallelism in the Trainers of PaddleFormers and of
PaddleNLP (upstream #55651, #56096 as those Trainers see them): the wrappers the
paddleformers_overlap patch unit installs, and TRAINER_ARGS, how each trainer package
spells the switch. patches/paddleformers_overlap.py says what is lifted, where, and why.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from paddle_ext import upstream
from paddle_ext.pipeline.fleet_entry import engine_serves

ARGS_MODULE = "paddleformers.trainer.training_args"
TRAINER_MODULE = "paddleformers.trainer.trainer"
NLP_ARGS_MODULE = "paddlenlp.trainer.training_args"
REFUSAL = "overlap has accuracy issue"
NLP_WORD = "enable_dp_comm_overlap"
NLP_SHARDING_WORD = "enable_sharding_comm_overlap"


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


def lifted_post_init(original, spelling: TrainerArgs):
    @functools.wraps(original)
    def __post_init__(self) -> None:
        restore = None
        if int(getattr(self, spelling.pp, 1) or 1) > 1 and engine_serves():
            restore = spelling.switch_off(self)
        if restore is None:
            return original(self)
        try:
            original(self)
        finally:
            restore()
        if int(getattr(self, spelling.dp, 1) or 1) > 1:  # the trainers' own condition for the key
            strategy = upstream.fleet_strategy()
            if strategy is not None:
                strategy.hybrid_configs = {"pp_configs": {"dp_comm_overlap": True}}

    return __post_init__


def shows_optimizer_early(engine: Any) -> bool:
    """Whether the wrapped model is paddle_ext's engine overlapping the sharding reduction
    under the early_comm_buffers key."""
    from paddle_ext.pipeline.engine import PipelineEngine

    sync = getattr(engine, "_grad_sync", None)
    return (isinstance(engine, PipelineEngine) and sync is not None and sync.settings.early_comm_buffers
            and engine._sharding_comm_overlap)


def registering_wrap_model(original):
    @functools.wraps(original)
    def _wrap_model(self, model, *args, **kwargs):
        wrapped = original(self, model, *args, **kwargs)
        if getattr(self, "optimizer", None) is not None and shows_optimizer_early(wrapped):
            wrapped.register_sharding_comm_overlap_hook(self.optimizer)
        return wrapped

    return _wrap_model
