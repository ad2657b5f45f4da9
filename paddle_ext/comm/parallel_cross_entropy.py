"""c_softmax_with_cross_entropy on CPU: fleet's ParallelCrossEntropy over gloo.

A tensor-parallel language model keeps its head's logits split over the vocabulary
(PaddleFormers' default, `tensor_parallel_output=True`) and takes the loss with fleet's
ParallelCrossEntropy, whose op c_softmax_with_cross_entropy Paddle implements for GPU and
XPU only: a CPU build raises "Do not support c_softmax_with_cross_entropy for cpu kernel
now" (3.x; 2.6 says "c_embedding"). Here the op runs on the host, with the GPU kernel
(#33401, in phi since #70165) as the reference for every number:

- forward, per row of logits [N, D] (this rank holds classes rank*D .. rank*D + D - 1):
  the group's maximum; the label's logit minus it, from the rank that holds the label;
  the group's sum of exponentials. loss = log(sum) - that logit, 0 where the label is
  ignore_index; softmax = this rank's exponentials / sum.
- backward: softmax, minus 1 at the label if this rank holds it, times the loss's
  gradient; 0 on ignored rows.

Two collectives per call, issued by every rank in the same order: a max, then one sum
that carries the picked logits and the sums of exponentials together (the GPU kernel's
two sums in one message). Before them, every rank agrees on whether any refused its
arguments (one small all_reduce), so a bad label raises on every rank instead of leaving
the others waiting: a ValueError naming the label's position, its value and the range
[0, classes) it must lie in unless it equals ignore_index (the GPU kernel's device-side
assert). Logit dtypes the GPU kernel does not register (it takes float32, float64,
float16) raise its RuntimeError; float16 is computed in float32 and rounded once. AMP
never applies here: Paddle turns auto_cast off on CPU builds, so the black-list cast the
GPU op gets under AMP has no CPU case. Other devices keep Paddle's op.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from paddle_ext import upstream
from paddle_ext.comm.gloo_exchange import agree_on_arguments

OP = "c_softmax_with_cross_entropy"
LOGIT_DTYPES = ("float32", "float64", "float16")
LABEL_DTYPES = ("int32", "int64")


def cpu_c_softmax_with_cross_entropy(original: Callable[..., Any], convention: str) -> Callable[..., Any]:
    """Paddle's op with a CPU path; `convention` is the owner module's calling convention
    (compat.c_softmax_with_cross_entropy_owners). Returns (softmax, loss) as the op does."""
    if convention == "positional":
        def c_softmax_with_cross_entropy(logits: Any, label: Any, *args: Any) -> Any:
            if not logits.place.is_cpu_place():
                return original(logits, label, *args)
            ignore_index, ring_id, rank, nranks = args
            return parallel_softmax_cross_entropy(logits, label, ignore_index, ring_id, rank, nranks)
    elif convention == "attributes":
        def c_softmax_with_cross_entropy(logits: Any, label: Any, *args: Any) -> Any:
            if not logits.place.is_cpu_place():
                return original(logits, label, *args)
            attrs = dict(zip(args[::2], args[1::2]))  # the op's defaults where an attribute is left out
            return parallel_softmax_cross_entropy(logits, label, attrs.get("ignore_index", -100),
                                                  attrs.get("ring_id", 0), attrs.get("rank", 0),
                                                  attrs.get("nranks", 1))
    else:
        raise ValueError(f"convention = {convention!r}: expected 'positional' or 'attributes'")
    c_softmax_with_cross_entropy.__wrapped__ = original  # type: ignore[attr-defined]
    return c_softmax_with_cross_entropy


def parallel_softmax_cross_entropy(logits: Any, label: Any, ignore_index: int, ring_id: int, rank: int,
                                   nranks: int) -> tuple[Any, Any]:
    """(softmax, loss) of logits split over the classes across the group `ring_id` names,
    this rank holding the rank-th slice; label has logits' shape with a last dim of 1."""
    group = upstream.group_map().get(int(ring_id))
    if group is None:
        raise ValueError(f"{OP}: ring_id = {ring_id} names no process group")
    error, problem = _argument_problem(logits, label, int(ignore_index), group, int(rank), int(nranks))
    rows = int(label.size)
    every_rows = agree_on_arguments(group.process_group, OP, problem, error, share=rows)
    if len(set(every_rows)) > 1:
        raise ValueError(f"{OP}: the ranks of the group hold {every_rows} rows of logits (in rank order): each "
                         f"holds its slice of the classes for the same rows")
    return _softmax_cross_entropy_class().apply(logits, label, group, int(rank), int(ignore_index), rows > 0)


def _dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).rsplit(".", 1)[-1]


def _argument_problem(logits: Any, label: Any, ignore_index: int, group: Any, rank: int,
                      nranks: int) -> tuple[type[Exception], str | None]:
    """(the error type, what is wrong) for this rank's arguments; (ValueError, None) if
    nothing is. The checks and error types of Paddle's infermeta and GPU kernel."""
    if _dtype_name(logits) not in LOGIT_DTYPES:
        return RuntimeError, (f"logits dtype {_dtype_name(logits)} is not supported: Paddle's GPU kernel "
                              f"takes {', '.join(LOGIT_DTYPES)}")
    if _dtype_name(label) not in LABEL_DTYPES:
        return ValueError, f"label dtype {_dtype_name(label)} is not supported: expected {' or '.join(LABEL_DTYPES)}"
    logits_shape, label_shape = list(logits.shape), list(label.shape)
    if len(label_shape) != len(logits_shape) or label_shape[:-1] != logits_shape[:-1] or label_shape[-1] != 1:
        return ValueError, (f"label shape {label_shape} must be logits' shape {logits_shape} with a last "
                            f"dimension of 1")
    if nranks != group.nranks or rank != group.rank:
        return ValueError, (f"rank = {rank}, nranks = {nranks}: the group of this ring has {group.nranks} "
                            f"ranks and this process is its rank {group.rank}")
    classes = logits_shape[-1] * nranks
    if label.size:
        flat = label.reshape([-1])
        bad = ((flat < 0) | (flat >= classes)) & (flat != ignore_index)
        if bool(bad.any()):
            import numpy as np

            at = int(bad.nonzero().flatten()[0])
            where = tuple(int(i) for i in np.unravel_index(at, label_shape))
            return ValueError, (f"label{list(where)} = {int(flat[at])} is out of range: labels must lie in "
                                f"[0, classes) = [0, {classes}) ({nranks} ranks x {logits_shape[-1]} classes "
                                f"each) or equal ignore_index = {ignore_index}")
    return ValueError, None


@functools.cache  # built on first use, as paddle is imported then
def _softmax_cross_entropy_class() -> Any:
    import paddle
    from paddle.autograd import PyLayer

    def reduce_(tensor: Any, op: Any, group: Any) -> None:
        paddle.distributed.all_reduce(tensor, op=op, group=group, sync_op=True)

    class SoftmaxCrossEntropy(PyLayer):
        @staticmethod
        def forward(ctx: Any, logits: Any, label: Any, group: Any, rank: int, ignore_index: int,
                    communicate: bool) -> Any:
            dtype = logits.dtype
            ctx.shape, ctx.dtype, ctx.empty = list(logits.shape), dtype, not communicate
            if ctx.empty:  # no rank has rows (they agreed); gloo refuses empty tensors, 2.6 empty arithmetic
                softmax = paddle.zeros(ctx.shape, dtype)
                ctx.mark_non_differentiable(softmax)
                return softmax, paddle.zeros(ctx.shape[:-1] + [1], dtype)
            width = logits.shape[-1]
            x = logits.reshape([-1, width])
            if x.dtype == paddle.float16:
                x = x.astype("float32")
            labels = label.reshape([-1, 1]).astype("int64")
            row_max = x.max(axis=-1, keepdim=True)
            reduce_(row_max, paddle.distributed.ReduceOp.MAX, group)
            shifted = x - row_max
            start = rank * width
            held = (labels >= start) & (labels < start + width)
            column = paddle.where(held, labels - start, paddle.zeros_like(labels))
            picked = paddle.where(held, paddle.take_along_axis(shifted, column, axis=1), paddle.zeros_like(row_max))
            exp = paddle.exp(shifted)
            sums = paddle.concat([picked, exp.sum(axis=-1, keepdim=True)], axis=1)
            reduce_(sums, paddle.distributed.ReduceOp.SUM, group)
            picked, total = sums[:, :1], sums[:, 1:]
            ignored = labels == ignore_index
            loss = paddle.where(ignored, paddle.zeros_like(total), paddle.log(total) - picked)
            softmax = exp / total
            ctx.save_for_backward(softmax, column, held, ignored)
            out_softmax = softmax.astype(dtype).reshape(ctx.shape)
            ctx.mark_non_differentiable(out_softmax)
            return out_softmax, loss.astype(dtype).reshape(ctx.shape[:-1] + [1])

        @staticmethod
        def backward(ctx: Any, softmax_grad: Any, loss_grad: Any) -> Any:
            if ctx.empty:
                return paddle.zeros(ctx.shape, ctx.dtype), None
            softmax, column, held, ignored = ctx.saved_tensor()
            one_at_label = paddle.put_along_axis(paddle.zeros_like(softmax), column,
                                                 held.astype(softmax.dtype), axis=1, reduce="add")
            grad = (softmax - one_at_label) * loss_grad.reshape([-1, 1]).astype(softmax.dtype)
            grad = paddle.where(ignored, paddle.zeros_like(grad), grad)
            return grad.astype(ctx.dtype).reshape(ctx.shape), None

    return SoftmaxCrossEntropy
