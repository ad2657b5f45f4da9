"""Static graphs with the plugin enabled: a paddle.static program and a
paddle.jit.to_static function that call Paddle's flash attention names
(flash_attention, flash_attn_unpadded, flash_attn_qkvpacked,
flash_attn_varlen_qkvpacked, flashmask_attention on 3.x) and fused_rotary_position_embedding run on CPU
(Paddle's own ops have no CPU kernel there) and give the dynamic results, bit for
bit, forward and gradients."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_ext
import paddle_ext.ops as ops


@pytest.fixture
def enabled(plugin_enabled):
    yield
    paddle.disable_static()


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
        "v": rng.standard_normal((2, 24, 2, 32)).astype(np.float32),
        "uq": rng.standard_normal((24, 4, 32)).astype(np.float32),
        "uk": rng.standard_normal((24, 2, 32)).astype(np.float32),
        "sin": np.sin(rng.uniform(-3, 3, (30, 32))).astype(np.float32),
        "cos": np.cos(rng.uniform(-3, 3, (30, 32))).astype(np.float32),
        "ids": rng.integers(0, 30, (2, 24)).astype(np.int64),
        "cu": cu,
        "qkv": rng.standard_normal((2, 24, 3, 2, 32)).astype(np.float32),
        "rows": rng.standard_normal((16, 3, 2, 32)).astype(np.float32),
        "padded_cu": padded_cu,
        "mq": rng.standard_normal((2, 24, 4, 32)).astype(np.float32),
        "mk": rng.standard_normal((2, 24, 2, 32)).astype(np.float32),
        "mv": rng.standard_normal((2, 24, 2, 32)).astype(np.float32),
        # two documents, [0, 10) and [10, 24): key j hidden from the rows below its document
        "startend": np.where(np.arange(24) < 10, 10, 24).astype(np.int32).reshape(1, 1, 24, 1).repeat(2, 0),
    }


def _has_flashmask() -> bool:
    return hasattr(_fa(), "flashmask_attention")  # 3.x only


LEAVES = ("q", "k", "v", "uq", "uk", "qkv", "rows") + (("mq", "mk", "mv") if _has_flashmask() else ())
OUT_NAMES = ("flash_attention", "flash_attn_unpadded", "flash_attn_qkvpacked", "flash_attn_varlen_qkvpacked") + (
    ("flashmask_attention",) if _has_flashmask() else ())


def _model(t):
    """Every routed name once, each input into one op (so that no gradient is a sum
    whose order the graph may change); returns the outputs and the loss."""
    fa = _fa()
    rq, rk, _ = _rope(t["q"], t["k"], sin=t["sin"], cos=t["cos"], position_ids=t["ids"],
                      use_neox_rotary_style=False)
    out_fa, _ = fa.flash_attention(rq, rk, t["v"], causal=True)
    out_varlen, _ = fa.flash_attn_unpadded(t["uq"], t["uk"], t["uk"] * 0.5, t["cu"], t["cu"], 11, 11, 0.2,
                                           causal=True)
    # Paddle's packed names where the release has them (3.x), else the plugin's (2.6.2)
    qkvpacked = getattr(fa, "flash_attn_qkvpacked", ops.flash_attn_qkvpacked)
    varlen_qkvpacked = getattr(fa, "flash_attn_varlen_qkvpacked", ops.flash_attn_varlen_qkvpacked)
    out_packed, _ = qkvpacked(t["qkv"], causal=True)
    out_vpacked, _ = varlen_qkvpacked(t["rows"], t["padded_cu"], t["padded_cu"], 8, 8, 0.3,
                                                    causal=False)
    outs = [out_fa, out_varlen, out_packed, out_vpacked]
    if _has_flashmask():
        outs.append(fa.flashmask_attention(t["mq"], t["mk"], t["mv"], t["startend"], causal=True))
    loss = sum((o * o).mean() for o in outs)
    return outs, loss


def _dynamic(data):
    t = {name: paddle.to_tensor(value) for name, value in data.items()}
    for name in LEAVES:
        t[name].stop_gradient = False
    outs, loss = _model(t)
    grads = paddle.grad([loss], [t[name] for name in LEAVES])
    return [o.numpy() for o in outs], [g.numpy() for g in grads]


def _run_static(model, data, leaves):
    """model(inputs) -> (outs, loss) as a static program fed `data`, with `leaves` wanting
    gradients: the fetched outs, then the leaves' gradients."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        t = {name: paddle.static.data(name, list(value.shape), str(value.dtype)) for name, value in data.items()}
        for name in leaves:
            t[name].stop_gradient = False
        outs, loss = model(t)
        grads = paddle.static.gradients([loss], [t[name] for name in leaves])
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    return exe.run(main, feed=data, fetch_list=[*outs, *grads])


def test_static_program_runs_the_plugin_ops_and_equals_dynamic(enabled):
    data = _inputs()
    want_outs, want_grads = _dynamic(data)
    got = _run_static(_model, data, LEAVES)
    names = (*OUT_NAMES, *(f"d{name}" for name in LEAVES))
    for name, a, b in zip(names, got, want_outs + want_grads):
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert not got[3][5:8].any() and not got[3][15:].any() and got[3][8:15].all()  # padding rows: zeros


def test_to_static_function_equals_dynamic(enabled):
    data = _inputs()
    want_outs, want_grads = _dynamic(data)

    @paddle.jit.to_static(full_graph=True)
    def run(t):
        return _model(t)

    t = {name: paddle.to_tensor(value) for name, value in data.items()}
    for name in LEAVES:
        t[name].stop_gradient = False
    outs, loss = run(t)
    loss.backward()
    for name, a, b in zip(OUT_NAMES, outs, want_outs):
        np.testing.assert_array_equal(a.numpy(), b, err_msg=name)
    for name, want in zip(LEAVES, want_grads):
        np.testing.assert_array_equal(t[name].grad.numpy(), want, err_msg=f"d{name}")


def _static_float64_attention(q):
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", list(q.shape), "float64")
        out, _ = _fa().flash_attention(x, x, x)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    return exe.run(main, feed={"x": q}, fetch_list=[out])[0]


def test_static_float64_flash_attention_keeps_paddles_math_path(enabled):
    """The plugin's kernel takes no float64; Paddle's CPU math path does, in static programs
    too: enabled, the program gives stock Paddle's bits."""
    q = np.random.default_rng(3).standard_normal((1, 6, 2, 8))
    paddle.enable_static()
    got = _static_float64_attention(q)
    paddle_ext.disable()
    stock = _static_float64_attention(q)
    np.testing.assert_array_equal(got, stock)
    s = np.einsum("bihd,bjhd->bhij", q, q) / np.sqrt(8)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("bhij,bjhd->bihd", p / p.sum(-1, keepdims=True), q)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def _frozen_model(t):
    fa = _fa()
    outs = [fa.flash_attention(t["q"], t["k"], t["v"], causal=True)[0],
            fa.flash_attn_unpadded(t["uq"], t["uk"], t["uv"], t["cu"], t["cu"], 11, 11, 0.2, causal=True)[0]]
    if _has_flashmask():
        outs.append(fa.flashmask_attention(t["q"], t["k"], t["v"], t["startend"], causal=True))
    return outs, sum((o * o).mean() for o in outs)


@pytest.mark.parametrize("frozen", ["q", "k", "v"])
def test_static_backward_with_one_of_qkv_frozen(enabled, frozen):
    """One of q / k / v with stop_gradient=True (a frozen projection, an input fed as
    data): the static program's gradients of the others equal the dynamic ones (2.6.2's
    custom-op shape inference failed on the grad op's missing output)."""
    data = _inputs()
    data["uv"] = data["uk"] * 0.5
    names = [n for n in ("q", "k", "v") if n != frozen]
    leaves = names + ["u" + n for n in names]
    t = {name: paddle.to_tensor(value) for name, value in data.items()}
    for name in leaves:
        t[name].stop_gradient = False
    want_outs, loss = _frozen_model(t)
    want = paddle.grad([loss], [t[name] for name in leaves])
    got = _run_static(_frozen_model, data, leaves)
    for name, a, b in zip([f"out{i}" for i in range(len(want_outs))] + [f"d{n}" for n in leaves], got,
                          [o.numpy() for o in want_outs] + [g.numpy() for g in want]):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_static_program_gets_the_plugins_error_where_paddle_has_no_cpu_kernel(enabled):
    """flash_attn_unpadded has no CPU kernel in Paddle: a call the plugin refuses stays
    refused while the program is built (not handed to an op that cannot run)."""
    paddle.enable_static()
    with paddle.static.program_guard(paddle.static.Program(), paddle.static.Program()):
        x = paddle.static.data("x", [6, 2, 32], "float32")
        cu = paddle.static.data("cu", [2], "int32")
        with pytest.raises(ValueError, match=r"max_seqlen_q must be >= 0, got -1"):
            _fa().flash_attn_unpadded(x, x, x, cu, cu, -1, 6, 0.1)
