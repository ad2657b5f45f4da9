"""Under paddle.no_grad() the plugin's ops record no autograd graph, as Paddle's own ops.

Paddle's custom-op runner builds a grad node whenever an input wants a gradient,
whatever the grad mode (compat.run_custom_op). Before the plugin detached the inputs
there, an output computed under no_grad wanted a gradient and a later backward through
it reached the inputs: with a frozen reference model under no_grad (DPO, distillation)
its parameters got gradients. Each case computes y from x under no_grad, then runs a
backward through y * 2 and through a parameter p, and checks what Paddle's own ops
give: y.stop_gradient, no gradient for x, p's gradient. Stock CPU kernels run the same
check where they exist (flash_attention's math path, c_embedding)."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

B, S, H, D = 2, 8, 2, 16


def _flash_attention(x):
    from paddle.nn.functional.flash_attention import flash_attention

    # not causal: stock 2.6.2's CPU path has no causal kernel (softmax_mask_fuse is GPU only)
    return flash_attention(x, x, x)[0]


def _flash_attn_unpadded(x):  # x: [B * S, H, D]
    from paddle.nn.functional.flash_attention import flash_attn_unpadded

    cu = paddle.to_tensor([0, S, 2 * S], dtype="int32")
    return flash_attn_unpadded(x, x, x, cu, cu, S, S, scale=D ** -0.5)[0]


def _rotary(x):
    from paddle.incubate.nn.functional import fused_rotary_position_embedding

    return fused_rotary_position_embedding(x, x, None)[0]


def _rms_norm_ext(x):
    from paddle.incubate.nn.functional import fused_rms_norm_ext

    return fused_rms_norm_ext(x, paddle.ones([D]), 1e-5)[0]


def _fused_rms_norm(x):  # x: bfloat16
    from paddle.incubate.nn.functional import fused_rms_norm

    return fused_rms_norm(x, paddle.ones([D], "bfloat16"), None, 1e-5, 3)[0]


def _c_embedding(x):  # x: the table, [rows, D]
    from paddle.distributed.fleet.layers.mpu import mp_ops

    ids = paddle.to_tensor([[1, 3, 0]], dtype="int64")
    return mp_ops._c_lookup_table(x, ids, start_index=0, vocab_size=int(x.shape[0]))


# name -> (op, its input's shape and dtype). The input is made outside no_grad: a
# reshape or cast under no_grad would itself cut the graph and hide the fault.
CASES = {"flash_attention": (_flash_attention, [B, S, H, D], "float32"),
         "flash_attn_unpadded": (_flash_attn_unpadded, [B * S, H, D], "float32"),
         "fused_rotary_position_embedding": (_rotary, [B, S, H, D], "float32"),
         "fused_rms_norm bfloat16": (_fused_rms_norm, [B, S, H, D], "bfloat16"),
         "c_embedding": (_c_embedding, [B * S, D], "float32")}
if hasattr(paddle.incubate.nn.functional, "fused_rms_norm_ext"):  # 3.x
    CASES["fused_rms_norm_ext"] = (_rms_norm_ext, [B, S, H, D], "float32")
STOCK_ON_CPU = ("flash_attention", "c_embedding")


def _input(name, seed=0):
    _, shape, dtype = CASES[name]
    x = paddle.to_tensor(np.random.default_rng(seed).standard_normal(shape).astype("float32")).astype(dtype)
    x.stop_gradient = False
    return x


def _run_under_no_grad(name):
    """(y, x, p) after y = op(x) under no_grad and a backward through y * 2 and p."""
    x = _input(name)
    p = paddle.to_tensor(np.ones(3, "float32"), stop_gradient=False)
    with paddle.no_grad():
        y = CASES[name][0](x)
    ((y.astype("float32") * 2).sum() + (p * 3).sum()).backward()
    return y, x, p


@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_under_no_grad_record_no_graph(plugin_enabled, name):
    y, x, p = _run_under_no_grad(name)
    assert y.stop_gradient, f"{name}: an output computed under no_grad wants a gradient"
    assert x.grad is None, f"{name}: a backward after no_grad reached the input"
    np.testing.assert_array_equal(p.grad.numpy(), np.full(3, 3, "float32"))


@pytest.mark.parametrize("name", STOCK_ON_CPU)
def test_stock_paddle_gives_the_same(clean_series, name):
    y, x, _ = _run_under_no_grad(name)
    assert y.stop_gradient and x.grad is None


@pytest.mark.parametrize("name", sorted(CASES))
def test_grad_mode_still_records(plugin_enabled, name):
    x = _input(name, seed=1)
    y = CASES[name][0](x)
    assert not y.stop_gradient
    y.astype("float32").sum().backward()
    assert x.grad is not None and float(x.grad.astype("float32").abs().sum()) > 0


def test_user_tensors_keep_their_flags(plugin_enabled):
    """Detaching under no_grad makes copies of the arguments; the caller's tensors keep
    stop_gradient = False and get gradients from a later backward of their own."""
    x = paddle.to_tensor(np.ones((B, S, H, D), "float32"), stop_gradient=False)
    with paddle.no_grad():
        _flash_attention(x)
    assert not x.stop_gradient
    (x * 5).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((B, S, H, D), 5, "float32"))
