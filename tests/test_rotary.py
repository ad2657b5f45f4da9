"""paddle_ext.ops.fused_rotary_position_embedding against a numpy float64
reference written from Paddle's GPU kernel (fused_rope), its gradients, its
argument errors, and the fused_rotary patch unit."""

import itertools
import os

import numpy as np
import paddle
import pytest

import paddle_ext
import paddle_ext.ops as ops
from paddle_ext.ops import fused_rotary_position_embedding as rope

ISA_ENV = "PADDLE_EXT_ROTARY_ISA"


# ----------------------------------------------------------------- reference

def rotate_half_or_pairs(x, neox):
    """rot(x) of Paddle's kernel: for use_neox_rotary_style, rot[even d] =
    -x[d + 1] and rot[odd d] = x[d - 1]; otherwise rot[d < D/2] = -x[d + D/2]
    and rot[d >= D/2] = x[d - D/2]."""
    d = x.shape[-1]
    rot = np.empty_like(x)
    if neox:
        rot[..., 0::2] = -x[..., 1::2]
        rot[..., 1::2] = x[..., 0::2]
    else:
        rot[..., : d // 2] = -x[..., d // 2:]
        rot[..., d // 2:] = x[..., : d // 2]
    return rot


def rotate_reference(x, sin_t, cos_t, positions, neox):
    """x [B, S, H, D]; sin_t/cos_t [rows, D]; positions [B, S] -> float64
    out = x * cos[p] + rot(x) * sin[p], as Paddle's fused_rope kernel."""
    x = np.asarray(x, np.float64)
    s = np.asarray(sin_t, np.float64)[positions][:, :, None, :]
    c = np.asarray(cos_t, np.float64)[positions][:, :, None, :]
    return x * c + rotate_half_or_pairs(x, neox) * s


def rotate_grad_reference(g, sin_t, cos_t, positions, neox):
    """The vector-Jacobian product: out = c*x + s*R(x) and R^T = -R give
    grad = c*g - R(s*g)."""
    g = np.asarray(g, np.float64)
    s = np.asarray(sin_t, np.float64)[positions][:, :, None, :]
    c = np.asarray(cos_t, np.float64)[positions][:, :, None, :]
    return c * g - rotate_half_or_pairs(s * g, neox)


def computed_tables(rows, d, base):
    """Paddle's tables without sin/cos: angle p * base^(-(2 * (i // 2)) / d)."""
    inv_freq = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    angles = np.arange(rows, dtype=np.float64)[:, None] * np.repeat(inv_freq, 2)[None, :]
    return np.sin(angles), np.cos(angles)


def to_bshd(x, time_major):
    return np.swapaxes(x, 0, 1) if time_major else x


def max_relative_error(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30))) if want.size else 0.0


def make_case(rng, batch, seq, heads, d, time_major, dtype="float32", rows=None, with_ids=False):
    shapes = [(seq, batch, h, d) if time_major else (batch, seq, h, d) for h in heads]
    xs = [rng.standard_normal(s).astype(dtype) for s in shapes]
    rows = rows or seq
    angles = rng.uniform(-np.pi, np.pi, (rows, d))
    sin_t, cos_t = np.sin(angles).astype(dtype), np.cos(angles).astype(dtype)
    ids = rng.integers(0, rows, (batch, seq)).astype("int64") if with_ids else None
    return xs, sin_t, cos_t, ids


def run_op(xs, sin_t, cos_t, ids, neox, time_major, grads, dtype=None, table_shape4=False, **kw):
    """Forward, then backward with the given output grads; numpy results."""
    tensors = []
    for x in xs:
        t = paddle.to_tensor(x)
        if dtype is not None:
            t = t.astype(dtype)
        t.stop_gradient = False
        tensors.append(t)
    tabs = []
    for tab in (sin_t, cos_t):
        if tab is None:
            tabs.append(None)
            continue
        t = paddle.to_tensor(tab.reshape(1, tab.shape[0], 1, tab.shape[1]) if table_shape4 else tab)
        tabs.append(t.astype(dtype) if dtype is not None else t)
    args = dict(sin=tabs[0], cos=tabs[1], use_neox_rotary_style=neox, time_major=time_major, **kw)
    if ids is not None:
        args["position_ids"] = paddle.to_tensor(ids)
    names = ["q", "k", "v"][: len(tensors)]
    outs = rope(**dict(zip(names, tensors)), **args)
    outs = [o for o in outs if o is not None]
    assert len(outs) == len(tensors)
    gs = [paddle.to_tensor(g) if dtype is None else paddle.to_tensor(g).astype(dtype) for g in grads]
    paddle.autograd.backward(outs, gs)
    as_np = [o.astype("float32").numpy() if dtype in ("float16", "bfloat16") else o.numpy() for o in outs]
    grads_np = [t.grad.astype("float32").numpy() if dtype in ("float16", "bfloat16") else t.grad.numpy()
                for t in tensors]
    return as_np, grads_np


# ------------------------------------------------------ float32 vs reference

CASES = list(itertools.product(
    [True, False],          # use_neox_rotary_style
    [False, True],          # position_ids
    [False, True],          # time_major
    [(3,), (5, 1), (4, 2, 2)],  # heads of q, k, v: odd counts, GQA, v rotated too
))


@pytest.mark.parametrize("neox, with_ids, time_major, heads", CASES)
def test_float32_forward_and_backward_match_float64_reference(neox, with_ids, time_major, heads):
    rng = np.random.default_rng(hash((neox, with_ids, time_major, heads)) % 2**32)
    batch, seq, d = 2, 7, 12  # odd sequence length, head_dim not a power of two
    xs, sin_t, cos_t, ids = make_case(rng, batch, seq, heads, d, time_major, rows=11 if with_ids else None,
                                      with_ids=with_ids)
    grads = [rng.standard_normal(x.shape).astype("float32") for x in xs]
    outs, x_grads = run_op(xs, sin_t, cos_t, ids, neox, time_major, grads)
    positions = ids if with_ids else np.broadcast_to(np.arange(seq), (batch, seq))
    for x, out, g, x_grad in zip(xs, outs, grads, x_grads):
        assert out.dtype == np.float32 and out.shape == x.shape
        want = to_bshd(rotate_reference(to_bshd(x, time_major), sin_t, cos_t, positions, neox), time_major)
        assert max_relative_error(out, want) <= 1e-6
        want_grad = to_bshd(rotate_grad_reference(to_bshd(g, time_major), sin_t, cos_t, positions, neox),
                            time_major)
        assert max_relative_error(x_grad, want_grad) <= 1e-6


def test_large_threaded_float32_is_correctly_rounded_and_thread_independent():
    # Big enough for several threads and for the vectorised loops' main bodies.
    rng = np.random.default_rng(5)
    xs, sin_t, cos_t, ids = make_case(rng, 2, 129, (8, 3), 64, False, rows=300, with_ids=True)
    grads = [rng.standard_normal(x.shape).astype("float32") for x in xs]
    results = []
    for threads in (1, 2):
        ops.set_num_threads(threads)
        results.append(run_op(xs, sin_t, cos_t, ids, False, False, grads))
    for a, b in zip(results[0][0] + results[0][1], results[1][0] + results[1][1]):
        np.testing.assert_array_equal(a, b)
    for x, out in zip(xs, results[0][0]):
        want = rotate_reference(x, sin_t, cos_t, ids, False)
        # float64 arithmetic, one rounding: within half an ulp of float32.
        assert max_relative_error(out, want) <= 2.0**-24


@pytest.mark.parametrize("isa", ["default", "avx2", "avx512"])
def test_every_instruction_set_path_gives_the_same_bits(isa, monkeypatch):
    rng = np.random.default_rng(9)
    xs, sin_t, cos_t, ids = make_case(rng, 1, 33, (4, 2), 32, True, rows=40, with_ids=True)
    grads = [rng.standard_normal(x.shape).astype("float32") for x in xs]
    monkeypatch.setenv(ISA_ENV, "default")
    base = run_op(xs, sin_t, cos_t, ids, True, True, grads)
    monkeypatch.setenv(ISA_ENV, isa)  # an ISA the CPU lacks falls back to the best one it has
    other = run_op(xs, sin_t, cos_t, ids, True, True, grads)
    for a, b in zip(base[0] + base[1], other[0] + other[1]):
        np.testing.assert_array_equal(a, b)


def test_sin_cos_given_as_1_s_1_d():
    rng = np.random.default_rng(2)
    xs, sin_t, cos_t, _ = make_case(rng, 2, 5, (3,), 8, False)
    g = [rng.standard_normal(xs[0].shape).astype("float32")]
    flat = run_op(xs, sin_t, cos_t, None, False, False, g)
    four = run_op(xs, sin_t, cos_t, None, False, False, g, table_shape4=True)
    for a, b in zip(flat[0] + flat[1], four[0] + four[1]):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------ computed tables

@pytest.mark.parametrize("time_major", [False, True])
@pytest.mark.parametrize("base", [10000.0, 500000.0, 7])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_without_sin_cos_angles_come_from_rotary_emb_base(time_major, base, dtype):
    rng = np.random.default_rng(int(base) % 1000)
    batch, seq, d = 3, 37, 16
    xs, _, _, _ = make_case(rng, batch, seq, (2, 1), d, time_major, dtype=dtype)
    grads = [rng.standard_normal(x.shape).astype(dtype) for x in xs]
    outs, x_grads = run_op(xs, None, None, None, True, time_major, grads, rotary_emb_base=base)
    sin_t, cos_t = computed_tables(seq, d, float(base))
    positions = np.broadcast_to(np.arange(seq), (batch, seq))
    for x, out, g, x_grad in zip(xs, outs, grads, x_grads):
        want = to_bshd(rotate_reference(to_bshd(x, time_major), sin_t, cos_t, positions, True), time_major)
        want_grad = to_bshd(rotate_grad_reference(to_bshd(g, time_major), sin_t, cos_t, positions, True),
                            time_major)
        if dtype == "float32":  # one rounding of a float64 result: elementwise
            assert max_relative_error(out, want) <= 1e-6
            assert max_relative_error(x_grad, want_grad) <= 1e-6
        else:  # float64 arithmetic itself: relative to the terms' size
            np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-14 * np.abs(want).max())
            np.testing.assert_allclose(x_grad, want_grad, rtol=1e-12, atol=1e-14 * np.abs(want_grad).max())


@pytest.mark.parametrize("given", ["sin", "cos"])
def test_a_lone_sin_or_cos_is_ignored_as_paddles_kernel_ignores_it(given):
    """Paddle's wrapper passes a lone table on; its kernels read the tables only when
    both are given (flag_sin_cos), so the angles come from rotary_emb_base."""
    rng = np.random.default_rng(31)
    q, k = (paddle.to_tensor(rng.standard_normal((2, 5, h, 8)).astype("float32")) for h in (3, 1))
    table = paddle.to_tensor(rng.standard_normal((5, 8)).astype("float32"))
    lone = rope(q, k, **{given: table}, rotary_emb_base=500.0)
    computed = rope(q, k, rotary_emb_base=500.0)
    for got, want in zip(lone[:2], computed[:2]):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    sin_t, cos_t = computed_tables(5, 8, 500.0)
    want = rotate_reference(q.numpy(), sin_t, cos_t, np.broadcast_to(np.arange(5), (2, 5)), True)
    assert max_relative_error(lone[0].numpy(), want) <= 1e-6


@pytest.mark.parametrize("base", [0.0, -3.0, float("nan")])
def test_rotary_emb_base_is_unused_with_tables(base):
    q, sin, cos = _t(Q) + 1.0, _t((5, 8)) + 0.5, _t((5, 8)) + 0.25
    got = rope(q, sin=sin, cos=cos, rotary_emb_base=base)[0]
    np.testing.assert_array_equal(got.numpy(), rope(q, sin=sin, cos=cos)[0].numpy())


def test_default_base_is_10000():
    rng = np.random.default_rng(4)
    q = paddle.to_tensor(rng.standard_normal((1, 6, 2, 8)).astype("float32"))
    a, _, _ = rope(q)
    b, _, _ = rope(q, rotary_emb_base=10000)
    np.testing.assert_array_equal(a.numpy(), b.numpy())


# ------------------------------------------------------- other dtypes, grads

@pytest.mark.parametrize("dtype, ulp", [("float16", 2.0**-10), ("bfloat16", 2.0**-7)])
@pytest.mark.parametrize("neox", [True, False])
def test_half_precision_computes_in_float32(dtype, ulp, neox):
    rng = np.random.default_rng(6)
    xs, sin_t, cos_t, ids = make_case(rng, 2, 9, (3, 1), 16, False, rows=12, with_ids=True)
    grads = [rng.standard_normal(x.shape).astype("float32") for x in xs]
    # The reference starts from the values the op sees: rounded to the dtype.
    rounded = lambda a: paddle.to_tensor(a).astype(dtype).astype("float32").numpy()  # noqa: E731
    outs, x_grads = run_op(xs, sin_t, cos_t, ids, neox, False, grads, dtype=dtype)
    s16, c16 = rounded(sin_t), rounded(cos_t)
    for x, out, g, x_grad in zip(xs, outs, grads, x_grads):
        want = rotate_reference(rounded(x), s16, c16, ids, neox)
        np.testing.assert_allclose(out, want, rtol=ulp, atol=ulp * 1e-2)
        want_grad = rotate_grad_reference(rounded(g), s16, c16, ids, neox)
        np.testing.assert_allclose(x_grad, want_grad, rtol=ulp, atol=ulp * 1e-2)


@pytest.mark.parametrize("dtype, exponent_bits", [("float16", 5), ("bfloat16", 8)])
def test_identity_rotation_keeps_every_finite_half_value(dtype, exponent_bits):
    # cos = 1, sin = 0: out == x for every finite value, subnormals and the
    # largest included (the CPU kernel's own float16 conversions at work).
    mantissa_bits = 15 - exponent_bits
    finite = np.array([b for b in range(1 << 16) if ((b >> mantissa_bits) & ((1 << exponent_bits) - 1))
                       != (1 << exponent_bits) - 1], np.uint16)
    heads = 2 if dtype == "bfloat16" else 8
    seq = finite.size // (heads * 128)
    bits = finite[: seq * heads * 128].reshape(1, seq, heads, 128)
    if dtype == "float16":
        values = bits.view(np.float16).astype(np.float32)
    else:
        values = (bits.astype(np.uint32) << 16).view(np.float32)
    x = paddle.to_tensor(values).astype(dtype)
    ones = paddle.ones([seq, 128], dtype=dtype)
    zeros = paddle.zeros([seq, 128], dtype=dtype)
    for neox in (True, False):
        out = rope(x, sin=zeros, cos=ones, use_neox_rotary_style=neox)[0]
        np.testing.assert_array_equal(out.astype("float32").numpy(), values)  # -0.0 may come back as 0.0


@pytest.mark.parametrize("neox, with_tables", [(True, True), (False, True), (True, False)])
def test_numerical_gradient_check(neox, with_tables):
    rng = np.random.default_rng(11)
    batch, seq, d = 2, 3, 4
    xs = [rng.standard_normal((batch, seq, h, d)) for h in (3, 1, 2)]
    weights = [rng.standard_normal(x.shape) for x in xs]
    angles = rng.uniform(-3, 3, (4, d))
    sin_t = paddle.to_tensor(np.sin(angles)) if with_tables else None
    cos_t = paddle.to_tensor(np.cos(angles)) if with_tables else None
    ids = paddle.to_tensor(rng.integers(0, 4, (batch, seq))) if with_tables else None

    def loss(arrays):
        ts = [paddle.to_tensor(a, stop_gradient=False) for a in arrays]
        outs = rope(*ts, sin=sin_t, cos=cos_t, position_ids=ids, use_neox_rotary_style=neox)
        total = sum((o * paddle.to_tensor(w)).sum() for o, w in zip(outs, weights))
        return total, ts

    total, ts = loss(xs)
    total.backward()
    analytic = [t.grad.numpy() for t in ts]
    eps = 1e-6
    for which, x in enumerate(xs):
        numeric = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            plus = [a.copy() for a in xs]
            minus = [a.copy() for a in xs]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            numeric[idx] = (float(loss(plus)[0]) - float(loss(minus)[0])) / (2 * eps)
        np.testing.assert_allclose(analytic[which], numeric, rtol=1e-6, atol=1e-8)


def test_only_the_inputs_that_need_grads_get_them():
    rng = np.random.default_rng(3)
    q = paddle.to_tensor(rng.standard_normal((1, 4, 2, 8)).astype("float32"), stop_gradient=False)
    k = paddle.to_tensor(rng.standard_normal((1, 4, 1, 8)).astype("float32"), stop_gradient=False)
    v = paddle.to_tensor(rng.standard_normal((1, 4, 1, 8)).astype("float32"))  # no grad wanted
    out_q, out_k, out_v = rope(q, k, v)
    out_q.sum().backward()  # out_k is not in the loss: k gets no grad (each tensor has its own node)
    assert v.grad is None and k.grad is None
    assert float(paddle.abs(q.grad).sum()) > 0
    (out_k * 2).sum().backward()
    assert k.grad is not None and v.grad is None


def test_v_without_k_and_argument_order():
    rng = np.random.default_rng(8)
    q = paddle.to_tensor(rng.standard_normal((2, 3, 2, 6)).astype("float32"))
    v = paddle.to_tensor(rng.standard_normal((2, 3, 1, 6)).astype("float32"))
    out_q, out_k, out_v = rope(q, None, v)
    assert out_k is None
    alone, _, _ = rope(v)
    np.testing.assert_array_equal(out_v.numpy(), alone.numpy())
    np.testing.assert_array_equal(out_q.numpy(), rope(q)[0].numpy())


def test_non_contiguous_inputs_are_read_by_value():
    rng = np.random.default_rng(12)
    base = paddle.to_tensor(rng.standard_normal((3, 2, 4, 8)).astype("float32"))
    view = base.transpose([1, 0, 2, 3])  # [2, 3, 4, 8], a strided view on 3.x
    dense = paddle.to_tensor(view.numpy())
    np.testing.assert_array_equal(rope(view)[0].numpy(), rope(dense)[0].numpy())


def test_empty_sequence_gives_empty_outputs():
    q = paddle.zeros([2, 0, 3, 8], dtype="float32")
    out_q, out_k, _ = rope(q, paddle.zeros([2, 0, 1, 8], dtype="float32"))
    assert list(out_q.shape) == [2, 0, 3, 8] and list(out_k.shape) == [2, 0, 1, 8]


def test_int32_position_ids_are_accepted():
    rng = np.random.default_rng(13)
    xs, sin_t, cos_t, ids = make_case(rng, 2, 4, (2,), 8, False, rows=6, with_ids=True)
    q = paddle.to_tensor(xs[0])
    args = dict(sin=paddle.to_tensor(sin_t), cos=paddle.to_tensor(cos_t))
    a = rope(q, position_ids=paddle.to_tensor(ids), **args)[0]
    b = rope(q, position_ids=paddle.to_tensor(ids.astype("int32")), **args)[0]
    np.testing.assert_array_equal(a.numpy(), b.numpy())


# ---------------------------------------------------------------- bad input

def _t(shape, dtype="float32"):
    return paddle.zeros(shape, dtype=dtype)


Q = (2, 5, 3, 8)


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(q=_t((2, 5, 3, 7))), ValueError, r"q: head_dim \(the last dimension\) must be even, got 7"),
        (dict(q=_t((2, 5, 8))), ValueError, r"q must be 4-D \[batch, seq_len, num_heads, head_dim\]"),
        (dict(q=_t(Q, "int64")), TypeError, r"q must have dtype in"),
        (dict(k=_t((2, 5, 1, 8), "float16")), TypeError, r"k must have q's dtype float32, got float16"),
        (dict(v=_t((2, 4, 3, 8))), ValueError, r"v must match q in batch >= q's, seq_len and head_dim"),
        (dict(k=_t((2, 5, 3, 6))), ValueError, r"k must match q in batch >= q's, seq_len and head_dim"),
        (dict(k=_t((1, 5, 3, 8))), ValueError,
         r"k must match q in batch >= q's, seq_len and head_dim .*q is \[2, 5, 3, 8\], k is \[1, 5, 3, 8\]"),
        (dict(sin=_t((5, 8)), position_ids=_t((2, 5), "int64")), AssertionError, r"position_ids needs sin and cos"),
        (dict(cos=_t((5, 8)), use_neox_rotary_style=False), AssertionError,
         r"use_neox_rotary_style=False \(rotate_half\) needs sin"),
        (dict(sin=_t((5, 4)), cos=_t((5, 4))), ValueError,
         r"sin must be \[seq_len, head_dim\] or \[1, seq_len, 1, head_dim\] with head_dim = 8"),
        (dict(sin=_t((2, 5, 1, 8)), cos=_t((2, 5, 1, 8))), ValueError, r"sin must be \[seq_len, head_dim\]"),
        (dict(sin=_t((5, 8)), cos=_t((1, 5, 1, 8))), ValueError, r"sin and cos must have the same shape"),
        (dict(sin=_t((6, 8)), cos=_t((6, 8))), ValueError,
         r"sin and cos must have seq_len = 5 rows without position_ids, got shape \[6, 8\]"),
        (dict(sin=_t((5, 8), "float64"), cos=_t((5, 8), "float64")), TypeError,
         r"sin must have q's dtype float32, got float64"),
        (dict(sin=_t((5, 8)), cos=_t((5, 8), "float16")), TypeError, r"cos must have q's dtype float32"),
        (dict(sin=_t((4, 8)), cos=_t((4, 8)), position_ids=_t((2, 5), "int64")), ValueError,
         r"sin and cos must have at least seq_len = 5 rows"),
        (dict(position_ids=_t((2, 5), "int64")), ValueError, r"position_ids needs sin and cos"),
        (dict(sin=_t((9, 8)), cos=_t((9, 8)), position_ids=_t((5, 2), "int64")), ValueError,
         r"position_ids must be \[batch, seq_len\] = \[2, 5\], got shape \[5, 2\]"),
        (dict(sin=_t((9, 8)), cos=_t((9, 8)), position_ids=_t((2, 5), "float32")), TypeError,
         r"position_ids must have dtype in"),
        (dict(use_neox_rotary_style=False), ValueError, r"use_neox_rotary_style=False \(rotate_half\) needs sin"),
        (dict(use_neox_rotary_style=1), TypeError, r"use_neox_rotary_style must be a bool, got int 1"),
        (dict(time_major="yes"), TypeError, r"time_major must be a bool"),
        (dict(rotary_emb_base=0.0), ValueError, r"rotary_emb_base must be a finite number > 0 when sin and cos "
                                                r"are not given \(it is unused with them\), got 0.0"),
        (dict(rotary_emb_base="1e4"), TypeError, r"rotary_emb_base must be a number"),
        (dict(q=np.zeros(Q, np.float32)), TypeError, r"q must be a paddle.Tensor, got ndarray"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, error, pattern):
    args = dict(q=_t(Q))
    args.update(kwargs)
    with pytest.raises(error, match=pattern):
        rope(**args)


@pytest.mark.parametrize("bad, where", [(9, "[1, 3]"), (-1, "[1, 3]")])
def test_position_ids_out_of_range_raise_index_error_naming_the_first(bad, where):
    ids = np.zeros((2, 5), np.int64)
    ids[1, 3] = bad
    ids[1, 4] = 100  # a later bad id: the error names the first
    with pytest.raises(IndexError) as info:
        rope(_t(Q), sin=_t((9, 8)), cos=_t((9, 8)), position_ids=paddle.to_tensor(ids))
    assert f"position_ids{where} = {bad} is out of range" in str(info.value)
    assert "[0, rows) = [0, 9)" in str(info.value)


def test_position_ids_are_checked_when_q_is_empty_but_k_is_not():
    ids = np.zeros((2, 5), np.int64)
    ids[0, 1] = 9
    with pytest.raises(IndexError, match=r"position_ids\[0, 1\] = 9"):
        rope(_t((2, 5, 0, 8)), _t((2, 5, 1, 8)), sin=_t((9, 8)), cos=_t((9, 8)),
             position_ids=paddle.to_tensor(ids))


def test_time_major_position_ids_index_batch_then_seq():
    ids = np.zeros((2, 5), np.int64)
    ids[0, 4] = 12
    with pytest.raises(IndexError, match=r"position_ids\[0, 4\] = 12"):
        rope(_t((5, 2, 3, 8)), sin=_t((9, 8)), cos=_t((9, 8)), position_ids=paddle.to_tensor(ids),
             time_major=True)


# ---------------------------------------------------------------- patch unit

@pytest.fixture
def clean_series(monkeypatch):
    monkeypatch.delenv("PADDLE_EXT_PATCHES", raising=False)
    paddle_ext.disable()
    yield
    paddle_ext.disable()


def _paddle_function_owners():
    import sys

    import paddle.incubate.nn.functional as functional

    return functional, sys.modules["paddle.incubate.nn.functional.fused_rotary_position_embedding"]


def test_patch_makes_paddles_function_work_on_cpu_with_the_3x_signature(clean_series):
    functional, module = _paddle_function_owners()
    originals = (functional.fused_rotary_position_embedding, module.fused_rotary_position_embedding)
    rng = np.random.default_rng(1)
    q = paddle.to_tensor(rng.standard_normal((4, 2, 3, 8)).astype("float32"))
    paddle_ext.enable()
    assert functional.fused_rotary_position_embedding is module.fused_rotary_position_embedding
    assert functional.fused_rotary_position_embedding is not originals[0]
    # time_major and rotary_emb_base exist on every Paddle release once enabled
    out_q, out_k, out_v = functional.fused_rotary_position_embedding(q, time_major=True, rotary_emb_base=500.0)
    assert out_k is None and out_v is None
    want = rope(q, time_major=True, rotary_emb_base=500.0)[0]
    np.testing.assert_array_equal(out_q.numpy(), want.numpy())
    paddle_ext.disable()
    assert functional.fused_rotary_position_embedding is originals[0]
    assert module.fused_rotary_position_embedding is originals[1]


def test_patch_can_be_switched_off(clean_series):
    functional, _ = _paddle_function_owners()
    original = functional.fused_rotary_position_embedding
    paddle_ext.enable({"paddle_ext": {"patches": {"fused_rotary": False}}})
    assert functional.fused_rotary_position_embedding is original
    statuses = {unit: status for unit, _, status, _ in paddle_ext.patch_table()}
    assert statuses["fused_rotary"] == "disabled by config"


def test_patched_function_keeps_paddles_argument_positions(clean_series):
    functional, _ = _paddle_function_owners()
    paddle_ext.enable()
    rng = np.random.default_rng(10)
    q = paddle.to_tensor(rng.standard_normal((1, 3, 2, 4)).astype("float32"))
    k = paddle.to_tensor(rng.standard_normal((1, 3, 1, 4)).astype("float32"))
    angles = rng.uniform(-3, 3, (3, 4)).astype("float32")
    sin, cos = paddle.to_tensor(np.sin(angles)), paddle.to_tensor(np.cos(angles))
    ids = paddle.to_tensor(np.array([[2, 0, 1]]))
    got = functional.fused_rotary_position_embedding(q, k, None, sin, cos, ids, False)
    want = rope(q, k, None, sin=sin, cos=cos, position_ids=ids, use_neox_rotary_style=False)
    for a, b in zip(got[:2], want[:2]):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert os.environ.get(ISA_ENV) is None


def test_a_function_imported_before_enable_reaches_the_plugin(clean_series):
    """PaddleFormers' ERNIE 4.5 models import the function at their own import time
    (`... import fused_rotary_position_embedding as fused_rope`); what they hold is
    Paddle's function, which calls paddle._C_ops' op: the unit patches that too."""
    functional, _ = _paddle_function_owners()
    early = functional.fused_rotary_position_embedding  # Paddle's own function
    rng = np.random.default_rng(11)
    xs, sin_t, cos_t, ids = make_case(rng, 2, 5, (3, 1), 8, False, with_ids=True)
    q, k = (paddle.to_tensor(x) for x in xs)
    sin, cos, pos = paddle.to_tensor(sin_t), paddle.to_tensor(cos_t), paddle.to_tensor(ids)
    with pytest.raises(RuntimeError, match="not registered"):  # stock CPU: no kernel
        early(q, k, None, sin, cos, pos, False)
    paddle_ext.enable()
    out_q, out_k, out_v = early(q, k, None, sin, cos, pos, False)
    assert out_v is None
    for got, x in ((out_q, xs[0]), (out_k, xs[1])):
        assert max_relative_error(got.numpy(), rotate_reference(x, sin_t, cos_t, ids, False)) < 1e-6
    # Paddle's own assertion still comes first (rotate-half without tables)
    with pytest.raises(AssertionError, match="rotate_half"):
        early(q, use_neox_rotary_style=False)
    paddle_ext.disable()
    with pytest.raises(RuntimeError, match="not registered"):
        early(q, k, None, sin, cos, pos, False)


def test_static_programs_on_gpu_builds_keep_paddles_op(clean_series, monkeypatch):
    """Which calls the plugin serves (the unit's plugin_serves): CPU tensors in dynamic
    mode and static programs on CPU builds; on a GPU build a static program keeps
    Paddle's op, whose GPU kernel answers (GPU tensors in dynamic mode likewise:
    tests/gpu/test_rotary_gpu.py checks Paddle's bits through the name there)."""
    from paddle_ext import devices
    from paddle_ext.ops.routes import rotary as routes

    q = paddle.to_tensor(np.ones((1, 3, 2, 4), "float32"))
    assert routes.plugin_serves(q)
    paddle.enable_static()
    try:
        assert routes.plugin_serves(None) == (devices.device_build() == "cpu")
        monkeypatch.setattr(devices, "device_build", lambda: "cuda")
        assert not routes.plugin_serves(None)
    finally:
        paddle.disable_static()


# ------------------------------------------------- k / v of a larger batch than q

@pytest.mark.parametrize("time_major", [False, True])
@pytest.mark.parametrize("with_ids", [False, True])
@pytest.mark.parametrize("neox", [True, False])
def test_k_v_of_a_larger_batch_are_rotated_for_qs_batch_as_on_the_gpu(clean_series, time_major, with_ids, neox):
    """Paddle's GPU kernel (FusedRopeKernel, fused_rope_kernel.cu) enforces only batch(q) <=
    batch(k) / batch(v) and launches over q's batch: k's and v's first batch(q) entries are
    rotated with q's positions, the rest left unwritten (zeros here, with zero gradient)."""
    functional, _ = _paddle_function_owners()
    rng = np.random.default_rng(hash((time_major, with_ids, neox)) % 2**32)
    batch, seq, d = 2, 5, 8
    big = lambda h: rng.standard_normal((seq, 3, h, d) if time_major else (3, seq, h, d)).astype("float32")  # noqa: E731
    xs, sin_t, cos_t, ids = make_case(rng, batch, seq, (2,), d, time_major, rows=7 if with_ids else None,
                                      with_ids=with_ids)
    xs += [big(1), big(3)]
    tensors = [paddle.to_tensor(x, stop_gradient=False) for x in xs]
    args = dict(sin=paddle.to_tensor(sin_t), cos=paddle.to_tensor(cos_t), use_neox_rotary_style=neox,
                time_major=time_major, position_ids=None if ids is None else paddle.to_tensor(ids))
    if not time_major or paddle_ext.compat.paddle_version() >= (3, 0, 0):  # 2.6.2 lacks time_major
        stock_args = {k: v for k, v in args.items() if k != "time_major" or time_major}
        with pytest.raises(RuntimeError, match="not registered"):  # stock Paddle: no CPU kernel
            functional.fused_rotary_position_embedding(*tensors, **stock_args)
    paddle_ext.enable()
    outs = functional.fused_rotary_position_embedding(*tensors, **args)
    grads = [rng.standard_normal(x.shape).astype("float32") for x in xs]
    paddle.autograd.backward(list(outs), [paddle.to_tensor(g) for g in grads])
    positions = ids if with_ids else np.broadcast_to(np.arange(seq), (batch, seq))
    for x, out, g, t in zip(xs, outs, grads, tensors):
        assert list(out.shape) == list(x.shape)
        head, tail = to_bshd(x, time_major)[:batch], to_bshd(out.numpy(), time_major)
        want = rotate_reference(head, sin_t, cos_t, positions, neox)
        assert max_relative_error(tail[:batch], want) <= 1e-6
        assert not tail[batch:].any()
        grad = to_bshd(t.grad.numpy(), time_major)
        want_grad = rotate_grad_reference(to_bshd(g, time_major)[:batch], sin_t, cos_t, positions, neox)
        assert max_relative_error(grad[:batch], want_grad) <= 1e-6
        assert not grad[batch:].any()
    assert all(np.array_equal(x, t.numpy()) for x, t in zip(xs, tensors))  # inputs untouched


def test_k_of_a_smaller_batch_is_refused_as_the_gpu_kernel_refuses_it(clean_series):
    """The GPU kernel's PADDLE_ENFORCE_LE(batch(q), batch(k)) is an InvalidArgument (ValueError)."""
    from paddle_ext.ops._checks import InvalidArgumentError

    functional, _ = _paddle_function_owners()
    paddle_ext.enable()
    with pytest.raises(InvalidArgumentError, match=r"k must match q in batch >= q's") as err:
        functional.fused_rotary_position_embedding(_t((3, 5, 2, 8)), _t((2, 5, 2, 8)))
    assert isinstance(err.value, ValueError)
