"""paddle_ext's ScheduleNode / ScheduleChunk, for Paddle releases that lack them.

Paddle 3.1+ ships these classes (fleet.meta_parallel, from upstream #71665 / #71995):
the pieces a model's `overlapped_forward_backward` runs one at a time. They behave
exactly like upstream's, so a model written against either works with both; which
class a run uses is decided in one place, paddle_ext.pipeline.nodes.

A ScheduleNode is a piece of the model that runs its forward and its backward on
its own: `forward(inputs)` detaches the inputs (the node is an autograd island),
calls the function and keeps what its backward needs; `backward(output_grad)` runs
autograd from the kept outputs and returns the gradients of every input (None for
inputs that need none). A loss node has `labels` (passed to the function as its
second argument) and optionally `scale_loss_factor` (the loss is divided by it);
its `backward(scaler=...)` starts from the loss. A ScheduleChunk chains nodes (or
chunks): forward through them in order, backward in reverse.
"""

from __future__ import annotations

from typing import Any, Callable

import paddle

__all__ = ["ScheduleNode", "ScheduleChunk"]


def _flatten(value: Any) -> tuple:
    """A node's inputs or outputs as a flat tuple (dicts by their values, in order)."""
    if isinstance(value, dict):
        out = []
        for v in value.values():
            out.extend(v if isinstance(v, (tuple, list)) else [v])
        return tuple(out)
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _detach(value: Any) -> Any:
    """Detached copies that keep stop_gradient, in the same structure."""
    if isinstance(value, paddle.Tensor):
        out = value.detach()
        out.stop_gradient = value.stop_gradient
        return out
    if isinstance(value, (tuple, list)):
        items = [_detach(v) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict):
        return {k: _detach(v) for k, v in value.items()}
    return value


class _PassThrough(paddle.autograd.PyLayer):
    """An output handle whose backward hands the gradient on unchanged; its forward
    allocates without copying (the value is never read), so keeping it costs nothing
    once its data is cleared."""

    @staticmethod
    def forward(ctx, x):
        return paddle.empty_like(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def _handles(outputs: Any, clear: bool) -> Any:
    def one(t):
        h = _PassThrough.apply(t)
        if clear:
            h._clear_dataptr()
        return h

    if isinstance(outputs, dict):
        return {k: one(t) for k, t in outputs.items() if isinstance(t, paddle.Tensor)}
    if isinstance(outputs, (tuple, list)):
        handles = [one(t) for t in outputs if isinstance(t, paddle.Tensor)]
        return tuple(handles) if isinstance(outputs, tuple) else handles
    return one(outputs)


class ScheduleNode:
    """A subgraph that runs forward and backward on its own (see module docstring).

    Use `node.backward(...)`, never paddle.autograd.backward on what forward returned.
    """

    def __init__(self, fwd_func: Callable, name: str = "") -> None:
        self.name = name
        self.fwd_func = fwd_func
        self.inputs: Any = None
        self.outputs: Any = None
        self.labels: Any = None
        self.scale_loss_factor: Any = None

    def forward(self, inputs: Any = (), **kwargs: Any) -> Any:
        self.inputs = _detach(inputs)
        if self.labels is not None:
            outputs = self.fwd_func(self.inputs, self.labels, **kwargs)
        else:
            outputs = self.fwd_func(self.inputs, **kwargs)
        if self.scale_loss_factor is not None:
            outputs /= self.scale_loss_factor
        # A loss keeps its value (the caller reads it); other outputs go on to the next
        # node or stage, and the handles kept for backward need no data.
        self.outputs = _handles(outputs, clear=self.labels is None)
        return outputs

    def backward(self, output_grad: Any = None, scaler: Any = None) -> tuple:
        if output_grad is None:
            outputs = self.outputs
            if isinstance(outputs, (tuple, list)):
                if len(outputs) != 1:
                    raise ValueError(f"ScheduleNode {self.name!r}: backward() without output "
                                     f"gradients needs one (loss) output, it has {len(outputs)}")
                outputs = outputs[0]
            paddle.autograd.backward(scaler.scale(outputs) if scaler is not None else outputs)
        else:
            grads = [g for g in _flatten(output_grad) if g is not None]
            outputs = [t for t in _flatten(self.outputs) if not t.stop_gradient]
            if len(outputs) != len(grads):
                raise ValueError(f"ScheduleNode {self.name!r}: {len(grads)} output gradients for "
                                 f"{len(outputs)} outputs that need one")
            paddle.autograd.backward(outputs, grads)
        grads = tuple(t.grad if t is not None else None for t in _flatten(self.inputs))
        self.inputs = self.outputs = self.labels = self.scale_loss_factor = None
        return grads


class ScheduleChunk:
    """Nodes (or chunks) run in order forward and in reverse order backward."""

    def __init__(self, nodes: list) -> None:
        self.nodes = nodes
        for n in nodes:
            if not isinstance(n, (ScheduleNode, ScheduleChunk)):
                raise TypeError(f"ScheduleChunk takes ScheduleNode / ScheduleChunk items, got "
                                f"{type(n).__name__}")

    def forward(self, inputs: Any) -> Any:
        for n in self.nodes:
            inputs = n.forward(inputs)
        return inputs

    def backward(self, output_grad: Any) -> Any:
        for n in reversed(self.nodes):
            output_grad = n.backward(output_grad)
        return output_grad
