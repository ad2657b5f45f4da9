"""How a rank runs one of its model chunks: the chunk runner, one class per way.

- PlainChunks: the PipelineLayer's forward for the chunk, the loss function, then
  autograd over the whole chunk from the loss or the received output gradients.
- NodeChunks (node_mode.py): the chunk as upstream's schedule nodes (the forward/backward
  overlap scheduler, #71995), the loss as a loss node, and an `F..&B..` step through the
  model's `overlapped_forward_backward`.

The interpreter calls forward / loss / backward on whichever it was given and registers
the runner's own action functions (`actions`: node mode's overlapped pair), so it never
asks which way a chunk runs.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

import paddle

from paddle_ext.pipeline.runtime.slots import Slot, StageLayout, requires_grad

__all__ = ["ChunkRunner", "PlainChunks"]


class ChunkRunner(Protocol):
    # action type -> function(interpreter, action) the interpreter registers (Interpreter.register)
    actions: dict[type, Callable[[Any, Any], None]]

    def forward(self, slot: Slot, chunk: int, inputs: Any) -> Any: ...
    def loss(self, slot: Slot, outputs: Any, mb: int) -> paddle.Tensor: ...
    def backward(self, slot: Slot, chunk: int, layout: StageLayout,
                 output_grads: Callable[[], list]) -> Optional[list]: ...


class PlainChunks:
    """forward: (input payload, chunk) -> output payload; loss: (last stage's output, mb)
    -> the scaled loss (or None in evaluation); backward_loss: runs the backward from a loss
    (scaler aware)."""

    def __init__(self, forward: Callable[[Any, int], Any], loss: Callable[[Any, int], Any],
                 backward_loss: Callable[[paddle.Tensor], None]) -> None:
        self._forward, self._loss, self._backward_loss = forward, loss, backward_loss
        self.actions: dict[type, Callable[[Any, Any], None]] = {}

    def forward(self, slot: Slot, chunk: int, inputs: Any) -> Any:
        return self._forward(inputs, chunk)

    def loss(self, slot: Slot, outputs: Any, mb: int) -> paddle.Tensor:
        return self._loss(outputs, mb)

    def backward(self, slot: Slot, chunk: int, layout: StageLayout,
                 output_grads: Callable[[], list]) -> Optional[list]:
        """Autograd over the chunk from the loss or its output gradients; the input
        gradients to send (None on the first stage)."""
        if layout.is_last(chunk):
            self._backward_loss(slot.loss)
        else:
            paddle.autograd.backward(requires_grad(slot.outputs), output_grads())
        if layout.is_first(chunk):
            return None
        return [t.grad if t.grad is not None else paddle.zeros_like(t) for t in requires_grad(slot.inputs)]
