"""What a rank keeps per (chunk, micro-batch) between its forward and its backward, and
the payload operations on it.

A Slot lives from a (chunk, mb)'s forward (or its activation's receive) until its input
gradients are sent (or, in evaluation, until its output is sent or handed over): the
interpreter, the links and the chunk runners all read and write the same Slot, so that
what a backward needs is in one place and letting it go frees it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import paddle

from paddle_ext.pipeline.runtime.transport import PayloadMeta, TensorMeta, as_tuple

__all__ = ["Slot", "Slots", "StageLayout", "release", "detached", "requires_grad", "input_grads_of"]


@dataclass(frozen=True)
class StageLayout:
    """Which global stages this rank's chunks are: the schedule's placement (schedule/ir.py).
    Interleaved: chunk c of rank r is stage c*pp + r. V (zb-v, dualpipev): rank r runs stages
    r (chunk 0) and 2*pp-1-r (chunk 1), so rank 0 also runs the last stage (the loss), and on
    the last rank chunk 0's output is chunk 1's input with no transfer (a local hand-over)."""

    rank: int
    pp: int
    vpp: int
    placement: str = "interleaved"

    def is_first(self, chunk: int) -> bool:
        return chunk == 0 and self.rank == 0

    def is_last(self, chunk: int) -> bool:
        if self.placement == "v":
            return chunk == 1 and self.rank == 0
        return chunk == self.vpp - 1 and self.rank == self.pp - 1

    def hands_over(self, chunk: int) -> bool:
        """V placement, last rank: chunk 1's input is chunk 0's output on this rank."""
        return self.placement == "v" and self.rank == self.pp - 1 and chunk == 1


@dataclass
class Slot:
    inputs: Any = None
    outputs: Any = None
    loss: Optional[paddle.Tensor] = None
    output_grad_meta: list = field(default_factory=list)
    output_is_tuple: bool = False
    output_grads: Optional[list] = None
    input_grads: Optional[list] = None
    chunk: Any = None      # node mode: the ScheduleChunk that ran the forward
    loss_node: Any = None  # node mode, last stage: the loss node

    def describe_outputs(self, meta: PayloadMeta) -> None:
        """The outputs' layout, known once they are sent: the gradients to receive for them."""
        self.output_grad_meta = grad_meta(meta)
        self.output_is_tuple = meta.is_tuple

    def as_payload(self, grads: list) -> Any:
        """Output gradients as upstream hands them to a node backward: a tuple for a tuple
        payload, the tensor itself for a single one."""
        return tuple(grads) if self.output_is_tuple else grads[0]

    def forget_forward(self) -> None:
        """After the backward: only the input gradients to send are left."""
        self.inputs = self.outputs = self.loss = self.output_grads = None
        self.chunk = self.loss_node = None


class Slots(dict):
    """(chunk, mb) -> Slot for the (chunk, mb)s whose work is not finished. forward_only:
    an evaluation run (no backward), where a slot goes once its output is sent or handed
    over."""

    def __init__(self, forward_only: bool = False) -> None:
        super().__init__()
        self.forward_only = forward_only

    def at(self, chunk: int, mb: int) -> Slot:
        """The slot of (chunk, mb), made on first use (a forward or a receive)."""
        return self.setdefault((chunk, mb), Slot())

    def left(self) -> str:
        return ", ".join(f"{c}.{m}" for c, m in sorted(self))


def grad_meta(meta: PayloadMeta) -> list[TensorMeta]:
    return [m for m in meta.tensors if not m.stop_gradient]


def requires_grad(payload: Any) -> list[paddle.Tensor]:
    return [t for t in as_tuple(payload) if isinstance(t, paddle.Tensor) and not t.stop_gradient]


def release(payload: Any) -> None:
    """Frees the data of tensors already sent; their autograd nodes stay usable. As
    fleet's PipelineParallel._release_output, not a tensor modified in place
    (inplace_version > 0) unless marked `pp_can_free`: a PyLayer's output that is one of
    its inputs counts so (a tensor a recompute segment passes through, position ids, say),
    and the recompute's backward reads it again."""
    for t in as_tuple(payload):
        if isinstance(t, paddle.Tensor) and t._is_initialized() and (
                t.inplace_version == 0 or getattr(t, "pp_can_free", False)):
            t._clear_dataptr()


def detached(payload: Any) -> Any:
    """A local hand-over's input: the producing chunk's outputs cut from its graph (as
    a receive would give them), keeping which of them need a gradient."""
    def cut(t: Any) -> Any:
        if not isinstance(t, paddle.Tensor):
            return t
        out = t.detach()
        out.stop_gradient = t.stop_gradient
        return out
    if isinstance(payload, (tuple, list)):
        return type(payload)(cut(t) for t in payload)
    return cut(payload)


def input_grads_of(inputs: Any, grads: Any) -> list[paddle.Tensor]:
    """The gradients to send back for the inputs that need one, from a backward's tuple
    (one entry per input, None where there is none)."""
    grads = as_tuple(grads)
    inputs = as_tuple(inputs)
    if len(grads) != len(inputs):
        raise ValueError(f"the backward returned {len(grads)} input gradients for {len(inputs)} "
                         "stage inputs")
    return [g if g is not None else paddle.zeros_like(t)
            for t, g in zip(inputs, grads) if isinstance(t, paddle.Tensor) and not t.stop_gradient]
