"""Data-parallel and sharding gradient reduction for the pipeline engine, overlapped
with the pipeline's backward (upstream #55651 for VPP, #56096 for dp and sharding
together, fused gradient buffers #57048).

What happens to a gradient, per step:

1. Backwards accumulate it into its bucket's buffer (grad_buffers.py).
2. A bucket is *ready* when its gradients are final: at the latest when its chunk's
   GradSync point comes (the lowered schedule puts `GS<c>` right after chunk c's
   last backward on this rank); earlier, inside that last backward, once every
   parameter of the bucket had its gradient for every micro-batch. Those counts
   come from backward hooks and are trusted only for parameters that got exactly
   one gradient per micro-batch in every step so far (the first step launches at
   GradSync only, and teaches the counts); a bucket holding a parameter that did
   not is launched at GradSync. A gradient arriving for a bucket already launched
   raises GradSyncError rather than reduce a partial sum.
3. Ready buckets are handed to the collective workers (comm/collectives.py) in one
   fixed order, the same on every rank of a dp or sharding group (the chunks in
   GradSync order, each chunk's buckets in their order, then the late buckets); a
   bucket ready before the one ahead of it waits for it.
4. The collectives: dp alone, an all-reduce over the dp group. Sharding (stage 1,
   Paddle's DygraphShardingOptimizer: each parameter is updated by one sharding
   rank, `_param2rank`): buckets are per owner and each is reduced to its owner
   (gloo has no reduce_scatter; a reduce per owner bucket is its equivalent and
   leaves each rank the sum of exactly the parameters it updates). dp and sharding
   together: the sharding reduce first, then the dp all-reduce of the owned
   buckets only. The last collective of an owned bucket scales it once, by
   1 / (dp * sharding), times 1 / accumulate_steps under delay_scale_loss.
5. After the schedule: the tied-weight all-reduce (PipelineLayer's, over the
   embedding/head pair group) runs first, then the late buckets (the tied layers'
   parameters and any parameter of no single chunk) are reduced: a tied gradient is
   summed over its pair before it goes to its owner, whose sharding rank may differ
   between the two stages. Then every collective is waited for, and the optimizer
   steps; the sharding optimizer broadcasts the updated parameters from their
   owners, as it does without overlap. The wrapped optimizer's own dp/sharding
   reduction is switched off (`_dp_enable` / `_sharding_enable`, as fleet does for
   pp_configs.dp_comm_overlap / sharding_comm_overlap).
6. sep_degree > 1 (with dp or sharding). Without overlap the engine reduces nothing
   and the optimizer does, over its dp x sep group scaled by 1 / dp, as fleet's
   HybridParallelOptimizer does (`deferred`). With pp_configs.dp_comm_overlap the
   engine reduces, as fleet's PipelineParallel does then: the dp collective runs over
   the dp x sep group and the last one scales by 1 / (dp * sep * sharding) (Paddle's
   FusedCommBuffer scales by its group's size; the two paths of fleet differ by sep,
   and each is kept). sharding_comm_overlap with sep is refused, as
   fleet.distributed_optimizer refuses it ("sep parallel can not coexist with
   sharding_comm_overlap").
7. Sharding with split_param (DygraphShardingOptimizerV2: each rank updates a slice of
   flat buffers, its gradients reduce-scattered into it), as in fleet's
   PipelineParallel. With the strategy's pp_configs.sharding_comm_overlap the optimizer
   builds no buffers and takes the pipeline's: the engine's buckets are then Paddle's
   FusedCommBuffers (grad_buffers.py), and a bucket's collectives are a reduce-scatter
   over the sharding group, then the dp all-reduce of this rank's slice, which the last
   scales. Without it the optimizer reduces its own buffers at its step and the engine
   reduces nothing (`deferred`; engine overlap is then refused: the buffers are not
   the engine's to launch).

Overlap off runs the very same collectives, in the same order, with the same
scaling, synchronously after the schedule (InlineWorker): on and off are bitwise
equal by construction, only the timing differs.
"""

from __future__ import annotations

import atexit
import functools
import os
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

from paddle_ext import compat, devices, upstream
from paddle_ext.comm import trace
from paddle_ext.comm.collectives import CollectiveError, make_worker
from paddle_ext.errors import InvalidArgumentError
from paddle_ext.pipeline import layer_internals
from paddle_ext.pipeline.grad_buffers import DEFAULT_BUCKET_BYTES, GradBucket, build_buckets

__all__ = ["ENV_BUCKET_MB", "BucketRecord", "GradReducer", "GradSyncError", "GradSyncSettings", "SyncStats",
           "split_param_optimizer"]

ENV_BUCKET_MB = "PADDLE_EXT_GRAD_BUCKET_MB"


class GradSyncError(RuntimeError):
    """Gradient reduction failed, or would have reduced an incomplete gradient."""


def _env_bucket_mb() -> float:
    text = os.environ.get(ENV_BUCKET_MB, "").strip()
    if not text:
        return DEFAULT_BUCKET_BYTES / (1024 * 1024)
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{ENV_BUCKET_MB} must be a number of megabytes, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"{ENV_BUCKET_MB} must be positive, got {text!r}")
    return value


@dataclass(frozen=True)
class GradSyncSettings:
    """dp_overlap / sharding_overlap: pp_configs.dp_comm_overlap / sharding_comm_overlap
    (either one overlaps the whole reduction chain of a dp x sharding run);
    bucket_mb: bucket size in MiB (env PADDLE_EXT_GRAD_BUCKET_MB, default 128 like
    upstream); early_launch: launch buckets inside a chunk's last backward (else at
    its GradSync point); timing_events: GPU only, default (timing) events instead of
    timing-free ones, for comparisons; early_comm_buffers: the plugin's opt-in
    pp_configs key (paddle_ext.config), see GradReducer.prepare."""

    dp_overlap: bool = False
    sharding_overlap: bool = False
    bucket_mb: float = field(default_factory=_env_bucket_mb)
    early_launch: bool = True
    timing_events: bool = False
    early_comm_buffers: bool = False

    def __post_init__(self) -> None:
        if not self.bucket_mb > 0:
            raise ValueError(f"bucket_mb must be positive, got {self.bucket_mb}")

    @classmethod
    def from_strategy(cls, strategy: Any) -> GradSyncSettings:
        from paddle_ext.config import pp_config

        return cls(dp_overlap=bool(pp_config(strategy, "dp_comm_overlap")),
                   sharding_overlap=bool(pp_config(strategy, "sharding_comm_overlap")),
                   early_comm_buffers=bool(pp_config(strategy, "early_comm_buffers")))

    @property
    def bucket_bytes(self) -> int:
        return max(1, int(self.bucket_mb * 1024 * 1024))


@dataclass
class BucketRecord:
    """One bucket's collectives in one step (wall-clock seconds, like the interpreter's
    spans): ready (handed over), started (its first collective issued), finished (its
    last one done; on a GPU, enqueued)."""

    bucket: int
    chunk: Optional[int]
    nbytes: int
    early: bool
    ready: float = 0.0
    started: float = 0.0
    finished: float = 0.0
    tickets: list = field(default_factory=list, repr=False, compare=False)


@dataclass
class SyncStats:
    overlap: bool
    records: list[BucketRecord]
    finish_seconds: float  # the time train_batch spent in finish(): exposed communication
    finish_started: float = 0.0  # when finish() began (the clock of the records): a bucket started
    # before it was launched by its worker during the step, not by the wait for it


class GradReducer:
    """Owns the gradient buckets of one PipelineEngine and their reduction."""

    def __init__(self, layers: Any, hcg: Any, microbatches: int, delay_scale_loss: bool,
                 settings: GradSyncSettings, clock: Callable[[], float] = time.time) -> None:
        self.layers = layers
        self.hcg = hcg
        self.microbatches = microbatches
        self.settings = settings
        self.clock = clock
        self.dp = hcg.get_data_parallel_world_size()
        self.sharding = hcg.get_sharding_parallel_world_size()
        if settings.dp_overlap and self.dp == 1:  # fleet's PipelineParallel asserts it
            raise InvalidArgumentError("pp_configs.dp_comm_overlap = True needs dp_degree > 1")
        if settings.sharding_overlap and self.sharding == 1:
            raise InvalidArgumentError("pp_configs.sharding_comm_overlap = True needs sharding_degree > 1")
        self.overlap = settings.dp_overlap or settings.sharding_overlap
        self.sharding_rank = hcg.get_sharding_parallel_rank() if self.sharding > 1 else 0
        self.sep = compat.sep_degree(hcg)
        # the engine reduces with sep only under overlap (_defers_to), over fleet's dp x sep group
        self.dp_group = None if self.dp == 1 else (hcg.get_dp_sep_parallel_group() if self.sep > 1
                                                   else hcg.get_data_parallel_group())
        self.sharding_group = hcg.get_sharding_parallel_group() if self.sharding > 1 else None
        self.delay_scale_loss = delay_scale_loss
        self.scale = self._scale_for(microbatches, delay_scale_loss)
        self.device = devices.tensor_device_kind()
        overlap = self.overlap
        if overlap and self.device not in ("cpu", "gpu"):
            overlap = False  # no thread or stream path for this device: reduce after the schedule
        self.workers = {}
        if self.sharding > 1:
            self.workers["sharding"] = make_worker("sharding", self.device, overlap, settings.timing_events, clock)
        if self.dp > 1:
            self.workers["dp"] = make_worker("dp", self.device, overlap, settings.timing_events, clock)
        self._calc_stream = self.device == "gpu" and overlap
        self.buckets: Optional[list[GradBucket]] = None
        self.order: list[GradBucket] = []
        self._by_chunk: dict[int, list[GradBucket]] = {}
        self._next = 0
        self._in_step = False
        self._early = False
        self._error: Optional[GradSyncError] = None
        self._learned = 0
        self._records: dict[int, BucketRecord] = {}
        self.last: Optional[SyncStats] = None
        self.deferred = False  # this step's reduction left to the optimizer (_defers_to)
        # Worker threads end before the interpreter finalizes (a daemon thread still in a
        # gloo wait during finalization aborted the process with SIGABRT).
        atexit.register(_close_at_exit, weakref.ref(self))

    @classmethod
    def for_engine(cls, layers: Any, hcg: Any, microbatches: int, delay_scale_loss: bool,
                   settings: Optional[GradSyncSettings]) -> Optional[GradReducer]:
        """A reducer when there is a dp or sharding group to reduce over, else None."""
        settings = settings if settings is not None else GradSyncSettings()
        if hcg.get_data_parallel_world_size() * hcg.get_sharding_parallel_world_size() == 1:
            if settings.dp_overlap or settings.sharding_overlap:
                which = "dp_comm_overlap" if settings.dp_overlap else "sharding_comm_overlap"
                raise InvalidArgumentError(f"pp_configs.{which} = True needs "
                                           f"{'dp' if settings.dp_overlap else 'sharding'}_degree > 1")
            return None
        return cls(layers, hcg, microbatches, delay_scale_loss, settings)

    # --- set-up -------------------------------------------------------------------
    def _owner_of(self, optimizer: Any) -> Optional[Callable[[Any], int]]:
        if self.sharding == 1:
            return None
        sharding_opt = _find_in_chain(optimizer, "_param2rank")
        if sharding_opt is None:
            raise GradSyncError(
                "sharding_degree > 1 needs the optimizer from fleet.distributed_optimizer (Paddle's "
                "DygraphShardingOptimizer): paddle_ext reduces each gradient to the sharding rank that "
                "owns it (its _param2rank)")
        param2rank = sharding_opt._param2rank

        def owner_of(param: Any) -> int:
            if param.name not in param2rank:
                raise GradSyncError(f"parameter {param.name} is not known to the sharding optimizer "
                                    "(pass all model parameters to it)")
            return int(param2rank[param.name])

        return owner_of

    def _build(self, optimizer: Any, gradsync_order: Sequence[int]) -> None:
        chunks = layer_internals.pipeline_model_chunks(self.layers)
        late_ids = {id(p) for p in layer_internals.pipeline_shared_layer_params(self.layers)}
        seen: dict[int, int] = {}
        for c, chunk in enumerate(chunks):
            for p in chunk.parameters():
                if id(p) in seen and seen[id(p)] != c:
                    late_ids.add(id(p))  # in two chunks of this rank: final after both
                seen.setdefault(id(p), c)
        per_chunk = [[p for p in chunk.parameters() if id(p) not in late_ids and seen.get(id(p)) == c]
                     for c, chunk in enumerate(chunks)]
        in_chunk = {id(p) for ps in per_chunk for p in ps}
        late = [p for p in self.layers.parameters() if id(p) not in in_chunk]
        if sorted(gradsync_order) != list(range(len(chunks))):
            raise GradSyncError(f"the schedule's GradSync order {list(gradsync_order)} does not name each "
                                f"of the {len(chunks)} chunks once")
        if split_param_optimizer(optimizer) is not None:  # takes the pipeline's buffers (_defers_to)
            self.buckets = build_buckets(per_chunk, late, self.settings.bucket_bytes,
                                         reduce_scatter_group=self.sharding_group)
        else:
            self.buckets = build_buckets(per_chunk, late, self.settings.bucket_bytes, self._owner_of(optimizer))
        self._by_chunk = {c: [b for b in self.buckets if b.chunk == c] for c in range(len(chunks))}
        self.order = [b for c in gradsync_order for b in self._by_chunk[c]]
        self.order += [b for b in self.buckets if b.chunk is None]
        for b in self.buckets:
            for slot in b.slots:
                slot.param._register_backward_hook(self._hook(b, slot))

    def _hook(self, bucket: GradBucket, slot: Any) -> Callable[..., None]:
        # A weak reference: the hook lives as long as the parameter, the reducer (and its
        # worker threads) only as long as its engine.
        reducer = weakref.ref(self)

        def hook(*_: Any) -> None:
            self = reducer()
            if self is None or not self._in_step:
                return
            if bucket.submitted:
                # Raised by finish(), before the optimizer could step on a partial sum (an
                # exception raised inside a backward hook reaches the caller as a bare
                # SystemError).
                if self._error is None:
                    self._error = GradSyncError(
                        f"rank {upstream.global_rank()}: parameter {slot.param.name} received a gradient after "
                        f"its {bucket.label} was handed to the dp/sharding collectives: its use changed "
                        "between steps; set GradSyncSettings(early_launch=False) to launch buckets at "
                        "their chunk's GradSync only")
                return
            bucket.take(slot, self.microbatches)
            if (self._early and bucket.chunk is not None and not bucket.ready and bucket.todo == 0
                    and bucket.eligible):  # late buckets wait for the tied-weight all-reduce
                bucket.early = True
                self._mark_ready(bucket)
                self._flush()

        return hook

    def _scale_for(self, microbatches: int, scale_accumulation: bool) -> float:
        return 1.0 / (self.dp * self.sep * self.sharding) / (microbatches if scale_accumulation else 1)

    # --- one step ------------------------------------------------------------------
    def prepare(self, optimizer: Any, actions: Sequence[Any]) -> None:
        """Builds the buckets (once; they need the optimizer for sharding owners):
        `actions` is this rank's lowered schedule (its GS<c> order is the order of the
        chunks' buckets). Nothing when the optimizer reduces (_defers_to).

        Under settings.early_comm_buffers a split_param optimizer (DygraphShardingOptimizerV2
        under pp_configs.sharding_comm_overlap) takes the buckets' FusedCommBuffers now. By
        itself it collects them at its first step, so before that its sharded_state_dict
        names no optimizer state and a FlexCheckpoint loaded then restores none."""
        if self.buckets is None and not self._defers_to(optimizer):
            from paddle_ext.pipeline.schedule.ir import GradSync

            self._build(optimizer, [a.chunk for a in actions if isinstance(a, GradSync)])
        split = split_param_optimizer(optimizer)
        if (self.settings.early_comm_buffers and self.buckets is not None and split is not None
                and getattr(split, "pp_overlap", False)):
            split._collect_comm_buffers()

    def begin_step(self, optimizer: Any, actions: Sequence[Any], microbatches: Optional[int] = None,
                   scale_accumulation: Optional[bool] = None) -> None:
        """Before a step (see prepare for `actions`). microbatches: this step's
        micro-batch count (default: the constructor's); scale_accumulation: the last
        collective also scales by 1 / microbatches (default: delay_scale_loss; False
        where the caller scales the gradients itself, as PaddleFormers' Trainer does)."""
        self.deferred = self._defers_to(optimizer)
        if self.deferred:
            return
        self.prepare(optimizer, actions)
        if microbatches is not None and microbatches != self.microbatches:
            self.microbatches = microbatches
            self._learned = 0  # per-step gradient counts changed: launch at GradSync until relearned
        accumulation = self.delay_scale_loss if scale_accumulation is None else scale_accumulation
        self.scale = self._scale_for(self.microbatches, accumulation)
        disable_optimizer_reduction(optimizer)
        for b in self.buckets:
            b.reset(self.microbatches)
        for w in self.workers.values():
            w.reset()
        self._next = 0
        self._records = {}
        self._early = self.settings.early_launch and self._learned > 0
        self._error = None
        self._in_step = True

    def _defers_to(self, optimizer: Any) -> bool:
        """Whether this step's dp / sharding reduction is the optimizer's, as in fleet's
        PipelineParallel: sharding with split_param (Paddle's DygraphShardingOptimizerV2,
        PaddleFormers' default) built without pp_configs.sharding_comm_overlap reduce-
        scatters each gradient into flat buffers of its own at its step. Then the engine
        reduces nothing (dp neither: the optimizer's dp all-reduce follows its sharding
        reduction) and leaves the optimizer's reduction switched on. Built with it, the
        optimizer takes the pipeline's buffers, and the engine reduces (item 7 above). With
        sep_degree > 1 the reduction is the optimizer's unless dp_comm_overlap (item 6)."""
        if self.sep > 1:
            if not self.overlap:
                return True  # fleet's optimizer all-reduces over dp x sep, scaled by 1 / dp
            if self.settings.sharding_overlap:
                raise GradSyncError(
                    f"pp_configs.sharding_comm_overlap = True with sep_degree = {self.sep}: sep parallel can not "
                    "coexist with sharding_comm_overlap (fleet.distributed_optimizer refuses it too); use "
                    "pp_configs.dp_comm_overlap (dp_degree > 1) or turn the overlap off")
        if self.sharding == 1:
            return False
        split = split_param_optimizer(optimizer)
        if split is None or getattr(split, "pp_overlap", False):
            return False
        if self.overlap:
            raise GradSyncError(
                "pp_configs.dp_comm_overlap / sharding_comm_overlap with sharding_configs.split_param = True: "
                "the DygraphShardingOptimizerV2 was built without the strategy's pp_configs.sharding_comm_overlap, "
                "so it reduces its own gradient buffers at its step and the engine cannot overlap that reduction; "
                "set pp_configs.sharding_comm_overlap = True in the strategy before fleet.init (the optimizer then "
                "takes the pipeline's buffers) or turn the engine's overlap off")
        return True

    def on_grad_sync(self, chunk: int) -> None:
        """The interpreter's GS<chunk>: chunk's last backward on this rank is done."""
        if not self._in_step:
            return
        for b in self._by_chunk.get(chunk, ()):
            if not b.ready:
                self._mark_ready(b)
        self._flush()

    def finish(self) -> None:
        """After the schedule and the tied-weight all-reduce: the late buckets, then wait
        for everything; gradients are final (reduced and scaled) when it returns."""
        if not self._in_step:
            return
        start = self.clock()
        try:
            for b in self.order:  # the late buckets, and any chunk whose GS never came
                if not b.ready:
                    self._mark_ready(b)
            self._flush()
            for name in ("sharding", "dp"):  # inline workers: sharding's tickets run first
                if name in self.workers:
                    self.workers[name].wait_all()
            if self._error is not None:
                raise self._error
        except CollectiveError as err:
            raise GradSyncError(f"rank {upstream.global_rank()}: gradient reduction failed: {err}") from err
        finally:
            self._in_step = False
        for b in self.buckets:
            b.learn(self.microbatches)
        self._learned += 1
        self.last = SyncStats(self.overlap, self._collect_records(), self.clock() - start, finish_started=start)

    def close(self, join: bool = True) -> None:
        """Ends the worker threads (also when the reducer is garbage collected)."""
        for w in self.workers.values():
            w.close(join)

    def __del__(self) -> None:
        try:
            self.close(join=False)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # --- internals -------------------------------------------------------------------
    def _mark_ready(self, b: GradBucket) -> None:
        b.ready = True
        self._records[b.index] = BucketRecord(b.index, b.chunk, b.nbytes, b.early, ready=self.clock())

    def _flush(self) -> None:
        while self._next < len(self.order) and self.order[self._next].ready:
            self._submit(self.order[self._next])
            self._next += 1

    def _submit(self, b: GradBucket) -> None:
        b.seal()
        b.submitted = True
        tickets = []
        owned = b.owner is None or b.owner == self.sharding_rank
        sharding_ticket = None
        if self.sharding > 1:
            last = owned and self.dp == 1
            kind = "reduce" if b.comm_buffer is None else "reduce_scatter"
            sharding_ticket = self.workers["sharding"].submit(b.label, self._op(b, kind, self.sharding_group, last))
            tickets.append(sharding_ticket)
        if self.dp > 1 and owned:
            tickets.append(self.workers["dp"].submit(
                b.label, self._op(b, "all_reduce", self.dp_group, True), after=sharding_ticket))
        self._records[b.index].tickets = tickets

    def _op(self, b: GradBucket, kind: str, group: Any, scale: bool) -> Callable[[], None]:
        from paddle.base import core

        pg, buffer, factor = group.process_group, b.buffer, self.scale
        calc_stream = self._calc_stream
        dst = b.owner
        # a reduce-scattered bucket: this rank's slice is what is all-reduced and scaled
        mine = buffer if b.comm_buffer is None else b.shard(self.sharding_rank, self.sharding)

        what = f"grad bucket {b.label}"
        traced = functools.partial(trace.call, tensors=(buffer,), what=what)

        def run() -> None:
            if kind == "reduce":
                if calc_stream:
                    traced(pg, "reduce_on_calc_stream", buffer, dst, core.ReduceOp.SUM)
                else:
                    traced(pg, "reduce", buffer, dst, core.ReduceOp.SUM, True).wait()
            elif kind == "reduce_scatter":
                if calc_stream:
                    traced(pg, "reduce_scatter_tensor_on_calc_stream", mine, buffer, core.ReduceOp.SUM)
                else:
                    traced(pg, "reduce_scatter_tensor", mine, buffer, core.ReduceOp.SUM, True).wait()
            elif calc_stream:
                traced(pg, "all_reduce_on_calc_stream", mine, core.ReduceOp.SUM)
            else:
                traced(pg, "all_reduce", mine, core.ReduceOp.SUM, True).wait()
            if scale and factor != 1.0:
                mine.scale_(factor)

        return run

    def _collect_records(self) -> list[BucketRecord]:
        out = []
        for b in self.order:
            rec = self._records.get(b.index)
            if rec is None:
                continue
            if rec.tickets:
                rec.started = min(t.started for t in rec.tickets)
                rec.finished = max(t.finished for t in rec.tickets)
                rec.tickets = []
            out.append(rec)
        return out


def _close_at_exit(reducer: Callable[[], Optional[GradReducer]]) -> None:
    live = reducer()
    if live is not None:
        live.close()


def split_param_optimizer(optimizer: Any) -> Any:
    """The DygraphShardingOptimizerV2 (sharding_configs.split_param) in optimizer's chain, or None."""
    return next((o for o in _chain(optimizer) if type(o).__name__ == "DygraphShardingOptimizerV2"), None)


def _chain(optimizer: Any) -> Iterator[Any]:
    """optimizer, optimizer._inner_opt, optimizer._inner_opt._inner_opt, ..."""
    seen = set()
    obj = optimizer
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        yield obj
        obj = getattr(obj, "__dict__", {}).get("_inner_opt")


def _find_in_chain(optimizer: Any, attr: str) -> Any:
    """The first object along optimizer._inner_opt._inner_opt... that has `attr` itself."""
    return next((obj for obj in _chain(optimizer) if attr in getattr(obj, "__dict__", {})), None)


def disable_optimizer_reduction(optimizer: Any) -> None:
    """Switches off the dp/sep/sharding gradient reduction of fleet's
    HybridParallelOptimizer: the engine reduces every gradient itself (fleet does the
    same for pp_configs.dp_comm_overlap / sharding_comm_overlap)."""
    hybrid = _find_in_chain(optimizer, "_dp_enable")
    if hybrid is None:
        return
    for flag in ("_dp_enable", "_sep_enable", "_sharding_enable"):
        if flag in vars(hybrid):
            setattr(hybrid, flag, False)
