"""The parts of Paddle's PipelineParallel / PipelineParallelWithInterleave that trainers
drive directly, offered by the plugin's PipelineEngine with Paddle's meaning.

PaddleFormers' Trainer (and PaddleNLP's llm trainer) do not call `train_batch`: they
call `_prepare_training`, `forward_backward_pipeline` (no optimizer step; the Trainer
scales the gradients by 1/accumulation itself), `eval_batch(compute_loss=True)`, read
`_dp_comm_overlap` / `_sharding_comm_overlap`, set `_acc_steps` on the buffers of
`_chunk_2_comm_buffers`, call `_p2p_helper.clear_meta_cache()` and check
`isinstance(model, PipelineParallel)` in the checkpoint reshard code. This mixin
answers those through the engine's own machinery (schedule, interpreter, GradReducer):
there is no second engine.

The engine's class becomes a subclass of Paddle's PipelineParallel (or
PipelineParallelWithInterleave for vpp > 1) made here (`adopt_fleet_class`), so those
isinstance checks hold without running Paddle's constructor (which builds Paddle's p2p
helper and comm buffers, GPU-only on CPU builds). Every member Paddle's classes define
that the engine does not offer raises an AttributeError naming the member, never
Paddle's code running on state it never set up.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import paddle

from paddle_ext import compat, upstream
from paddle_ext.errors import InvalidArgumentError
from paddle_ext.pipeline.grad_sync import split_param_optimizer
from paddle_ext.pipeline.micro_step_hooks import MicroStepHooks

__all__ = ["CommBufferView", "PipelineParallelSurface", "UnsupportedMember", "adopt_fleet_class", "micro_batch_data"]


def _grad_enabled() -> bool:
    """Whether the dygraph tracer records gradients (paddle.no_grad() switches it off): what
    Paddle's PipelineParallel asserts before training, read as it reads it."""
    from paddle.base import framework

    return bool(framework._dygraph_tracer()._has_grad)


class UnsupportedMember(AttributeError):
    """A member of Paddle's PipelineParallel classes that paddle_ext's engine does not offer."""


class _Unsupported:
    """Class attribute standing for a Paddle member the engine cannot honour: reading it
    raises (hasattr() is False, as for a member that is not there); assigning one on
    the instance shadows it (non-data descriptor)."""

    def __init__(self, owner: str, name: str) -> None:
        self.owner, self.name = owner, name

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        raise UnsupportedMember(
            f"{self.owner}.{self.name} is not supported by paddle_ext's pipeline engine (it runs its "
            "own schedule and gradient reduction); switch the pipeline_engine unit off "
            "(PADDLE_EXT_PATCHES=pipeline_engine=off) to use Paddle's PipelineParallel")


class _P2PHelper:
    """What trainers use of Paddle's P2pHelper: clear_meta_cache() (the engine keeps no
    shape cache between steps: every transfer sends its meta, so there is nothing to
    clear). Anything else names itself."""

    def clear_meta_cache(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        raise UnsupportedMember(f"PipelineParallel._p2p_helper.{name} is not supported by paddle_ext's pipeline "
                                "engine (its transfers run inside the schedule; only clear_meta_cache() is offered)")


class CommBufferView:
    """One fused gradient bucket of the engine, seen as Paddle's FusedCommBuffer by the
    trainer: `_acc_steps` (the micro-batch count each gradient is accumulated over before
    the bucket is reduced; the Trainer sets it to its gradient_accumulation_steps),
    `_params`, `_clear_grad_storage()` (release_grads: the bucket's storage is rebuilt
    on the next step)."""

    def __init__(self, engine: Any, bucket: Any) -> None:
        self._engine, self._bucket = engine, bucket

    @property
    def _acc_steps(self) -> int:
        return self._engine.accumulate_steps

    @_acc_steps.setter
    def _acc_steps(self, value: int) -> None:
        value = int(value)
        if value < 1:
            raise ValueError(f"_acc_steps = {value} is not allowed: must be >= 1")
        self._engine.accumulate_steps = value

    @property
    def _params(self) -> list:
        return [slot.param for slot in self._bucket.slots]

    def _clear_grad_storage(self) -> None:
        for p in self._params:
            p.clear_gradient(False)
        if self._bucket.comm_buffer is not None and getattr(
                split_param_optimizer(self._engine.optimizer), "sd_release_grads", False):
            self._bucket.renew_slices()

    def __getattr__(self, name: str) -> Any:
        raise UnsupportedMember(f"FusedCommBuffer.{name} is not supported by paddle_ext's gradient buckets "
                                "(offered: _acc_steps, _params, _clear_grad_storage)")


class PipelineParallelSurface:
    """Mixed into PipelineEngine. Expects the engine's attributes: _layers, _hcg,
    settings, num_stages, stage_id, vpp, accumulate_steps, micro_batch_size,
    _grad_sync, and its methods _forward_backward (schedule + reductions + loss) and
    schedule()."""

    def _init_fleet_surface(self, strategy: Any = None) -> None:
        hcg = self._hcg
        self._strategy = strategy
        self.use_data_parallel = hcg.get_data_parallel_world_size() > 1
        self.use_model_parallel = hcg.get_model_parallel_world_size() > 1
        self.use_sharding_parallel = hcg.get_sharding_parallel_world_size() > 1
        self.global_rank = hcg.get_global_rank()
        self.dp_group = hcg.get_data_parallel_group()
        self.sharding_group = hcg.get_sharding_parallel_group()
        self._delay_scale_loss = self.settings.delay_scale_loss
        self._real_pp_world_size = self.num_stages
        self._real_pp_rank = self.stage_id
        self._virtual_pp_world_size = self.vpp if self.vpp > 1 else None
        self._virtual_pp_rank = 0 if self.vpp > 1 else None
        self._p2p_helper = _P2PHelper()
        self._overlap_p2p_comm = self.settings.overlap_p2p
        self.optimizer = None
        self.lr_scheduler = None
        self.scaler = None
        self.total_loss = None
        self.micro_batch_id = 0
        self.loss_fn_idx = 0
        self.processed_steps = 0
        self._init_user_hooks()

    # --- the overlap flags: the engine's real grad-sync state ----------------------------
    @property
    def _dp_comm_overlap(self) -> bool:
        sync = self._grad_sync
        return bool(sync is not None and sync.overlap and sync.settings.dp_overlap)

    @property
    def _sharding_comm_overlap(self) -> bool:
        sync = self._grad_sync
        return bool(sync is not None and sync.overlap and sync.settings.sharding_overlap)

    @property
    def _comm_overlap(self) -> bool:
        return self._dp_comm_overlap or self._sharding_comm_overlap

    @property
    def _chunk_2_comm_buffers(self) -> dict:
        """chunk -> the engine's fused buckets of that chunk (empty before the buckets
        exist: they are built with the optimizer, at register_sharding_comm_overlap_hook
        or the first step). Late buckets (tied weights) are listed under chunk -1."""
        sync = self._grad_sync
        if sync is None or sync.buckets is None:
            return {}
        out: dict = {}
        for b in sync.buckets:
            out.setdefault(-1 if b.chunk is None else b.chunk, []).append(CommBufferView(self, b))
        return out

    # --- stages ----------------------------------------------------------------------
    def is_pipeline_first_stage(self, ignore_virtual: bool = False) -> bool:
        if not ignore_virtual and self._virtual_pp_world_size is not None and self._virtual_pp_rank != 0:
            return False
        return self._real_pp_rank == 0

    def is_pipeline_last_stage(self, ignore_virtual: bool = False) -> bool:
        if (not ignore_virtual and self._virtual_pp_world_size is not None
                and self._virtual_pp_rank != self._virtual_pp_world_size - 1):
            return False
        return self._real_pp_rank == self._real_pp_world_size - 1

    def set_virtual_pipeline_rank(self, rank: int) -> None:
        self._virtual_pp_rank = rank

    # --- user hooks (Paddle 3.0+; micro_step_hooks.py) ------------------------------------
    bubble_hooks = None  # Paddle's too: "(TODO) support bubble hooks if needed"

    def _init_user_hooks(self) -> None:
        """Numbered hooks for each of this rank's forwards (backwards) of a step: vpp *
        accumulate_steps of them, fixed now, as Paddle's (DualPipeV's: accumulate_steps)."""
        chunks = self.vpp if self.vpp > 1 and self.placement != "v" else 1
        self._micro_steps = MicroStepHooks(chunks * self.accumulate_steps)

    _init_user_forward_backward_hooks = _init_user_hooks

    def _init_user_bubble_hooks(self) -> None:
        self.bubble_hooks = None

    @property
    def forward_hooks(self) -> Any:
        return self._micro_steps.forward_hooks

    @property
    def backward_hooks(self) -> Any:
        return self._micro_steps.backward_hooks

    @property
    def callbacks(self) -> Any:
        """The global micro-step callbacks (Paddle's pipeline_parallel_callbacks_ on 3.x)."""
        return self._micro_steps.callbacks

    @property
    def user_hooks_enabled(self) -> bool:
        return self._micro_steps.enabled

    @user_hooks_enabled.setter
    def user_hooks_enabled(self, value: bool) -> None:
        self._micro_steps.enabled = bool(value)

    def register_hook(self, location: Any, hook: Any) -> None:
        """A callback at a PipelineParallelMicroStepLocations location, for every pipeline
        model (Paddle's list is global)."""
        self.callbacks.register_hook(location, hook)

    def register_forward_pipeline_parallel_hook(self, location: int, hook: Any) -> None:
        self.forward_hooks.register_hook(location, hook)

    def register_backward_pipeline_parallel_hook(self, location: int, hook: Any) -> None:
        self.backward_hooks.register_hook(location, hook)

    def register_bubble_pipeline_parallel_hook(self, location: int, hook: Any) -> None:
        raise ValueError("Bubble hooks are not supported yet.")

    @property
    def forward_pipeline_parallel_hook_capacity(self) -> int:
        return self.forward_hooks.hooks_capacity

    @property
    def backward_pipeline_parallel_hook_capacity(self) -> int:
        return self.backward_hooks.hooks_capacity

    @property
    def bubble_pipeline_parallel_hook_capacity(self) -> int:
        return 0

    def _reset_user_hooks_status(self) -> None:
        self._micro_steps.reset()

    def _check_user_hooks_status_at_step_end(self) -> None:
        chunks = self.vpp if self.vpp > 1 and self.placement != "v" else 1
        self._micro_steps.check_step_end(chunks * self.accumulate_steps)

    # --- training, as trainers drive it ------------------------------------------------
    def register_sharding_comm_overlap_hook(self, optimizer: Any) -> None:
        """Paddle: builds the sharding buckets once the optimizer (its _param2rank) is
        known. Here: the engine's buckets (dp and sharding alike) are built now."""
        self.optimizer = optimizer
        if self._grad_sync is not None:
            self._grad_sync.prepare(optimizer, self.schedule().ranks[self.stage_id])

    def _prepare_training(self, data: Any, optimizer: Any, lr_scheduler: Any) -> Any:
        self.set_virtual_pipeline_rank(0)
        assert _grad_enabled(), "Please enable the generation of gradients."
        if self.is_pipeline_first_stage(ignore_virtual=True) or self.is_pipeline_last_stage(ignore_virtual=True):
            assert data is not None, "For the first and the last stage, the data must be set."
        else:
            data = None
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self._layers.train()
        if optimizer is not None:
            self.register_sharding_comm_overlap_hook(optimizer)
        return data

    def forward_backward_pipeline(self, data: Any, scaler: Any = None, *args: Any, **kwargs: Any) -> Any:
        """Runs the schedule (forwards, backwards, tied-weight and dp/sharding gradient
        reduction) and returns the loss; does not step the optimizer. Under
        delay_scale_loss the gradients are left unscaled by 1/accumulate_steps, as
        Paddle's does: the caller (train_batch, or the Trainer) scales them.

        The parameters after (data, scaler) are those of the instance's Paddle class
        (FORWARD_BACKWARD_PARAMETERS): PipelineParallel's (static_scheduler,
        return_micro_batch_loss), or the interleaved classes' (forward_only, compute_loss,
        static_scheduler, return_micro_batch_loss). forward_only runs evaluation's
        schedule (no backward) and returns the loss (compute_loss) or the loss stage's
        outputs, as Paddle's interleaved eval_batch gets them."""
        options = _forward_backward_signature(self.vpp > 1).bind(data, scaler, *args, **kwargs)
        options.apply_defaults()
        opt = options.arguments
        if opt["static_scheduler"]:
            raise UnsupportedMember(
                "PipelineParallel.forward_backward_pipeline(static_scheduler=True) is not supported by paddle_ext's "
                "pipeline engine; its schedule is paddle_ext.pipeline.schedule (engine.schedule() returns it)")
        if isinstance(data, compat.pipeline_dataset_preprocessor_classes()):
            data = data()
        if opt.get("forward_only", False):
            return self._forward_only_step(micro_batch_data(data, self.accumulate_steps), opt["compute_loss"],
                                           per_microbatch=opt["return_micro_batch_loss"])
        if not opt.get("compute_loss", True):
            raise InvalidArgumentError("forward_backward_pipeline: compute_loss = False is only allowed with "
                                       "forward_only = True (Paddle asserts the same)")
        self.scaler = scaler
        self._layers.train()
        loss = self._forward_backward(micro_batch_data(data, self.accumulate_steps), self.optimizer, scaler,
                                      opt["return_micro_batch_loss"], scale_accumulation=False)
        self.processed_steps += 1
        return loss


# The parameters of Paddle's forward_backward_pipeline after (data, scaler), with their
# defaults: PipelineParallel's (1F1B) and its interleaved classes' (PipelineParallelWithInterleave,
# ...FthenB), keyed by "interleaved".
FORWARD_BACKWARD_PARAMETERS: dict[bool, tuple[tuple[str, Any], ...]] = {
    False: (("static_scheduler", False), ("return_micro_batch_loss", False)),
    True: (("forward_only", False), ("compute_loss", True), ("static_scheduler", False),
           ("return_micro_batch_loss", False)),
}


@functools.cache
def _forward_backward_signature(interleaved: bool) -> inspect.Signature:
    """The Signature a call binds to, so a wrong argument raises Python's TypeError, as
    calling Paddle's method would."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter("data", kind), inspect.Parameter("scaler", kind, default=None)]
    params += [inspect.Parameter(name, kind, default=value) for name, value in FORWARD_BACKWARD_PARAMETERS[interleaved]]
    return inspect.Signature(params)


def micro_batch_data(data: Any, count: int) -> Any:
    """[inputs, labels] as fleet takes it; an iterable of (inputs, labels) micro-batches
    (Paddle accepts any non-list data as a micro-batch iterator) becomes two lists."""
    if data is None or isinstance(data, (list, tuple)):
        return data
    inputs, labels = [], []
    for i, item in enumerate(data):
        if i == count:
            break
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise ValueError(f"micro-batch {i} of the data iterator must be (inputs, labels), got "
                             f"{type(item).__name__}")
        inputs.append(item[0])
        labels.append(item[1])
    if len(inputs) != count:
        raise ValueError(f"the data iterator gave {len(inputs)} micro-batches; accumulate_steps = {count}")
    return [inputs if any(x is not None for x in inputs) else None,
            labels if any(x is not None for x in labels) else None]


@functools.cache
def _fleet_class(engine_cls: type, interleave: bool) -> type:
    meta = upstream.meta_parallel_module()
    base = meta.PipelineParallelWithInterleave if interleave else meta.PipelineParallel
    offered = set()
    for cls in engine_cls.__mro__:
        if cls is paddle.nn.Layer or cls is object:
            break
        offered.update(vars(cls))
    layer_members = {n for cls in paddle.nn.Layer.__mro__ for n in vars(cls)}
    namespace: dict[str, Any] = {"__module__": engine_cls.__module__, "__doc__": engine_cls.__doc__}
    for cls in base.__mro__:
        if cls is paddle.nn.Layer:
            break
        for name in vars(cls):
            if name.startswith("__") or name in offered or name in layer_members or name in namespace:
                continue
            namespace[name] = _Unsupported(cls.__name__, name)
    return type(engine_cls.__name__, (engine_cls, base), namespace)


def adopt_fleet_class(engine: Any) -> None:
    """Makes `engine` an instance of Paddle's PipelineParallel (PipelineParallelWithInterleave
    for vpp > 1) without running Paddle's constructor: its class becomes a subclass of
    both the engine's class and Paddle's, the engine's members first, every other member
    of Paddle's raising UnsupportedMember."""
    engine.__class__ = _fleet_class(type(engine), engine.vpp > 1)

