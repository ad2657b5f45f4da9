"""flash_attn_qkvpacked / flash_attn_varlen_qkvpacked (paddle_ext.ops and, with the
plugin enabled, Paddle's own names) on CPU: equal to the unpacked calls on the same
query / key / value in every dtype the plugin takes, against a numpy float64
reference, varlen_padded layouts, gradients into qkv, and argument errors.

Sequences here have as many queries as keys, so causal masks need no alignment
convention.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_ext
from paddle_ext.ops.flash_attention import flash_attention, flash_attn_unpadded
from paddle_ext.ops.flash_attention_packed import flash_attn_qkvpacked, flash_attn_varlen_qkvpacked
from paddle_ext.patches import series

DTYPES = ["float32", "float16", "bfloat16"]


def reference(q, k, v, dout, scale, causal):
    """One sequence in float64: q [L, Hq, D], k / v [L, Hk, D] -> out, dq, dk, dv."""
    q, k, v, dout = (np.asarray(a, np.float64) for a in (q, k, v, dout))
    length, hq, d = q.shape
    group = hq // k.shape[1]
    kh = np.repeat(k.transpose(1, 0, 2), group, axis=0)
    vh = np.repeat(v.transpose(1, 0, 2), group, axis=0)
    qh, doh = q.transpose(1, 0, 2), dout.transpose(1, 0, 2)
    s = scale * qh @ kh.transpose(0, 2, 1)
    if causal:
        s = np.where(np.tril(np.ones((length, length), bool))[None], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    out = p @ vh
    dp = doh @ vh.transpose(0, 2, 1)
    ds = p * (dp - (doh * out).sum(axis=-1, keepdims=True)) * scale
    hk = k.shape[1]
    dk = (ds.transpose(0, 2, 1) @ qh).reshape(hk, group, length, d).sum(axis=1)
    dv = (p.transpose(0, 2, 1) @ doh).reshape(hk, group, length, d).sum(axis=1)
    return out.transpose(1, 0, 2), (ds @ kh).transpose(1, 0, 2), dk.transpose(1, 0, 2), dv.transpose(1, 0, 2)


def rel_err(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}


def leaf(array, dtype):
    t = paddle.to_tensor(np.asarray(array, np.float32)).astype(dtype)
    t.stop_gradient = False
    return t


def f64(t):
    return t.astype("float32").numpy().astype(np.float64)


def same_bits(a, b):
    np.testing.assert_array_equal(a.astype("float32").numpy(), b.astype("float32").numpy())


# --------------------------------------------------------------- padded batch

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, seqlen, groups, heads_k, head_dim, causal", [
    (2, 37, 1, 3, 32, False),
    (1, 70, 2, 2, 64, True),   # GQA: 4 query heads over 2 kv heads
    (1, 16, 4, 1, 16, True),   # MQA
])
def test_qkvpacked_equals_unpacked_and_the_reference(dtype, batch, seqlen, groups, heads_k, head_dim, causal):
    rng = np.random.default_rng(batch * 1000 + seqlen)
    qkv_np = rng.standard_normal((batch, seqlen, groups + 2, heads_k, head_dim))
    dout_np = rng.standard_normal((batch, seqlen, groups * heads_k, head_dim))
    qkv = leaf(qkv_np, dtype)
    out, softmax = flash_attn_qkvpacked(qkv, causal=causal)
    assert softmax is None and out.shape == [batch, seqlen, groups * heads_k, head_dim] and out.dtype == qkv.dtype
    dout = paddle.to_tensor(dout_np.astype(np.float32)).astype(dtype)
    (dqkv,) = paddle.grad([out], [qkv], [dout])

    # unpacked: query heads g * heads_k + j are slot g of kv head j
    q = leaf(qkv_np[:, :, :-2].reshape(batch, seqlen, groups * heads_k, head_dim), dtype)
    k, v = leaf(qkv_np[:, :, -2], dtype), leaf(qkv_np[:, :, -1], dtype)
    out_u = flash_attention(q, k, v, causal=causal)[0]
    dq, dk, dv = paddle.grad([out_u], [q, k, v], [dout])
    same_bits(out, out_u)
    same_bits(dqkv[:, :, :-2].reshape(dq.shape), dq)
    same_bits(dqkv[:, :, -2], dk)
    same_bits(dqkv[:, :, -1], dv)

    x = f64(qkv)  # the rounded inputs
    for b in range(batch):
        r = reference(x[b, :, :-2].reshape(seqlen, -1, head_dim), x[b, :, -2], x[b, :, -1],
                      f64(dout)[b], head_dim ** -0.5, causal)
        got = (f64(out)[b], f64(dqkv)[b, :, :-2].reshape(seqlen, -1, head_dim), f64(dqkv)[b, :, -2],
               f64(dqkv)[b, :, -1])
        for name, g, want in zip(("out", "dq", "dk", "dv"), got, r):
            assert rel_err(g, want) < TOL[dtype], (name, rel_err(g, want))


# ----------------------------------------------------------------- varlen

def varlen_case(lengths, groups, heads_k, head_dim, seed):
    rng = np.random.default_rng(seed)
    total = sum(lengths)
    qkv = rng.standard_normal((total, groups + 2, heads_k, head_dim))
    dout = rng.standard_normal((total, groups * heads_k, head_dim))
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return qkv, dout, cu


def pad_rows(x, lengths, max_len):
    """[total, ...] compact -> [batch * max_len, ...] with sequence b at row b * max_len."""
    out = np.zeros((len(lengths) * max_len,) + x.shape[1:], x.dtype)
    start = 0
    for b, n in enumerate(lengths):
        out[b * max_len: b * max_len + n] = x[start: start + n]
        start += n
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_qkvpacked_compact_equals_unpadded(dtype, causal):
    lengths, groups, heads_k, d = [5, 1, 23, 9], 2, 2, 32
    qkv_np, dout_np, cu_np = varlen_case(lengths, groups, heads_k, d, 3)
    cu = paddle.to_tensor(cu_np)
    qkv = leaf(qkv_np, dtype)
    out, _ = flash_attn_varlen_qkvpacked(qkv, cu, cu, 23, 23, 0.3, causal=causal, varlen_padded=False)
    dout = paddle.to_tensor(dout_np.astype(np.float32)).astype(dtype)
    (dqkv,) = paddle.grad([out], [qkv], [dout])
    q = leaf(qkv_np[:, :-2].reshape(len(qkv_np), -1, d), dtype)
    k, v = leaf(qkv_np[:, -2], dtype), leaf(qkv_np[:, -1], dtype)
    out_u = flash_attn_unpadded(q, k, v, cu, cu, 23, 23, 0.3, causal=causal)[0]
    dq, dk, dv = paddle.grad([out_u], [q, k, v], [dout])
    same_bits(out, out_u)
    same_bits(dqkv[:, :-2].reshape(dq.shape), dq)
    same_bits(dqkv[:, -2], dk)
    same_bits(dqkv[:, -1], dv)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_padded_rows_are_skipped_and_zero(dtype, causal):
    """Paddle's default varlen_padded=True: sequence b at row b * max_seqlen; the
    real rows equal the compact call bit for bit and the reference, padding rows
    give zeros and get zero gradients (a tail after batch * max_seqlen included)."""
    lengths, groups, heads_k, d, max_len = [5, 1, 16, 9], 1, 3, 16, 16
    qkv_c, dout_c, cu_np = varlen_case(lengths, groups, heads_k, d, 4)
    rng = np.random.default_rng(5)
    qkv_p = pad_rows(qkv_c, lengths, max_len)
    real = pad_rows(np.ones((len(qkv_c), 1)), lengths, max_len)[:, 0] > 0
    qkv_p[~real] = rng.standard_normal(qkv_p[~real].shape) * 50  # padding must not leak in
    qkv_p = np.concatenate([qkv_p, rng.standard_normal((3,) + qkv_p.shape[1:])])  # a tail
    real = np.concatenate([real, [False] * 3])
    dout_p = np.concatenate([pad_rows(dout_c, lengths, max_len), np.ones((3,) + dout_c.shape[1:])])
    dout_p[~real] = 1.0

    cu = paddle.to_tensor(cu_np)
    qkv = leaf(qkv_p, dtype)
    out, softmax = flash_attn_varlen_qkvpacked(qkv, cu, cu, max_len, max_len, d ** -0.5, causal=causal,
                                               return_softmax=True)
    assert out.shape == [len(qkv_p), groups * heads_k, d]
    assert softmax.shape == [len(lengths), groups * heads_k, max_len, max_len]
    dout = paddle.to_tensor(dout_p.astype(np.float32)).astype(dtype)
    (dqkv,) = paddle.grad([out], [qkv], [dout])
    assert not f64(out)[~real].any() and not f64(dqkv)[~real].any()

    compact = leaf(qkv_c, dtype)
    out_c, softmax_c = flash_attn_varlen_qkvpacked(compact, cu, cu, max_len, max_len, d ** -0.5, causal=causal,
                                                   return_softmax=True, varlen_padded=False)
    (dqkv_c,) = paddle.grad([out_c], [compact], [paddle.to_tensor(dout_c.astype(np.float32)).astype(dtype)])
    np.testing.assert_array_equal(f64(out)[real], f64(out_c))
    np.testing.assert_array_equal(f64(dqkv)[real], f64(dqkv_c))
    np.testing.assert_array_equal(f64(softmax), f64(softmax_c))

    x, g = f64(compact), f64(dout)[real]
    refs = [reference(x[s:e, :-2].reshape(e - s, -1, d), x[s:e, -2], x[s:e, -1], g[s:e], d ** -0.5, causal)
            for s, e in zip(cu_np[:-1], cu_np[1:])]
    want = [np.concatenate(parts) for parts in zip(*refs)]  # the whole batch: out, dq, dk, dv
    got = (f64(out_c), f64(dqkv_c)[:, :-2].reshape(len(x), -1, d), f64(dqkv_c)[:, -2], f64(dqkv_c)[:, -1])
    for name, a, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert rel_err(a, w) < TOL[dtype], (name, rel_err(a, w))


# ------------------------------------------------------ through Paddle's names

def _paddle_has(name):
    import paddle.nn.functional.flash_attention as module

    return hasattr(module, name)


needs_packed_names = pytest.mark.skipif(not _paddle_has("flash_attn_qkvpacked"),
                                        reason=f"Paddle {paddle.__version__} has no packed-QKV functions")


@needs_packed_names
def test_paddles_names_route_to_the_plugin(plugin_enabled):
    import paddle.nn.functional as F
    import paddle.nn.functional.flash_attention as module

    for owner in (F, module):
        assert series().installed_by(owner.flash_attn_qkvpacked) == "flash_attention"
        assert series().installed_by(owner.flash_attn_varlen_qkvpacked) == "flash_attention"
    rng = np.random.default_rng(8)
    qkv = paddle.to_tensor(rng.standard_normal((1, 12, 3, 2, 16)).astype(np.float32))
    out, none = F.flash_attn_qkvpacked(qkv, 0.0, True, False)
    assert none is None
    same_bits(out, flash_attn_qkvpacked(qkv, causal=True)[0])
    flat = qkv.reshape([12, 3, 2, 16])
    cu = paddle.to_tensor(np.array([0, 5, 12], np.int32))
    out, _ = F.flash_attn_varlen_qkvpacked(flat, cu, cu, 7, 7, 0.25, 0.0, True, False, None, "", False)
    same_bits(out, flash_attn_varlen_qkvpacked(flat, cu, cu, 7, 7, 0.25, causal=True, varlen_padded=False)[0])


@needs_packed_names
def test_float64_qkvpacked_keeps_paddles_cpu_math_path(clean_series):
    """The plugin's kernel takes no float64; Paddle's CPU fallback does: enabled, its bits."""
    import paddle.nn.functional as F

    qkv = paddle.to_tensor(np.random.default_rng(6).standard_normal((1, 5, 3, 1, 8)))
    stock = F.flash_attn_qkvpacked(qkv)[0].numpy()
    clean_series.enable()
    np.testing.assert_array_equal(F.flash_attn_qkvpacked(qkv)[0].numpy(), stock)


@needs_packed_names
def test_disable_restores_paddles_functions(clean_series):
    import paddle.nn.functional as F

    originals = (F.flash_attn_qkvpacked, F.flash_attn_varlen_qkvpacked)
    paddle_ext.enable()
    paddle_ext.disable()
    assert (F.flash_attn_qkvpacked, F.flash_attn_varlen_qkvpacked) == originals


# ------------------------------------------------------------------ errors

def _cu(values):
    return paddle.to_tensor(np.array(values, np.int32))


@pytest.mark.parametrize("call, pattern", [
    (lambda: flash_attn_qkvpacked(paddle.zeros([1, 4, 3, 16])),
     r"qkv must be 5-D \[batch, seqlen, num_heads/num_heads_k \+ 2, num_heads_k, head_dim\], got shape \[1, 4, 3, 16\]"),
    (lambda: flash_attn_qkvpacked(paddle.zeros([1, 4, 2, 1, 16])),
     r"qkv's dimension 2 \(num_heads/num_heads_k \+ 2\) must be >= 3, got 2"),
    (lambda: flash_attn_varlen_qkvpacked(paddle.zeros([4, 3, 1, 16]), _cu([0, 5]), _cu([0, 5]), 5, 5, 0.1),
     r"qkv must have at least batch \* max_seqlen_q = 1 \* 5 rows with varlen_padded=True, got 4"),
    (lambda: flash_attn_varlen_qkvpacked(paddle.zeros([8, 3, 1, 16]), _cu([0, 5, 8]), _cu([0, 5, 8]), 4, 4, 0.1),
     r"cu_seqlens_q: sequence 0 has 5 tokens, more than max_seqlen_q=4"),
    (lambda: flash_attn_varlen_qkvpacked(paddle.zeros([8, 3, 1, 16]), _cu([0, 4, 8]), _cu([0, 8]), 4, 8, 0.1),
     r"cu_seqlens_q and cu_seqlens_k must have the same batch \+ 1 entries"),
    (lambda: flash_attn_varlen_qkvpacked(paddle.zeros([8, 3, 1, 16]), _cu([0, 8]), _cu([0, 8]), 0, 8, 0.1),
     r"max_seqlen_q must be >= 1 with varlen_padded=True"),
])
@pytest.mark.parametrize("caught_as", [AssertionError, ValueError])
def test_errors_name_the_argument(call, pattern, caught_as):
    with pytest.raises(caught_as, match=pattern):
        call()


def test_varlen_padded_must_be_a_bool():
    with pytest.raises(TypeError, match="varlen_padded must be a bool, got int 1"):
        flash_attn_varlen_qkvpacked(paddle.zeros([8, 3, 1, 16]), _cu([0, 8]), _cu([0, 8]), 8, 8, 0.1,
                                    varlen_padded=1)


# ------------------------------------------------ calc_reduced_attention_scores

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sq, sk, heads, heads_k", [(37, 700, 4, 2), (600, 20, 2, 2)])
def test_reduced_attention_scores_match_the_reference(dtype, sq, sk, heads, heads_k):
    """Column sums of softmax(q k^T / sqrt(d)) from the forward's lse (query blocks of 512
    crossed when sq = 600); through Paddle's name too when enabled."""
    from paddle_ext.ops import calc_reduced_attention_scores

    rng = np.random.default_rng(sq + sk)
    d = 32
    q = paddle.to_tensor(rng.standard_normal((2, sq, heads, d)).astype(np.float32)).astype(dtype)
    k = paddle.to_tensor(rng.standard_normal((2, sk, heads_k, d)).astype(np.float32)).astype(dtype)
    _, _, lse = flash_attention(q, k, k, return_softmax_lse=True)
    got = calc_reduced_attention_scores(q, k, lse)
    assert got.shape == [2, heads, 1, sk] and got.dtype == paddle.float32
    qf, kf = f64(q), np.repeat(f64(k), heads // heads_k, axis=2)
    s = np.einsum("bihd,bjhd->bhij", qf, kf) / np.sqrt(d)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = p.sum(axis=2, keepdims=True)
    assert rel_err(got.numpy(), want) < 1e-5  # computed in float32 from the rounded inputs
    np.testing.assert_allclose(got.numpy().sum(-1), sq, rtol=1e-5)  # every row of p sums to 1
    padded_lse = paddle.concat([lse, paddle.zeros([2, heads, 128 - sq % 128])], axis=-1)  # Paddle GPU's rows
    np.testing.assert_array_equal(calc_reduced_attention_scores(q, k, padded_lse).numpy(), got.numpy())


@pytest.mark.skipif(not _paddle_has("calc_reduced_attention_scores"),
                    reason=f"Paddle {paddle.__version__} has no calc_reduced_attention_scores")
def test_reduced_attention_scores_through_paddles_name(plugin_enabled):
    import paddle.nn.functional.flash_attention as module

    from paddle_ext.ops import calc_reduced_attention_scores

    rng = np.random.default_rng(2)
    q = paddle.to_tensor(rng.standard_normal((1, 9, 2, 16)).astype(np.float32))
    _, _, lse = flash_attention(q, q, q, return_softmax_lse=True)
    np.testing.assert_array_equal(module.calc_reduced_attention_scores(q, q, lse).numpy(),
                                  calc_reduced_attention_scores(q, q, lse).numpy())


@pytest.mark.parametrize("caught_as", [AssertionError, ValueError])
def test_reduced_attention_scores_are_for_inference_only(caught_as):
    from paddle_ext.ops import calc_reduced_attention_scores

    q = paddle.zeros([1, 4, 2, 16])
    q.stop_gradient = False
    with pytest.raises(caught_as, match=r"for inference only: query and key must have stop_gradient=True"):
        calc_reduced_attention_scores(q, q, paddle.zeros([1, 2, 4]))
    with pytest.raises(caught_as, match=r"softmax_lse must be \[batch, num_heads, >= seqlen_q\] = \[1, 2, >= 4\]"):
        calc_reduced_attention_scores(q.detach(), q.detach(), paddle.zeros([1, 2, 3]))
