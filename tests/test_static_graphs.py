"""Static graphs with the plugin enabled: a paddle.static program and a
paddle.jit.to_static function that call Paddle's flash attention names
(flash_attention, flash_attn_unpadded, flash_attn_qkvpacked,
flash_attn_varlen_qkvpacked, flashmask_attention) and fused_rotary_position_embedding run on CPU
(Paddle's own ops have no CPU kernel there) and give the dynamic results, bit for
bit, forward and gradients."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_ext


@pytest.fixture
def enabled(monkeypatch):
    monkeypatch.delenv("PADDLE_EXT_PATCHES", raising=False)
    paddle_ext.disable()
    paddle_ext.enable()
    yield
    paddle.disable_static()
    paddle_ext.disable()


def _fa():
    import paddle.nn.functional.flash_attention as module

    return module


def _rope(*args, **kwargs):
    import paddle.incubate.nn.functional as functional

    return functional.fused_rotary_position_embedding(*args, **kwargs)


def _inputs():
    rng = np.random.default_rng(42)
    cu = np.array([0, 5, 5, 16, 24], np.int32)  # an empty sequence included
    padded_cu = np.array([0, 5, 12], np.int32)  # varlen_padded: rows b * 8 .. b * 8 + len
    return {
        "q": rng.standard_normal((2, 24, 4, 32)).astype(np.float32),
        "k": rng.standard_normal((2, 24, 2, 32)).astype(np.float32),
        "sin": np.sin(rng.uniform(-3, 3, (30, 32))).astype(np.float32),
        "cos": np.cos(rng.uniform(-3, 3, (30, 32))).astype(np.float32),
        "ids": rng.integers(0, 30, (2, 24)).astype(np.int64),
        "cu": cu,
        "qkv": rng.standard_normal((2, 24, 3, 2, 32)).astype(np.float32),
        "padded_cu": padded_cu,
        # two documents, [0, 10) and [10, 24): key j hidden from the rows below its document
        "startend": np.where(np.arange(24) < 10, 10, 24).astype(np.int32).reshape(1, 1, 24, 1).repeat(2, 0),
    }


def _model(t):
    """Every routed name once; returns the outputs and what their gradients are taken of."""
    fa = _fa()
    q, k = t["q"], t["k"]
    rq, rk, _ = _rope(q, k, sin=t["sin"], cos=t["cos"], position_ids=t["ids"], use_neox_rotary_style=False)
    out_fa, _ = fa.flash_attention(rq, rk, k, causal=True)
    flat_q = q.reshape([48, 4, 32])
    flat_k = k.reshape([48, 2, 32])
    out_varlen, _ = fa.flash_attn_unpadded(flat_q[:24], flat_k[:24], flat_k[:24], t["cu"], t["cu"], 11, 11,
                                           0.2, causal=True)
    out_packed, _ = fa.flash_attn_qkvpacked(t["qkv"], causal=True)
    packed_rows = t["qkv"].reshape([48, 3, 2, 32])[:16]
    out_vpacked, _ = fa.flash_attn_varlen_qkvpacked(packed_rows, t["padded_cu"], t["padded_cu"], 8, 8, 0.3,
                                                    causal=False)
    out_mask = fa.flashmask_attention(q, k, k, t["startend"], causal=True)
    outs = [out_fa, out_varlen, out_packed, out_vpacked, out_mask]
    loss = sum((o * o).mean() for o in outs)
    return outs, loss


def _dynamic(data):
    t = {name: paddle.to_tensor(value) for name, value in data.items()}
    for name in ("q", "k", "qkv"):
        t[name].stop_gradient = False
    outs, loss = _model(t)
    grads = paddle.grad([loss], [t["q"], t["k"], t["qkv"]])
    return [o.numpy() for o in outs], [g.numpy() for g in grads]


def test_static_program_runs_the_plugin_ops_and_equals_dynamic(enabled):
    data = _inputs()
    want_outs, want_grads = _dynamic(data)
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        t = {name: paddle.static.data(name, list(value.shape), str(value.dtype)) for name, value in data.items()}
        for name in ("q", "k", "qkv"):
            t[name].stop_gradient = False
        outs, loss = _model(t)
        grads = paddle.static.gradients([loss], [t["q"], t["k"], t["qkv"]])
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    got = exe.run(main, feed=data, fetch_list=[*outs, *grads])
    for name, a, b in zip(("flash_attention", "flash_attn_unpadded", "flash_attn_qkvpacked",
                           "flash_attn_varlen_qkvpacked", "flashmask_attention", "dq", "dk", "dqkv"), got,
                          want_outs + want_grads):
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert not got[3][5:8].any() and not got[3][15:].any() and got[3][8:15].all()  # padding rows: zeros


def test_to_static_function_equals_dynamic(enabled):
    data = _inputs()
    want_outs, want_grads = _dynamic(data)

    @paddle.jit.to_static(full_graph=True)
    def run(q, k, sin, cos, ids, cu, qkv, padded_cu, startend):
        outs, loss = _model(dict(q=q, k=k, sin=sin, cos=cos, ids=ids, cu=cu, qkv=qkv, padded_cu=padded_cu,
                                 startend=startend))
        return outs, loss

    t = {name: paddle.to_tensor(value) for name, value in data.items()}
    for name in ("q", "k", "qkv"):
        t[name].stop_gradient = False
    outs, loss = run(**t)
    loss.backward()
    for name, a, b in zip(("flash_attention", "flash_attn_unpadded", "flash_attn_qkvpacked",
                           "flash_attn_varlen_qkvpacked", "flashmask_attention"), outs, want_outs):
        np.testing.assert_array_equal(a.numpy(), b, err_msg=name)
    for name, g, want in zip(("dq", "dk", "dqkv"), (t["q"].grad, t["k"].grad, t["qkv"].grad), want_grads):
        np.testing.assert_array_equal(g.numpy(), want, err_msg=name)
