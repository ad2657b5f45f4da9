"""Node mode: chunks run as upstream's schedule nodes (the forward/backward overlap
scheduler, upstream #71995), the one optional part of the interpreter.

The chunk is a ScheduleChunk (`schedule_chunk(chunk)`), the loss a loss node
(`loss_node(mb)`, labels and scale set), and an `F..&B..` step calls the model's
`overlapped_forward_backward` with upstream's arguments: `OverlappedPair`, the function
NodeChunks registers for FB actions. Without that method an F&B runs as its F then its B
(the interpreter's own FB function).

Zero-bubble schedules: an F&B pair runs under the split capture of its forward half
(interpreter.py's docstring says why only that half's matmuls are deferred).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import paddle

from paddle_ext.pipeline.runtime.slots import Slot, StageLayout, input_grads_of
from paddle_ext.pipeline.schedule.ir import FB

__all__ = ["NodeChunks", "OverlappedPair"]


class NodeChunks:
    """schedule_chunk: chunk -> ScheduleChunk; loss_node: mb -> loss node with labels and
    scale set; record_loss: (the loss a loss node computed, the chunk's outputs, mb) -> kept
    (pipeline/losses.py computes the other loss functions from the outputs); the model's
    bound overlapped_forward_backward (None: F&B runs as F then B); the grad scaler."""

    def __init__(self, schedule_chunk: Callable[[int], Any], loss_node: Callable[[int], Any],
                 record_loss: Callable[[paddle.Tensor, Any, int], None],
                 overlapped_forward_backward: Optional[Callable[..., Any]] = None, scaler: Any = None) -> None:
        self.schedule_chunk, self.loss_node, self.record_loss = schedule_chunk, loss_node, record_loss
        self.scaler = scaler
        self.actions: dict[type, Callable[[Any, Any], None]] = {}
        if overlapped_forward_backward is not None:
            self.actions[FB] = OverlappedPair(self, overlapped_forward_backward)

    def forward(self, slot: Slot, chunk: int, inputs: Any) -> Any:
        slot.chunk = self.schedule_chunk(chunk)
        return slot.chunk.forward(inputs)

    def loss(self, slot: Slot, outputs: Any, mb: int) -> paddle.Tensor:
        slot.loss_node = self.loss_node(mb)
        loss = slot.loss_node.forward(outputs)
        self.record_loss(loss, outputs, mb)
        return loss

    def backward(self, slot: Slot, chunk: int, layout: StageLayout,
                 output_grads: Callable[[], list]) -> Optional[list]:
        """The loss node's backward on the last stage (else the output gradients), then the
        chunk's nodes in reverse; the input gradients to send (None on the first stage)."""
        if layout.is_last(chunk):
            grads = slot.loss_node.backward(scaler=self.scaler)
        else:
            grads = slot.as_payload(output_grads())
        input_grads = slot.chunk.backward(grads)
        return None if layout.is_first(chunk) else input_grads_of(slot.inputs, input_grads)


class OverlappedPair:
    """FB(f, b) through the model's overlapped_forward_backward: the forward half builds
    its chunk's nodes, the backward half runs the nodes b's forward built; transfers go
    through the links' p2p_async_handle when they run on threads."""

    def __init__(self, chunks: NodeChunks, method: Callable[..., Any]) -> None:
        self.chunks, self.method = chunks, method

    def __call__(self, run: Any, pair: FB) -> None:
        """run: the Interpreter running the step."""
        f, b, layout, chunks = pair.f, pair.b, run.layout, self.chunks
        forward_inputs = run.forward_input(f.chunk, f.mb)
        if run.program.micro_steps is not None:  # as Paddle's overlapped step: numbered hooks only
            run.program.micro_steps.pair_begin()
        fslot, bslot = run.slots[(f.chunk, f.mb)], run.slots[(b.chunk, b.mb)]
        forward_chunk = chunks.schedule_chunk(f.chunk)
        forward_loss_node = chunks.loss_node(f.mb) if layout.is_last(f.chunk) else None
        grads, pending = self._backward_output_grads(run, b, bslot)
        handle = run.links.pair_handle(pair)
        with run.capture(f.chunk, f.mb):  # the forward half's matmuls split when its backward is an I
            forward_outputs, forward_loss, backward_grads = self.method(
                forward_chunk, forward_inputs, forward_loss_node, bslot.chunk,
                bslot.loss_node if layout.is_last(b.chunk) else None, grads, chunks.scaler,
                p2p_async_handle=handle)
        if pending and not handle.backward_waited:
            raise RuntimeError(
                "overlapped_forward_backward got a p2p_async_handle and returned without calling "
                "backward_handle_wait(): with overlap_p2p_comm the output gradients are still being "
                "received while it runs; call it before the first backward node")
        fslot.chunk = forward_chunk
        if layout.is_last(f.chunk):
            if forward_loss is None:
                raise RuntimeError("overlapped_forward_backward returned forward_loss None on the last "
                                   "stage: it must return forward_loss_fn_node.forward(outputs)")
            fslot.loss_node, fslot.loss = forward_loss_node, forward_loss
            chunks.record_loss(forward_loss, forward_outputs, f.mb)
            forward_outputs = None
        run.forward_done(f.chunk, f.mb, forward_outputs)
        run.backward_begins()  # its activation is freed after the forward made its own
        if pending:
            run.links.output_grads(b.chunk, b.mb)  # done already (backward_handle_wait); re-raise errors
        run.backward_done(b.chunk, b.mb, None if layout.is_first(b.chunk) else input_grads_of(bslot.inputs,
                                                                                            backward_grads))

    @staticmethod
    def _backward_output_grads(run: Any, b: Any, bslot: Slot) -> tuple[Any, bool]:
        """The backward half's output gradients as upstream passes them (None on the last
        stage), and whether they are still being received (filled once the handle's
        backward_handle_wait() returns)."""
        if run.layout.is_last(b.chunk):
            return None, False
        if run.layout.hands_over(b.chunk + 1):
            return bslot.as_payload(run.output_grads(b.chunk, b.mb)), False
        grads, pending = run.links.pending_output_grads(b.chunk, b.mb)
        return bslot.as_payload(grads), pending
