"""Paddle 3.3.1's own flash-attention call forms on CPU with the plugin enabled
(paddle.nn.functional.flash_attention.flash_attention / flash_attn_unpadded,
as Paddle's test_flash_attention.py calls them) against numpy float64
references: causal with seqlen_q > and < seqlen_k aligned top-left as Paddle's
GPU kernel and CPU math path align it, padded and varlen (GQA), and every
head_dim Paddle's CPU path takes, not only multiples of 8; forward and the
grads of q, k, v within 1e-5 relative.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_ext
from paddle_ext import compat
from tests.test_flash_attention import check, reference, rng

pytestmark = pytest.mark.skipif(compat.paddle_version() < (3, 0, 0), reason="Paddle 3.x call forms")


@pytest.fixture(scope="module")
def paddle_fa():
    import paddle.nn.functional.flash_attention as module

    paddle_ext.enable()
    try:
        yield module
    finally:
        paddle_ext.disable()


def leaf(a):
    t = paddle.to_tensor(np.asarray(a, np.float32))
    t.stop_gradient = False
    return t


def grad_floor(dout):
    return 0.1 * np.linalg.norm(dout)  # as tests/test_flash_attention.py: grads of rows that see few keys


@pytest.mark.parametrize("sq,sk", [(96, 40), (40, 96), (1, 33), (33, 1)])
def test_padded_causal_is_top_left(paddle_fa, sq, sk):
    g = rng(100 + sq + 3 * sk)
    b, hq, hk, d = 2, 4, 2, 32
    q, dout = g.standard_normal((b, sq, hq, d)), g.standard_normal((b, sq, hq, d))
    k, v = g.standard_normal((b, sk, hk, d)), g.standard_normal((b, sk, hk, d))
    qt, kt, vt = leaf(q), leaf(k), leaf(v)
    out, softmax = paddle_fa.flash_attention(qt, kt, vt, dropout=0.0, causal=True, return_softmax=False)
    assert softmax is None
    dq, dk, dv = paddle.grad([out], [qt, kt, vt], [paddle.to_tensor(dout.astype(np.float32))])
    refs = [reference(q[i], k[i], v[i], dout[i], d ** -0.5, True) for i in range(b)]
    ref = [np.stack([r[j] for r in refs]) for j in range(5)]
    check("out", out.numpy(), ref[0])
    for name, got, r in (("dq", dq, ref[2]), ("dk", dk, ref[3]), ("dv", dv, ref[4])):
        check(name, got.numpy(), r, floor=grad_floor(dout))


def test_varlen_causal_is_top_left(paddle_fa):
    # Paddle's GQA varlen test's shape family: sequences with more and with fewer queries than keys
    g = rng(200)
    lq, lk, hq, hk, d = [37, 5, 64, 1], [20, 9, 100, 4], 8, 2, 64
    cq, ck = np.concatenate([[0], np.cumsum(lq)]), np.concatenate([[0], np.cumsum(lk)])
    q, dout = g.standard_normal((cq[-1], hq, d)), g.standard_normal((cq[-1], hq, d))
    k, v = g.standard_normal((ck[-1], hk, d)), g.standard_normal((ck[-1], hk, d))
    qt, kt, vt = leaf(q), leaf(k), leaf(v)
    cu_q, cu_k = (paddle.to_tensor(c.astype(np.int32)) for c in (cq, ck))
    scale = d ** -0.5
    out, _ = paddle_fa.flash_attn_unpadded(qt, kt, vt, cu_q, cu_k, max(lq), max(lk), scale, dropout=0.0,
                                           causal=True, return_softmax=False)
    dq, dk, dv = paddle.grad([out], [qt, kt, vt], [paddle.to_tensor(dout.astype(np.float32))])
    ref = [np.zeros_like(q), None, np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)]
    for i in range(len(lq)):
        sq, sk = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        r = reference(q[sq], k[sk], v[sk], dout[sq], scale, True)
        ref[0][sq], ref[2][sq], ref[3][sk], ref[4][sk] = r[0], r[2], r[3], r[4]
    check("out", out.numpy(), ref[0])
    for name, got, r in (("dq", dq, ref[2]), ("dk", dk, ref[3]), ("dv", dv, ref[4])):
        check(name, got.numpy(), r, floor=grad_floor(dout))


@pytest.mark.parametrize("d", [1, 7, 59, 111, 200, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_every_head_dim(paddle_fa, d, causal):
    g = rng(300 + d + causal)
    b, sq, sk, h = 1, 70, 45, 2
    q, dout = g.standard_normal((b, sq, h, d)), g.standard_normal((b, sq, h, d))
    k, v = g.standard_normal((b, sk, h, d)), g.standard_normal((b, sk, h, d))
    qt, kt, vt = leaf(q), leaf(k), leaf(v)
    out, _ = paddle_fa.flash_attention(qt, kt, vt, causal=causal)
    dq, dk, dv = paddle.grad([out], [qt, kt, vt], [paddle.to_tensor(dout.astype(np.float32))])
    r = reference(q[0], k[0], v[0], dout[0], d ** -0.5, causal)
    check("out", out.numpy()[0], r[0])
    # d = 1: a score is one product, so dq / dk are sums of nearly cancelling terms; a
    # floor at the size of those terms (as for a single key in tests/test_flash_attention.py)
    floor = grad_floor(dout) * (np.sqrt(sk) if d == 1 else 1.0)
    for name, got, ref in (("dq", dq, r[2]), ("dk", dk, r[3]), ("dv", dv, r[4])):
        check(name, got.numpy()[0], ref, floor=floor)


def stock_or_error(fn, *args, **kwargs):
    """(Paddle's own answer, None), or (None, the exception it raised): Paddle 3.0's CPU math
    path has no causal mask (softmax_mask_fuse_upper_triangle is GPU-only there), 3.3's has."""
    try:
        return fn(*args, **kwargs), None
    except Exception as err:  # noqa: BLE001 - whatever stock raises, the plugin must match its class
        return None, err


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [7, 59])
def test_head_dim_matches_paddles_own_cpu_path(paddle_fa, d, causal):
    stock_fn = paddle_fa.flash_attention.__wrapped__  # Paddle's own function (its CPU math path)
    g = rng(400 + d)
    q, k, v = (paddle.to_tensor(g.standard_normal((2, 30, 2, d)).astype(np.float32)) for _ in range(3))
    stock, err = stock_or_error(stock_fn, q, k, v, causal=causal)
    if err is not None:
        pytest.skip(f"Paddle {compat.version_string()}'s own CPU path has no answer to compare with: {err}")
    ours, _ = paddle_fa.flash_attention(q, k, v, causal=causal)
    np.testing.assert_allclose(ours.numpy(), stock[0].numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_odd_head_dim_in_half_precision(paddle_fa, dtype):
    g = rng(500)
    q, k, v = (paddle.to_tensor(g.standard_normal((1, 40, 2, 59)).astype(np.float32)).astype(dtype)
               for _ in range(3))
    for t in (q, k, v):
        t.stop_gradient = False
    out, _ = paddle_fa.flash_attention(q, k, v, causal=True)
    assert out.dtype == getattr(paddle, dtype) and out.shape == [1, 40, 2, 59]
    dq, = paddle.grad([out.astype("float32").sum()], [q])
    r = reference(*(t.astype("float32").numpy()[0] for t in (q, k, v, q)), 59 ** -0.5, True)
    tol = 2e-3 if dtype == "float16" else 1.5e-2
    check("out", out.astype("float32").numpy()[0], r[0], tol)
    assert dq.dtype == getattr(paddle, dtype) and np.isfinite(dq.astype("float32").numpy()).all()


# ------------------------------------------- what the plugin refuses, Paddle answers

@pytest.mark.parametrize("causal", [False, True])
def test_float64_is_paddles_math_path_forward_and_grads(paddle_fa, causal):
    """float64 (stock's CPU math path takes it, the plugin's kernel does not) gets Paddle's
    own function: its bits, and a float64 reference's values, forward and q/k/v grads; where
    stock refuses (3.0's causal mask), the plugin raises an error of stock's class."""
    g = rng(600)
    b, sq, h, d = 2, 12, 2, 16
    q, k, v, dout = (g.standard_normal((b, sq, h, d)) for _ in range(4))

    def run(fn):
        qt, kt, vt = (paddle.to_tensor(a) for a in (q, k, v))
        for t in (qt, kt, vt):
            t.stop_gradient = False
        out, _ = fn(qt, kt, vt, causal=causal)
        grads = paddle.grad([out], [qt, kt, vt], [paddle.to_tensor(dout)])
        return [out.numpy(), *(t.numpy() for t in grads)]

    stock, err = stock_or_error(run, paddle_fa.flash_attention.__wrapped__)
    if err is not None:
        with pytest.raises(type(err)):
            run(paddle_fa.flash_attention)
        return
    ours = run(paddle_fa.flash_attention)
    assert ours[0].dtype == np.float64
    for name, a, s in zip(("out", "dq", "dk", "dv"), ours, stock):
        np.testing.assert_array_equal(a, s, err_msg=name)
    refs = [reference(q[i], k[i], v[i], dout[i], d ** -0.5, causal) for i in range(b)]
    for name, got, j in (("out", ours[0], 0), ("dq", ours[1], 2), ("dk", ours[2], 3), ("dv", ours[3], 4)):
        np.testing.assert_allclose(got, np.stack([r[j] for r in refs]), rtol=1e-10, atol=1e-12, err_msg=name)


def _t(shape, dtype="float32", salt=0):
    return paddle.to_tensor(rng(700 + salt).standard_normal(shape)).astype(dtype)


Q = (2, 8, 2, 16)
F64 = dict(dtype="float64")
# Calls through Paddle's names that stock Paddle 3.3.1 answers on CPU (its math path)
# and the plugin's checks refuse: (name, args, kwargs). The plugin must give stock's answer,
# or, where a release's stock refuses (3.0: causal, head_dim 0), an error of stock's class.
STOCK_ANSWERS = {
    "float64": ("flash_attention", lambda: (_t(Q, **F64), _t(Q, **F64, salt=1), _t(Q, **F64, salt=2)), {}),
    "float64 causal return_softmax": ("flash_attention", lambda: (_t(Q, **F64), _t(Q, **F64, salt=1),
                                                                  _t(Q, **F64, salt=2)),
                                      dict(causal=True, return_softmax=True)),
    "float64 dropout": ("flash_attention", lambda: (_t(Q, **F64),) * 3, dict(dropout=0.3)),
    "float64 dropout training=False": ("flash_attention", lambda: (_t(Q, **F64),) * 3,
                                       dict(dropout=0.3, training=False)),
    "float64 fixed_seed_offset rng_name": (
        "flash_attention", lambda: (_t(Q, **F64),) * 3,
        dict(fixed_seed_offset=paddle.to_tensor([1, 2], dtype="int64"), rng_name="")),
    "int32": ("flash_attention", lambda: (_t(Q, "int32"),) * 3, {}),
    "rng_name not registered": ("flash_attention", lambda: (_t(Q),) * 3, dict(rng_name="no_such_generator")),
    "fixed_seed_offset int32": ("flash_attention", lambda: (_t(Q),) * 3,
                                dict(fixed_seed_offset=paddle.to_tensor([1, 2], dtype="int32"))),
    "dropout=1.0": ("flash_attention", lambda: (_t(Q),) * 3, dict(dropout=1.0)),
    "causal=1": ("flash_attention", lambda: (_t(Q), _t(Q, salt=1), _t(Q, salt=2)), dict(causal=1)),
    "training=0": ("flash_attention", lambda: (_t(Q),) * 3, dict(training=0)),
    "value head_dim 8": ("flash_attention", lambda: (_t(Q), _t(Q, salt=1), _t((2, 8, 2, 8), salt=2)), {}),
    "head_dim 0": ("flash_attention", lambda: (_t((2, 8, 2, 0)),) * 3, {}),
    "key batch 1 broadcast": ("flash_attention", lambda: (_t(Q), _t((1, 8, 2, 16), salt=1),
                                                          _t((1, 8, 2, 16), salt=2)), {}),
    "packed float64": ("flash_attn_qkvpacked", lambda: (_t((2, 8, 3, 2, 16), **F64),), dict(causal=True)),
    "packed rng_name not registered": ("flash_attn_qkvpacked", lambda: (_t((2, 8, 3, 2, 16)),),
                                       dict(rng_name="no_such_generator")),
    "packed dropout=1.0": ("flash_attn_qkvpacked", lambda: (_t((2, 8, 3, 2, 16)),), dict(dropout=1.0)),
}


@pytest.mark.parametrize("case", sorted(STOCK_ANSWERS))
def test_plugin_gives_stocks_answer_where_its_kernel_refuses(paddle_fa, case):
    name, make, kwargs = STOCK_ANSWERS[case]
    fn = getattr(paddle_fa, name)
    args = make()
    paddle.seed(11)
    stock, err = stock_or_error(fn.__wrapped__, *args, **kwargs)  # Paddle's own function
    paddle.seed(11)
    if err is not None:  # this release's stock refuses it too (3.0: no causal mask on CPU)
        with pytest.raises(type(err)):
            fn(*args, **kwargs)
        return
    ours = fn(*args, **kwargs)
    assert len(ours) == len(stock) == 2
    for got, want in zip(ours, stock):
        assert (got is None) == (want is None)
        if want is not None:
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_plugin_error_stands_where_paddle_refuses_too(paddle_fa):
    # float64 key for a float32 query: stock's math path refuses it as well
    q, kv = _t(Q), _t(Q, "float64")
    with pytest.raises(TypeError, match=r"key must have query's dtype float32, got float64"):
        paddle_fa.flash_attention(q, kv, kv)


def test_error_where_both_refuse_is_also_paddles_error_class(paddle_fa):
    # float64 with 4 query heads on 2 kv heads: the plugin's kernel takes no float64
    # (UnsupportedDtypeError, a TypeError), and Paddle's math path refuses the head
    # mismatch with a ValueError; code written against stock Paddle catches ValueError.
    from paddle_ext.ops._checks import UnsupportedDtypeError

    q, kv = _t((1, 8, 4, 16), **F64), _t((1, 8, 2, 16), **F64, salt=1)
    with pytest.raises(ValueError) as stock:
        paddle_fa.flash_attention.__wrapped__(q, kv, kv)
    with pytest.raises(ValueError) as ours:
        paddle_fa.flash_attention(q, kv, kv)
    assert isinstance(ours.value, UnsupportedDtypeError)
    message = str(ours.value)
    assert "query must have dtype in" in message and "got float64" in message
    assert f"Paddle's own function refuses the call too: ValueError: {str(stock.value).splitlines()[0]}" in message
