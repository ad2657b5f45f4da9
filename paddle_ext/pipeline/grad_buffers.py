"""Fused gradient buffers (upstream #57048): per model chunk, parameters grouped into
buckets, each bucket's gradients living in one contiguous buffer.

A parameter's gradient becomes a view into its bucket's buffer the first time a
backward produces it in a step: the fresh gradient is copied into the view and
`param._copy_gradient_from(view)` (or `param.main_grad = view` for AMP master
gradients) makes the view the gradient Paddle accumulates into, in place, for the
remaining micro-batches. So the buffer holds the accumulated gradients of all
micro-batches without any further copy, and one collective reduces a whole bucket.
Accumulation is the same float additions in the same order as without buffers
(the first copy is exact), which keeps results bitwise equal to plain accumulation.

Bucketing follows upstream's FusedCommBuffer: parameters are taken in reverse
registration order (the order a backward completes them), grouped by owner (the
sharding rank that updates them under stage-1 sharding; None without sharding) and
gradient dtype, and each group is cut into buckets of at most `bucket_bytes` (a
larger parameter gets a bucket of its own). Buckets are ordered by the position of
their earliest layer, which is when their last gradient is complete.

Sharding with split_param (Paddle's DygraphShardingOptimizerV2) updates each rank's
slice of flat buffers instead of whole parameters, and reads its gradients from
Paddle's own FusedCommBuffer objects, which the pipeline builds when the strategy says
pp_configs.sharding_comm_overlap (fleet's PipelineParallel.fused_gradient). So with
`reduce_scatter_group` each bucket's buffer is one: Paddle lays it out (each parameter
padded so that the buffer splits evenly over the group, parameters moved into its
parameter buffer, gradients made views of its gradient buffer) and the optimizer
collects it at its step; the bucket's collective is a reduce-scatter into this rank's
slice. Such a bucket holds one parameter dtype (Paddle's buffer has one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np
import paddle

__all__ = ["GradBucket", "Slot", "build_buckets", "grad_dtype", "uses_main_grad"]

DEFAULT_BUCKET_BYTES = 128 * 1024 * 1024  # upstream's group_size


def uses_main_grad(param: Any) -> bool:
    """AMP O2 master gradients (fleet's MixPrecisionLayer gives params a main_grad)."""
    return hasattr(param, "main_grad")


def grad_dtype(param: Any) -> Any:
    return paddle.float32 if uses_main_grad(param) else param.dtype


def _numel(param: Any) -> int:
    return int(np.prod(param.shape)) if len(param.shape) else 1


def _element_size(dtype: Any) -> int:
    return int(paddle.zeros([1], dtype=dtype).element_size())


@dataclass(eq=False)
class Slot:
    """One parameter's place in its bucket's buffer."""

    param: Any
    start: int
    numel: int
    buffer: Any = None       # the bucket's buffer
    view: Any = None         # the buffer region, shaped like the parameter (never handed out)
    ptr: int = 0             # view.data_ptr(): the gradient is the view when their pointers agree
    main_grad: bool = False
    count: int = 0           # backward hooks seen in this step
    attached: bool = False   # the parameter's gradient is the view in this step
    always: bool = True      # every learned step saw exactly one hook per micro-batch

    def grad(self) -> Any:
        return self.param.main_grad if self.main_grad else self.param.grad

    def region(self) -> Any:
        """A new tensor over this parameter's region of the buffer."""
        view = self.buffer._slice(self.start, self.start + self.numel)
        view.get_tensor()._set_dims(self.param.shape)
        view.stop_gradient = True
        return view

    def attach(self) -> None:
        # A fresh tensor each time: the gradient shares its tensor with what it was
        # copied from, and clear_grad(set_to_zero=False) (or main_grad._clear())
        # releases that tensor's memory reference; the buffer and `view` keep theirs.
        if self.main_grad:
            self.param.main_grad = self.region()
        else:
            self.param._copy_gradient_from(self.region())


@dataclass(eq=False)
class GradBucket:
    """A contiguous gradient buffer for some parameters of one chunk (chunk None: the
    late buckets, reduced after the tied-weight all-reduce)."""

    index: int
    chunk: Optional[int]
    owner: Optional[int]
    dtype: Any
    slots: list[Slot] = field(default_factory=list)
    buffer: Any = None
    # per step
    ready: bool = False       # the gradients are final; the collectives may be issued
    submitted: bool = False   # they were (the buffer must not change any more)
    early: bool = False       # it became ready inside the backward, before its chunk's GradSync
    todo: int = 0             # hooks still expected before it is complete (early launch)
    # split_param: Paddle's FusedCommBuffer whose gradient buffer this bucket is, reduce-
    # scattered over its group (None: the bucket's own buffer, all-reduced or reduced)
    comm_buffer: Any = None

    @property
    def numel(self) -> int:
        return sum(s.numel for s in self.slots)

    @property
    def nbytes(self) -> int:
        return self.numel * _element_size(self.dtype)

    @property
    def label(self) -> str:
        where = "late" if self.chunk is None else f"chunk {self.chunk}"
        owner = "" if self.owner is None else f", owner {self.owner}"
        if self.comm_buffer is not None:
            owner = ", reduce-scattered"
        return f"bucket {self.index} ({where}{owner}, {len(self.slots)} params, {self.nbytes} B)"

    def allocate(self, reduce_scatter_group: Any = None) -> None:
        if reduce_scatter_group is None:
            self.buffer = paddle.zeros([self.numel], dtype=self.dtype)
        else:
            self.comm_buffer = _reduce_scatter_buffer(self.index, [s.param for s in self.slots], reduce_scatter_group)
            self.buffer = self.comm_buffer.grad_storage
            for slot in self.slots:
                slot.start = int(self.comm_buffer._sharding_param_grad_view[slot.param.name]._index)
        for slot in self.slots:
            slot.buffer = self.buffer
            slot.view = slot.region()
            slot.ptr = slot.view.data_ptr()
            slot.main_grad = uses_main_grad(slot.param)

    def shard(self, rank: int, nranks: int) -> Any:
        """This rank's slice of a reduce-scattered buffer (what the optimizer updates)."""
        size = int(self.buffer.shape[0]) // nranks
        return self.buffer._slice(rank * size, (rank + 1) * size)

    def renew_slices(self) -> None:
        """release_grads under split_param: the optimizer wants last step's slice gradients
        released (DygraphShardingOptimizerV2 asserts them uninitialized before it takes
        this step's from the FusedCommBuffer). The bucket keeps its buffer, so each slice
        gets a new tensor over the same region, and the old one lets go of it."""
        for view in self.comm_buffer._sharding_param_grad_view.values():
            old = view._slice_grad
            if old is not None:
                view._slice_grad = self.buffer._slice(view._param_begin, view._param_end)
                old._clear_dataptr()

    def reset(self, microbatches: int) -> None:
        self.ready = self.submitted = self.early = False
        self.todo = microbatches * len(self.slots)
        for slot in self.slots:
            slot.count = 0
            slot.attached = False

    @property
    def eligible(self) -> bool:
        """Whether hook counts can tell when this bucket is complete: every parameter
        got exactly one gradient per micro-batch in every step learned so far."""
        return all(s.always for s in self.slots)

    def take(self, slot: Slot, microbatches: int) -> None:
        """A backward just accumulated into slot's parameter: make sure its gradient
        is (in) the view, and count it (`todo` reaches 0 when every parameter had
        one gradient per micro-batch)."""
        grad = slot.grad()
        if grad is None:
            return
        if grad.data_ptr() != slot.ptr:
            # A fresh gradient (first micro-batch, or after clear_grad replaced it):
            # it holds the whole accumulated value, so copying it is exact.
            slot.view.copy_(grad, False)
            slot.attach()
        slot.attached = True
        slot.count += 1
        if slot.count <= microbatches:
            self.todo -= 1

    def seal(self) -> None:
        """Before the collectives: regions of parameters without a gradient in this step
        become zeros (peers may have one), and every parameter's gradient is its view."""
        for slot in self.slots:
            if not slot.attached:
                slot.view.zero_()
                slot.attach()
                slot.attached = True

    def learn(self, microbatches: int) -> None:
        for slot in self.slots:
            slot.always = slot.always and slot.count == microbatches


def _reduce_scatter_buffer(index: int, params: list, group: Any) -> Any:
    """Paddle's FusedCommBuffer for a reduce-scatter of params' gradients over group, as
    fleet's PipelineParallel builds it for DygraphShardingOptimizerV2 (which finds it
    through `params[0].comm_buffer_ref` at its step)."""
    from paddle.distributed.fleet.utils.tensor_fusion_helper import HOOK_ACTION, FusedCommBuffer

    return FusedCommBuffer(index, params, group, 1, HOOK_ACTION.REDUCE_SCATTER)


def build_buckets(chunks: Sequence[Iterable[Any]], late: Iterable[Any], bucket_bytes: int,
                  owner_of: Optional[Callable[[Any], int]] = None,
                  reduce_scatter_group: Any = None) -> list[GradBucket]:
    """Buckets for the trainable parameters of each chunk (in `chunks` order), then
    the late ones. `owner_of(param)`: the sharding rank that owns it, or None;
    `reduce_scatter_group`: split_param sharding's group (the buffers are Paddle's
    FusedCommBuffers, see the module docstring; owner_of must be None).
    Returns them with buffers allocated, indexed in that order."""
    if owner_of is not None and reduce_scatter_group is not None:
        raise ValueError("owner_of and reduce_scatter_group exclude each other: a reduce-scattered bucket has no "
                         "single owner")
    if bucket_bytes <= 0:
        raise ValueError(f"bucket size must be positive, got {bucket_bytes} bytes")
    buckets: list[GradBucket] = []
    late = list(late)
    for chunk, params in [*enumerate(chunks), (None, late)]:
        params = [p for p in params if not p.stop_gradient]
        ordered = list(reversed(params))
        position = {id(p): i for i, p in enumerate(ordered)}
        groups: dict[tuple, list] = {}
        for p in ordered:
            owner = owner_of(p) if owner_of is not None else None
            param_dtype = str(p.dtype) if reduce_scatter_group is not None else ""
            groups.setdefault((owner, str(grad_dtype(p)), param_dtype), []).append(p)
        made: list[tuple[int, GradBucket]] = []
        for (owner, *_), group in groups.items():
            dtype = grad_dtype(group[0])
            size = _element_size(dtype)
            current: Optional[GradBucket] = None
            for p in group:
                n = _numel(p)
                if current is None or (current.numel and (current.numel + n) * size > bucket_bytes):
                    current = GradBucket(0, chunk, owner, dtype)
                    made.append((0, current))
                current.slots.append(Slot(p, current.numel, n))
        # earliest layer last: the bucket is complete when its last parameter is
        made = [(max(position[id(s.param)] for s in b.slots), b) for _, b in made]
        made.sort(key=lambda item: item[0])
        buckets += [b for _, b in made]
    for i, b in enumerate(buckets):
        b.index = i
        b.allocate(reduce_scatter_group)
    return buckets
