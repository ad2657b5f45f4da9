"""The loss stage's losses of one step, with Paddle 3.x's contract for several loss functions.

`PipelineLayer(..., loss_fn=[loss_a, loss_b])`: Paddle 3.x's PipelineParallel computes every
loss function on the last stage for each micro-batch (in list order, each divided by
accumulate_steps unless delay_scale_loss, under `auto_cast(enable=False)`), back-propagates
`loss_fn[loss_fn_idx]`, and `train_batch` / `eval_batch` / `forward_backward_pipeline`
return one entry per loss function: the sum over micro-batches (divided by accumulate_steps
under delay_scale_loss), or with `return_micro_batch_loss=True` the per-micro-batch losses
stacked; a single loss function gives the tensor itself, not a one-entry list. 2.6's
PipelineLayer takes the list too (it stores what it is given); the engine serves it the same.

Under the forward/backward overlap scheduler the chosen loss runs as a loss node (the
interpreter, or the model's `overlapped_forward_backward`, calls its forward); the other
loss functions run as nodes of their own on the same outputs, as Paddle's
`_maybe_loss_compute` builds one per loss function (Paddle's own F&B step records only
the chosen one: "In overlap mode, only one loss_fn is supported"; here every entry is kept).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import paddle

from paddle_ext.errors import InvalidArgumentError


def check_loss_fn_idx(loss_fns: Sequence[Any], loss_fn_idx: int) -> None:
    """Paddle asserts the index names a loss function; the same refusal, naming the range."""
    if not isinstance(loss_fn_idx, int) or not 0 <= loss_fn_idx < len(loss_fns) or loss_fns[loss_fn_idx] is None:
        raise InvalidArgumentError(
            f"loss_fn_idx = {loss_fn_idx!r} names no loss function of the PipelineLayer: it has "
            f"{len(loss_fns)} (loss_fn_idx in [0, {len(loss_fns) - 1}], an entry that is not None)")


class StageLosses:
    """Computes and records the losses of the loss stage for one step.

    loss_fns: the PipelineLayer's loss functions; chosen: the index back-propagated;
    labels: mb -> that micro-batch's labels; scale: divide each loss by this count (None:
    delay_scale_loss or one micro-batch)."""

    def __init__(self, loss_fns: Sequence[Any], chosen: int, labels: Callable[[int], Any],
                 scale: Optional[int]) -> None:
        check_loss_fn_idx(loss_fns, chosen)
        self.loss_fns = list(loss_fns)
        self.chosen = chosen
        self.labels = labels
        self.scale = scale
        self.per_fn: list[list[paddle.Tensor]] = [[] for _ in self.loss_fns]

    def _scaled(self, loss: Any) -> paddle.Tensor:
        if not isinstance(loss, paddle.Tensor):
            raise TypeError(f"a loss function of the PipelineLayer returned {type(loss).__name__}; "
                            "it must return a paddle.Tensor")
        if self.scale is None:
            return loss
        with paddle.amp.auto_cast(enable=False):
            return loss / self.scale

    def __call__(self, output: Any, mb: int) -> paddle.Tensor:
        """Every loss function on `output` (micro-batch mb), in order; returns the chosen
        one (scaled), to back-propagate."""
        chosen = None
        for idx, fn in enumerate(self.loss_fns):
            loss = self._scaled(fn(output, self.labels(mb)))
            self.per_fn[idx].append(loss.detach())
            if idx == self.chosen:
                chosen = loss
        return chosen

    def node(self, mb: int, index: Optional[int] = None) -> Any:
        """Loss function `index`'s (default: the chosen one's) loss node for micro-batch mb,
        its labels and scale set as Paddle sets them."""
        from paddle_ext.pipeline import nodes

        node = nodes.loss_node(self.loss_fns[self.chosen if index is None else index])
        node.labels = self.labels(mb)
        if self.scale is not None:
            node.scale_loss_factor = self.scale
        return node

    def record_node_loss(self, loss: paddle.Tensor, output: Any, mb: int) -> None:
        """The chosen loss a loss node computed on `output`; the other loss functions run
        here, each through a node of its own."""
        for idx in range(len(self.loss_fns)):
            if idx == self.chosen:
                self.per_fn[idx].append(loss.detach())
            else:
                self.per_fn[idx].append(self.node(mb, idx).forward(output).detach())

    def totals(self, per_microbatch: bool, delay_scale: Optional[int]) -> list[paddle.Tensor]:
        """One entry per loss function: the per-micro-batch losses stacked, or their sum in
        the order Paddle sums them (divided by `delay_scale` when given)."""
        out = []
        for losses in self.per_fn:
            if per_microbatch:
                out.append(paddle.stack(losses))
                continue
            total = paddle.zeros_like(losses[0])
            for item in losses:
                total += item
            out.append(total / delay_scale if delay_scale else total)
        return out
