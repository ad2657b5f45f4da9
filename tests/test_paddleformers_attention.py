"""PaddleFormers' attention functions on CPU with the plugin, imported as a user's
script imports them: PaddleFormers first, paddle_ext.enable() after.

paddleformers.nn.attention takes `from paddle.nn.functional.flash_attention import
flashmask_attention` when it is imported; the flash_attention unit rebinds that name
(Patcher.swap(imported=True)), so its `flashmask` attention implementation runs on
the plugin's FlashMask kernel, where Paddle's function fails on a CPU build. The
reference is PaddleFormers' own eager attention (plain Paddle matmul / softmax,
gradients by autograd) with the mask it builds from the same start/end-row indices.
Runs in the paddleformers CI leg; skipped where PaddleFormers is not installed.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from paddle_ext import devices
from paddle_ext.patches import series

pytest.importorskip("paddleformers")
from paddleformers.nn.attention import eager_attention, flashmask_attention  # noqa: E402

pytestmark = pytest.mark.skipif(devices.device_build() != "cpu", reason="Paddle's own kernels answer on GPU builds")

B, S, HEADS, KV_HEADS, D = 2, 12, 4, 2, 8
DOCUMENTS = [[0, 5, 12], [0, 3, 4, 12]]  # document bounds per sequence


class Attention(paddle.nn.Layer):
    """What the attention functions read from their module: GQA's group count, training."""

    num_key_value_groups = HEADS // KV_HEADS
    is_causal = True


def causal_document_indices() -> paddle.Tensor:
    """[B, 1, S, 1] int32: for key column j, the row where its document ends
    (FlashMask's causal LTS form: rows at or below it do not see column j)."""
    lts = np.zeros([B, 1, S, 1], np.int32)
    for b, bounds in enumerate(DOCUMENTS):
        for start, end in zip(bounds[:-1], bounds[1:]):
            lts[b, 0, start:end, 0] = end
    return paddle.to_tensor(lts)


def inputs(seed: int):
    rng = np.random.default_rng(seed)
    make = lambda heads: paddle.to_tensor(rng.standard_normal([B, heads, S, D]).astype("float32"),  # noqa: E731
                                          stop_gradient=False)
    return make(HEADS), make(KV_HEADS), make(KV_HEADS)


def run(forward, **kwargs):
    q, k, v = inputs(7)
    out, _ = forward(Attention(), q, k, v, **kwargs)
    grad = paddle.to_tensor(np.random.default_rng(8).standard_normal(out.shape).astype("float32"))
    (out * grad).sum().backward()
    return [t.numpy() for t in (out, q.grad, k.grad, v.grad)]


def test_flashmask_imported_before_enable_runs_on_the_plugin(clean_series):
    import paddle.nn.functional.flash_attention as paddles_module

    indices = causal_document_indices()
    paddles_flashmask = paddles_module.flashmask_attention
    # disabled: the module holds Paddle's function, which has no CPU path
    assert flashmask_attention.flashmask_attention is paddles_module.flashmask_attention
    with pytest.raises((ValueError, RuntimeError)):  # 3.3.1: it reads a flag CPU builds lack
        run(flashmask_attention.flashmask_attention_forward, attn_mask_startend_row_indices=indices)

    clean_series.enable()
    assert flashmask_attention.flashmask_attention is paddles_module.flashmask_attention  # the plugin's now
    assert series().installed_by(flashmask_attention.flashmask_attention) == "flash_attention"
    got = run(flashmask_attention.flashmask_attention_forward, attn_mask_startend_row_indices=indices)
    want = run(eager_attention.eager_attention_forward, attn_mask_startend_row_indices=indices, scaling=D ** -0.5)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-6 * max(1.0, np.abs(w).max()), err_msg=name)

    clean_series.disable()
    assert series().installed_by(flashmask_attention.flashmask_attention) is None
    assert flashmask_attention.flashmask_attention is paddles_flashmask


def test_flashmask_without_indices_is_causal_attention(plugin_enabled):
    got = run(flashmask_attention.flashmask_attention_forward, attn_mask_startend_row_indices=None)
    full = paddle.to_tensor(np.full([B, 1, S, 1], S, np.int32))  # one document: causal only
    want = run(eager_attention.eager_attention_forward, attn_mask_startend_row_indices=full, scaling=D ** -0.5)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-6 * max(1.0, np.abs(w).max()), err_msg=name)
