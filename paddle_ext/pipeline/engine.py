"""PipelineEngine: the plugin's replacement for fleet's PipelineParallel classes.

One engine for every schedule: it generates the schedule for (pp, vpp,
accumulate_steps), lowers it once (cached per micro-batch count), and runs this
rank's action list with the interpreter. train_batch / eval_batch keep fleet's
signatures; the model is fleet's PipelineLayer, used as is.

pp_configs.forward_backward_overlap_scheduler (upstream #71995) pairs the steady
state's forwards and backwards into F&B steps; a PipelineLayer subclass that defines
`overlapped_forward_backward` runs each pair through it, with upstream's schedule
chunks and loss nodes (paddle_ext.pipeline.nodes). Without the method the engine
warns once and runs each pair as its F then its B. pp_configs.overlap_p2p_comm moves
the transfers onto communication threads (runtime/async_p2p.py).

pp_configs.schedule_mode (the plugin's key, Paddle's auto-parallel names) picks the
schedule: "ZBH1" / "ZBVPP" are zero-bubble schedules, whose I and W actions run
through a WeightGradStore (runtime/split_backward.py).

V placement (schedule/vshape.py): a PipelineLayer built with use_dualpipev=True (Paddle
3.3; rank r holds stages r and 2*pp-1-r) runs `dualpipev` (pp_configs.use_dualpipev,
Paddle's DualPipeVParallel; the loss comes back as Paddle's: float32 of shape [1]) or
`zb-v` (schedule_mode "ZBV"). With a model that defines overlapped_forward_backward,
dualpipev's F&B pairs run through it, as DualPipeV does, and its zero-bubble phases
keep their I / W split (the interpreter captures the forwards of schedule nodes too).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import paddle

from paddle_ext import compat, host_heap, upstream
from paddle_ext.comm import trace
from paddle_ext.pipeline import layer_internals
from paddle_ext.pipeline.fleet_surface import (
    PipelineParallelSurface,
    adopt_fleet_class,
    micro_batch_data,
)
from paddle_ext.pipeline.grad_sync import GradReducer, GradSyncSettings
from paddle_ext.pipeline.losses import StageLosses, check_loss_fn_idx
from paddle_ext.pipeline.microbatch import MicroBatches
from paddle_ext.pipeline.runtime.chunks import PlainChunks
from paddle_ext.pipeline.runtime.interpreter import Interpreter, StageProgram, no_grad_sync
from paddle_ext.pipeline.runtime.node_mode import NodeChunks
from paddle_ext.pipeline.runtime.slots import StageLayout
from paddle_ext.pipeline.runtime.split_backward import WeightGradStore
from paddle_ext.pipeline.runtime.transfer_paths import transfer_path
from paddle_ext.pipeline.schedule import OVERLAP_SUFFIX, Schedule, generate, lower
from paddle_ext.pipeline.schedule.generate import ZB_KINDS, split_cap
from paddle_ext.pipeline.schedule.ir import I, W
from paddle_ext.pipeline.schedule.overlap import split_kind
from paddle_ext.pipeline.schedule.vshape import V_KINDS, V_MIN_MICROBATCHES
from paddle_ext.pipeline.step_report import StepTimers, profile_records, write_profile_records


@dataclass(frozen=True)
class PipelineSettings:
    accumulate_steps: int
    micro_batch_size: int
    delay_scale_loss: bool = False
    kind: Optional[str] = None  # None: 1f1b for one virtual stage, interleaved otherwise
    fb_overlap: bool = False    # pp_configs.forward_backward_overlap_scheduler
    overlap_p2p: Optional[bool] = False  # pp_configs.overlap_p2p_comm; None: unset (per backend)
    grad_sync: Optional[GradSyncSettings] = None  # dp/sharding reduction (pipeline/grad_sync.py)
    dualpipev: bool = False     # pp_configs.use_dualpipev: Paddle's DualPipeVParallel's semantics
    # pp_configs.enable_dynamic_shape, or pipeline_configs.p2p_cache_shape = False: payload
    # shapes may change from one step to the next (each step's first transfer on a channel
    # carries its header again), as upstream's dynamic-shape p2p allows
    dynamic_shape: bool = False
    # pp_configs.count_shared_weights_once (the plugin's, opt-in; paddle_ext.config): a
    # weight tied across stages enters fleet's global gradient norm from its first stage only
    count_shared_weights_once: bool = False
    # pp_configs.enable_timer / profiling: Paddle's per-step timer line and profile records
    # (pipeline/step_report.py)
    enable_timer: bool = False
    profiling: bool = False

    @classmethod
    def from_strategy(cls, strategy: Any) -> PipelineSettings:
        from paddle_ext.config import pp_config, pp_config_is_set, schedule_kind

        kind = schedule_kind(strategy)
        dualpipev = bool(pp_config(strategy, "use_dualpipev"))
        if dualpipev:
            if kind not in (None, "dualpipev"):
                raise ValueError(f"pp_configs.use_dualpipev = True and pp_configs.schedule_mode = "
                                 f"{pp_config(strategy, 'schedule_mode')!r} cannot be combined: use_dualpipev "
                                 "selects the DualPipeV schedule; leave schedule_mode unset")
            kind = "dualpipev"
        pipeline = strategy.pipeline_configs
        return cls(accumulate_steps=int(pipeline["accumulate_steps"]),
                   kind=kind, dualpipev=dualpipev,
                   micro_batch_size=int(pipeline["micro_batch_size"]),
                   delay_scale_loss=bool(pp_config(strategy, "delay_scale_loss")),
                   fb_overlap=bool(pp_config(strategy, "forward_backward_overlap_scheduler")),
                   overlap_p2p=(bool(pp_config(strategy, "overlap_p2p_comm"))
                                if pp_config_is_set(strategy, "overlap_p2p_comm") else None),
                   dynamic_shape=(bool(pp_config(strategy, "enable_dynamic_shape"))
                                  or not pipeline.get("p2p_cache_shape", True)),
                   count_shared_weights_once=bool(pp_config(strategy, "count_shared_weights_once")),
                   enable_timer=bool(pp_config(strategy, "enable_timer")),
                   profiling=bool(pp_config(strategy, "profiling")),
                   grad_sync=GradSyncSettings.from_strategy(strategy))


def broadcast_replicas(layers: Any, hcg: Any) -> None:
    """Replicas start from the same parameters, as fleet's PipelineParallel makes them at
    construction: over the model-parallel group (the parameters no rank splits), the sep
    group, the sharding group, then the dp group."""
    from paddle.distributed.fleet.utils import hybrid_parallel_util as util

    if hcg.get_model_parallel_world_size() > 1:
        util.broadcast_mp_parameters(layers, hcg)
    if compat.sep_degree(hcg) > 1:
        util.broadcast_sep_parameters(layers, hcg)
    if hcg.get_sharding_parallel_world_size() > 1:
        util.broadcast_sharding_parameters(layers, hcg)
    if hcg.get_data_parallel_world_size() > 1:
        util.broadcast_dp_parameters(layers, hcg)


def mark_shared_weights_once(layers: Any) -> None:
    """pp_configs.count_shared_weights_once: marks each weight the PipelineLayer ties across
    stages `is_firstly_shared` on its first stage only, the attribute by which fleet's
    HybridParallelClipGrad (and save_for_auto) take a tied weight once. Paddle's own marking
    compares parameter names with weight attribute names and so marks no copy as a repeat."""
    rank = upstream.global_rank()
    for weight, ranks in compat.pipeline_shared_weights(layers):
        weight.is_firstly_shared = rank == min(ranks)


def check_schedule_kind(settings: PipelineSettings, vpp: int, placement: str = "interleaved") -> None:
    """Refuses a schedule kind (pp_configs.schedule_mode) this model or the other keys
    rule out, naming the keys."""
    from paddle_ext.config import SCHEDULE_MODES

    if settings.kind is None:
        return
    base, _ = split_cap(split_kind(settings.kind)[0])
    mode = next((m for m, k in SCHEDULE_MODES.items() if k == base and m), base)
    if base in V_KINDS and placement != "v":
        raise ValueError(f"pp_configs.schedule_mode = {mode!r} (or use_dualpipev) runs on the V placement: build "
                         "the PipelineLayer with use_dualpipev=True (Paddle 3.3+), which holds stages r and "
                         "2*pp-1-r on rank r, or with paddle_ext.pipeline.v_layer.v_pipeline_layer (any release)")
    if placement == "v" and base not in V_KINDS:
        raise ValueError(f"pp_configs.schedule_mode = {mode!r} needs the interleaved placement, but this "
                         "PipelineLayer is V-segmented (use_dualpipev=True): set pp_configs.use_dualpipev = True "
                         "or schedule_mode 'ZBV'")
    if base in ("1f1b", "zb-h1") and vpp > 1:
        other = "VPP" if base == "1f1b" else "ZBVPP"
        raise ValueError(f"pp_configs.schedule_mode = {mode!r} needs one virtual stage; this model has {vpp} "
                         f"(num_virtual_pipeline_stages): use {other!r}")
    if base in ZB_KINDS and settings.fb_overlap:
        raise ValueError(f"pp_configs.schedule_mode = {mode!r} and pp_configs.forward_backward_overlap_scheduler = "
                         "True cannot be combined: the overlap scheduler pairs a forward with a whole backward, "
                         "zero-bubble schedules split the backward into I and W; switch one of them off")


@dataclass
class StepStats:
    seconds: float
    peak_in_flight: int
    microbatches: int
    spans: list  # (position, action, start, end), wall clock; see pipeline.timeline
    split: Any = None  # zero-bubble schedules: the step's SplitStats (runtime/split_backward.py)
    # seconds of the step's parts outside the schedule, by name: shared_weights (the tied-weight
    # all-reduce), grad_sync (waiting for the dp/sharding buckets), loss_broadcast, optimizer
    phases: dict = field(default_factory=dict)
    waited: float = 0.0  # seconds the compute thread waited for receives still in flight (eager links)


class PipelineEngine(PipelineParallelSurface, paddle.nn.Layer):
    """Also an instance of Paddle's PipelineParallel (PipelineParallelWithInterleave for
    vpp > 1) with the members trainers drive (pipeline/fleet_surface.py)."""

    def __init__(self, layers: Any, hcg: Any, settings: PipelineSettings, strategy: Any = None) -> None:
        super().__init__()
        if not isinstance(layers, upstream.pipeline_layer_class()):
            raise TypeError(f"pipeline parallelism needs a PipelineLayer model, got {type(layers).__name__}")
        self._layers = layers
        self._hcg = hcg
        self.settings = settings
        self.num_stages = hcg.get_pipe_parallel_world_size()
        self.stage_id = hcg.get_stage_id()
        self.pp_group = hcg.get_pipe_parallel_group()
        self.placement = "v" if compat.pipeline_is_v(layers) else "interleaved"
        self.vpp = 2 if self.placement == "v" else layers.get_num_virtual_stages()
        if self.placement == "v" and settings.kind is None:
            settings = dataclasses.replace(settings, kind="dualpipev")
            self.settings = settings
        self.accumulate_steps = settings.accumulate_steps
        self.micro_batch_size = settings.micro_batch_size
        self._check_accumulate_steps(self.accumulate_steps)
        # the way to the neighbours (runtime/transfer_paths.py); overlap_p2p_comm unset: the backend's default
        self._transfers = transfer_path(hcg, settings.overlap_p2p, self.placement)
        self._heap_warmer = host_heap.FirstStepWarmer()
        settings = self.settings = dataclasses.replace(settings, overlap_p2p=self._transfers.overlapped)
        self._schedules: dict[int, Schedule] = {}
        self._timers = StepTimers() if settings.enable_timer else None
        check_schedule_kind(settings, self.vpp, self.placement)
        self._split: Optional[WeightGradStore] = None  # zero-bubble: made with the first such schedule
        self.last_step: Optional[StepStats] = None
        self.last_eval: Optional[StepStats] = None  # eval_batch's run
        broadcast_replicas(layers, hcg)
        # dp / sharding gradient reduction, overlapped with the backward (pipeline/grad_sync.py)
        self._grad_sync = GradReducer.for_engine(layers, hcg, self.accumulate_steps,
                                                 settings.delay_scale_loss, settings.grad_sync)
        if settings.count_shared_weights_once:
            mark_shared_weights_once(layers)
        # Upstream's test: the method on the PipelineLayer's class, and the flag.
        method = getattr(type(layers), "overlapped_forward_backward", None)
        # DualPipeV pairs through the method whenever the model has it (Paddle's DualPipeVParallel)
        self.overlap_schedule_mode = (settings.fb_overlap or settings.kind == "dualpipev") and method is not None
        if settings.fb_overlap and method is None:
            warnings.warn(
                f"pp_configs.forward_backward_overlap_scheduler is on but {type(layers).__name__} "
                "defines no overlapped_forward_backward: each overlapped F&B step runs as its "
                "forward, then its backward", UserWarning, stacklevel=2)
        self._init_fleet_surface(strategy)
        adopt_fleet_class(self)

    # the schedule ------------------------------------------------------------------
    def set_schedule(self, schedule: Schedule, check: bool = True) -> None:
        """Runs `schedule` (lowered: with its sends and receives) for its micro-batch count
        instead of the generated one. check: validate it first (every send matched,
        nothing waits forever; raises ScheduleError). With check=False a bad schedule
        runs as given, and the comm watchdog reports where the ranks got stuck."""
        from paddle_ext.pipeline.schedule import validate

        if schedule.pp != self.num_stages or schedule.vpp != self.vpp:
            raise ValueError(f"schedule is for pp={schedule.pp} vpp={schedule.vpp}; this engine runs "
                             f"pp={self.num_stages} vpp={self.vpp}")
        if not schedule.lowered:
            raise ValueError("schedule must be lowered (carry its sends and receives): pass it through "
                             "paddle_ext.pipeline.schedule.lower first")
        if check:
            validate(schedule)
        self._schedules[schedule.microbatches] = schedule

    def schedule(self, microbatches: Optional[int] = None, forward_only: bool = False) -> Schedule:
        """The lowered schedule this engine runs for `microbatches` (default
        accumulate_steps): training's, or evaluation's with forward_only."""
        m = microbatches or self.accumulate_steps
        if forward_only:
            if ("forward", m) not in self._schedules:
                kind = "forward-v" if self.placement == "v" else "forward"
                self._schedules[("forward", m)] = lower(generate(self.num_stages, self.vpp, m, kind),
                                                        async_p2p=self.settings.overlap_p2p)
            return self._schedules[("forward", m)]
        if m not in self._schedules:
            kind = self.settings.kind or ("1f1b" if self.vpp == 1 else "interleaved")
            overlapped = self.settings.fb_overlap or (kind == "dualpipev" and self.overlap_schedule_mode)
            if overlapped and not kind.endswith(OVERLAP_SUFFIX):
                kind += OVERLAP_SUFFIX
            compute = generate(self.num_stages, self.vpp, m, kind)
            self._schedules[m] = lower(compute, async_p2p=self.settings.overlap_p2p,
                                       grad_sync=self._grad_sync is not None)
        return self._schedules[m]

    # training ----------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._layers(*args, **kwargs)

    def train_batch(self, data: Any, optimizer: Any, lr_scheduler: Any = None, scaler: Any = None,
                    loss_fn_idx: int = 0, return_micro_batch_loss: bool = False) -> Any:
        """One step: the schedule, the reductions, the optimizer. Returns the loss, or with
        several loss functions one entry per function (pipeline/losses.py)."""
        check_loss_fn_idx(compat.pipeline_loss_fns(self._layers), loss_fn_idx)
        self.loss_fn_idx = loss_fn_idx
        self._layers.train()
        self._heap_warmer.begin()
        loss = self._forward_backward(data, optimizer, scaler, return_micro_batch_loss, scale_accumulation=True)
        start = time.time()
        self._optimizer_step(optimizer, lr_scheduler, scaler)
        self.last_step.phases["optimizer"] = time.time() - start
        self._heap_warmer.end()  # the first step: as much heap again, faulted in (host_heap.py)
        return loss

    def _new_step_shapes(self) -> None:
        """Under dynamic_shape every step describes its payloads afresh (both ends of a
        channel forget its header at the step's start); otherwise the first step's
        headers hold for the run and a changed shape is refused (transport.P2P)."""
        if self.settings.dynamic_shape:
            self._transfers.forget_shapes()

    def _check_accumulate_steps(self, m: int) -> None:
        """The V schedules take any count from V_MIN_MICROBATCHES, one virtual stage any
        count from 1 (as fleet's PipelineParallel); virtual stages need pp (fleet's
        distributed_model refuses fewer)."""
        if self.placement == "v":
            low, what = V_MIN_MICROBATCHES, str(V_MIN_MICROBATCHES)
        elif self.vpp == 1:
            low, what = 1, "1"
        else:
            low, what = self.num_stages, f"pp_degree = {self.num_stages}"
        if m < low:
            raise ValueError(f"accumulate_steps = {m} is not allowed: must be >= {what}")

    def _forward_backward(self, data: Any, optimizer: Any, scaler: Any, per_microbatch: bool,
                          scale_accumulation: bool) -> paddle.Tensor:
        """The schedule, the tied-weight all-reduce and the dp/sharding reduction; the
        loss. scale_accumulation: under delay_scale_loss the reduction also scales by
        1/accumulate_steps (train_batch; forward_backward_pipeline leaves that to its
        caller, as Paddle's does)."""
        m = self.accumulate_steps
        self._check_accumulate_steps(m)  # a trainer may have changed it since the last step
        batches = MicroBatches(data, m, self.micro_batch_size)
        losses = self._stage_losses(batches, self.loss_fn_idx)
        if self._grad_sync is not None:
            self._grad_sync.begin_step(optimizer, self.schedule(m).ranks[self.stage_id], microbatches=m,
                                       scale_accumulation=scale_accumulation and self.settings.delay_scale_loss)
        self._new_step_shapes()
        self._reset_user_hooks_status()
        self.user_hooks_enabled = True
        self._micro_steps.step_ids = True
        self.last_step = self._run(batches, losses, scaler, losses)
        if self.settings.profiling:
            write_profile_records(profile_records(self.last_step.spans, self.stage_id, self.vpp > 1),
                                  upstream.global_rank())
        if self.placement != "v":  # as DualPipeVParallel, which runs no user hooks
            self._check_user_hooks_status_at_step_end()
        phases, start = self.last_step.phases, time.time()
        self._layers.allreduce_shared_weight_gradients()
        phases["shared_weights"], start = time.time() - start, time.time()
        if self._grad_sync is not None:  # the late buckets, then wait for every bucket
            self._grad_sync.finish()
        phases["grad_sync"], start = time.time() - start, time.time()
        loss = self._broadcast_loss(losses, per_microbatch)
        phases["loss_broadcast"] = time.time() - start
        if self._timers is not None:  # Paddle's timer_printer, at the same point of the step
            self._timers.add_spans(self.last_step.spans)
            self._timers.add("allreduce_shared_weight_gradients", phases["shared_weights"])
            self._timers.add("broadcast_final_loss", phases["loss_broadcast"])
            print(self._timers.line(), flush=True)
        return loss

    def _stage_losses(self, batches: MicroBatches, loss_fn_idx: int) -> StageLosses:
        m = self.accumulate_steps
        return StageLosses(compat.pipeline_loss_fns(self._layers), loss_fn_idx, batches.labels,
                           m if m > 1 and not self.settings.delay_scale_loss else None)

    def _run(self, batches: MicroBatches, last_stage: Callable[[Any, int], Any], scaler: Any,
             losses: Optional[StageLosses] = None, forward_only: bool = False) -> StepStats:
        """Runs this rank's list of the step's schedule (forward_only: evaluation's) with
        the interpreter. last_stage: (loss stage output, mb) -> the loss to back-propagate
        (a StageLosses) or, in evaluation, None after keeping what eval_batch returns."""
        m = self.accumulate_steps
        schedule = self.schedule(m, forward_only)
        actions = schedule.ranks[self.stage_id]
        split = None if forward_only else self._split_for(actions)
        reducer = None if forward_only else self._grad_sync
        program = StageProgram(
            layout=StageLayout(self.stage_id, self.num_stages, self.vpp, self.placement),
            chunks=self._chunk_runner(last_stage, losses, scaler, forward_only),
            first_input=batches.inputs,
            on_grad_sync=reducer.on_grad_sync if reducer is not None else no_grad_sync,
            split=split, micro_steps=self._micro_steps if self.placement != "v" else None)
        start = time.perf_counter()
        interpreter = Interpreter(program, actions, self._transfers.links("eval" if forward_only else "act"))
        interpreter.run()
        split_stats = split.end_step() if split is not None else None
        return StepStats(time.perf_counter() - start, interpreter.peak_in_flight, m, interpreter.spans, split_stats,
                         waited=interpreter.waited)

    def _split_for(self, actions: list) -> Optional[WeightGradStore]:
        """The rank's WeightGradStore, begun for this step, when its list has I / W actions
        (zero-bubble schedules); made with the first such schedule."""
        if not any(isinstance(a, (I, W)) for a in actions):
            return None
        if self._split is None:
            self._split = WeightGradStore().bind(layer_internals.pipeline_model_chunks(self._layers))
        self._split.begin_step()
        return self._split

    def _chunk_runner(self, last_stage: Callable[[Any, int], Any], losses: Optional[StageLosses], scaler: Any,
                      forward_only: bool) -> Any:
        """How this rank runs its chunks: as upstream's schedule chunks with the loss as a
        loss node and F&B steps through the model's overlapped_forward_backward (the
        overlap scheduler, DualPipeV with such a model), else the PipelineLayer's forward
        and autograd."""
        if self.overlap_schedule_mode and not forward_only:
            return self._node_chunks(losses, scaler)

        def backward_loss(loss: paddle.Tensor) -> None:
            (scaler.scale(loss) if scaler is not None else loss).backward()

        layers = self._layers
        if self.vpp > 1:
            return PlainChunks(lambda x, chunk: layers(x, chunk_id=chunk), last_stage, backward_loss)
        return PlainChunks(lambda x, chunk: layers(x), last_stage, backward_loss)

    def _node_chunks(self, losses: StageLosses, scaler: Any) -> NodeChunks:
        from paddle_ext.pipeline import nodes

        layers = self._layers
        # The PipelineLayer's own get_schedule_chunk where it has one (Paddle 3.1+, the
        # fb_overlap patch unit, or the user's override), else the same thing built here.
        get_chunk = getattr(layers, "get_schedule_chunk", None)
        vpp = self.vpp

        def schedule_chunk(chunk: int) -> Any:
            chunk_id = chunk if vpp > 1 else None
            return get_chunk(chunk_id=chunk_id) if get_chunk is not None else nodes.schedule_chunk(layers, chunk_id)

        return NodeChunks(schedule_chunk, losses.node, losses.record_node_loss,
                          layers.overlapped_forward_backward, scaler)

    def _broadcast_loss(self, losses: StageLosses, per_microbatch: bool) -> Any:
        """The loss stage's totals (one per loss function) to every stage, as fleet's
        _broadcast_final_loss: the tensor for one loss function, else the list."""
        last = 0 if self.placement == "v" else self.num_stages - 1  # the stage with the loss
        src = self._hcg.get_rank_from_stage(last)
        m = self.accumulate_steps
        if self.stage_id == last:
            totals = losses.totals(per_microbatch, m if self.settings.delay_scale_loss else None)
        else:
            totals = [paddle.zeros([m] if per_microbatch else [], dtype="float32") for _ in losses.loss_fns]
        group = self.pp_group
        out = []
        for loss in totals:
            if self.settings.dualpipev and not per_microbatch:  # DualPipeVParallel: float32 of shape [1]
                loss = loss.astype("float32").reshape([1])
            trace.call(group.process_group, "broadcast", loss, group.get_group_rank(src), True, tensors=(loss,),
                       what="loss broadcast").wait()
            out.append(loss)
        return out[0] if len(out) == 1 else out

    def _optimizer_step(self, optimizer: Any, lr_scheduler: Any, scaler: Any) -> None:
        reduced_here = self._grad_sync is not None and not self._grad_sync.deferred
        if self.settings.delay_scale_loss and not reduced_here:  # else the reduction scaled
            for p in self._layers.parameters():
                if getattr(p, "main_grad", None) is not None:  # in place: it may be a view of a buffer
                    p.main_grad.scale_(1.0 / self.accumulate_steps)
                elif p.grad is not None:
                    p.grad.set_value(p.grad.scale(1.0 / self.accumulate_steps))
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.clear_grad()
        if lr_scheduler is not None:
            lr_scheduler.step()

    def export_chrome_trace(self, path: str) -> str:
        """Writes this rank's picture of its last train_batch: the pipeline's actions and
        every traced communication (comm/trace.py), as a chrome trace file."""
        return trace.write_chrome_trace(path, self.last_step.spans if self.last_step else ())

    # evaluation --------------------------------------------------------------------
    def eval_batch(self, data: Any, compute_loss: bool = False, loss_fn_idx: int = 0,
                   return_host_tensor: bool = False) -> Any:
        """Forward only, through the forward-only schedule (kinds forward / forward-v) and
        the one interpreter: transfers on the communication threads when training uses
        them, errors naming the failing action and its position. Returns the loss
        (compute_loss; one entry per loss function when the PipelineLayer has several)
        or, on the loss stage, the outputs of every micro-batch (None elsewhere; on the
        host with return_host_tensor). `data` as for train_batch, or a
        PipelineDatasetPreprocessor."""
        check_loss_fn_idx(compat.pipeline_loss_fns(self._layers), loss_fn_idx)
        self.loss_fn_idx = loss_fn_idx
        self._layers.eval()
        if isinstance(data, compat.pipeline_dataset_preprocessor_classes()):
            data = data()
        return self._forward_only_step(micro_batch_data(data, self.accumulate_steps), compute_loss,
                                       host=return_host_tensor)

    @paddle.no_grad()
    def _forward_only_step(self, data: Any, compute_loss: bool, per_microbatch: bool = False,
                           host: bool = False) -> Any:
        """eval_batch's step (and forward_backward_pipeline(forward_only=True)'s): the
        forward-only schedule; the loss of loss_fn[loss_fn_idx] and its siblings
        (compute_loss), else the loss stage's outputs (None elsewhere; on the host with
        `host`). Without gradients: nothing of it is back-propagated, and its payloads'
        headers (stop_gradient included) stay those of the eval channels' first step."""
        self.set_virtual_pipeline_rank(0)
        self._new_step_shapes()
        hooks = self._micro_steps  # the callbacks only; step_id None as Paddle's 1F1B eval passes it
        self.user_hooks_enabled = False
        hooks.reset()
        hooks.step_ids = self.vpp > 1
        m = self.accumulate_steps
        self._check_accumulate_steps(m)
        batches = MicroBatches(data, m, self.micro_batch_size)
        losses = self._stage_losses(batches, self.loss_fn_idx)
        outputs: list = []

        def keep_output(y: Any, mb: int) -> None:
            outputs.append(y.cpu() if host else y)

        self.last_eval = self._run(batches, losses if compute_loss else keep_output, None, forward_only=True)
        if compute_loss:
            return self._broadcast_loss(losses, per_microbatch)
        last = 0 if self.placement == "v" else self.num_stages - 1
        return outputs if self.stage_id == last else None
