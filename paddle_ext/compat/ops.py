"""Version differences in running and naming ops: the eager custom-op runner (3.x's
_C_ops._run_custom_op, 2.6's core.eager), c_embedding of empty ids, fused_rms_norm's op name."""

from __future__ import annotations

import functools
from typing import Any

from paddle_ext.compat.version import paddle_before


@functools.cache
def _custom_op_runner():
    # 3.x exposes the eager custom-op entry as _C_ops._run_custom_op; 2.6 as core.eager's.
    from paddle import _C_ops

    runner = getattr(_C_ops, "_run_custom_op", None)
    if runner is None:
        from paddle.base import core

        runner = core.eager._run_custom_op
    return runner


def run_custom_op(op_name: str, *args: Any) -> list:
    """Runs a registered custom op eagerly; always returns the list of outputs.

    Under `paddle.no_grad()` the tensor arguments go in detached. Paddle's custom-op
    runner (2.6.2 and 3.x) builds the op's grad node whenever an input wants a
    gradient, whatever the grad mode: its outputs came back wanting gradients and
    holding the saved inputs, and a later backward through them reached tensors
    computed under no_grad (a frozen reference model's parameters, say). Paddle's own
    ops record nothing there, and the plugin serves Paddle's names."""
    import paddle

    if paddle.in_dynamic_mode() and not paddle.is_grad_enabled():
        args = tuple(_without_grad(a) for a in args)
    outs = _custom_op_runner()(op_name, *args)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def _without_grad(arg: Any) -> Any:
    """A tensor argument (or a list of them) detached; anything else as it is."""
    import paddle

    if isinstance(arg, paddle.Tensor):
        return arg.detach() if not arg.stop_gradient else arg
    if isinstance(arg, (list, tuple)) and any(isinstance(a, paddle.Tensor) for a in arg):
        return type(arg)(_without_grad(a) for a in arg)
    return arg


def empty_embedding_lookup(weight: Any, ids: Any, start_index: int, vocab_size: int) -> Any:
    """c_embedding of ids with no element: an empty ids.shape + [width] output of weight's
    dtype, its gradient in weight zero. The custom-op runner of Paddle 2.6 and 3.0 refuses an
    op's empty output ("not initialized"), where stock's c_embedding answers. 3.x: zeros plus
    an empty broadcast of a weight row (any dtype); 2.6, whose elementwise ops refuse
    zero-size tensors, gets Paddle's own c_embedding op."""
    import paddle
    from paddle import _C_ops

    if paddle_before(3, 0):
        return _C_ops.c_embedding(weight, ids, start_index, vocab_size)
    return paddle.zeros(list(ids.shape) + [weight.shape[1]], dtype=weight.dtype) + weight[0:1] * 0


def fused_rms_norm_op_name() -> str | None:
    """The paddle._C_ops function behind paddle.incubate.nn.functional.fused_rms_norm
    (x, bias, residual, norm_weight, norm_bias, epsilon, begin_norm_axis, quant...):
    fused_rms_norm_quant on 3.3, which gave the name rms_norm to the op of the new
    paddle.nn.functional.rms_norm (#76920, #76930); rms_norm before (2.6)."""
    import paddle

    for name in ("fused_rms_norm_quant", "rms_norm"):
        if hasattr(paddle._C_ops, name):
            if name == "rms_norm" and hasattr(paddle.nn.functional, "rms_norm"):
                return None  # the new op only: this release's fused_rms_norm calls something else
            return name
    return None
