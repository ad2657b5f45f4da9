"""paddle.nn.functional.flashmask_attention (Paddle 3.3.1's call forms) on CPU
with the plugin enabled, against a numpy float64 reference built from the
dense mask Paddle's own test derives from startend_row_indices: two-document
masks (causal and not), sliding windows, random start/end masks in every
form ([B, H, Sk, 1 | 2 | 4], mask heads 1 / num_heads_k / num_heads, GQA);
forward and the grads of q, k, v within 1e-5 relative; return_softmax_lse
and seed_offset outputs; dropout; argument errors as Paddle raises them.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_ext
from paddle_ext import compat
from tests.test_flash_attention import check, check_lse, reference, rng

pytestmark = pytest.mark.skipif(compat.paddle_version() < (3, 0, 0), reason="flashmask_attention is Paddle 3.x")


@pytest.fixture(scope="module")
def F():
    import paddle.nn.functional as functional

    if not hasattr(functional, "flashmask_attention"):
        pytest.skip("this Paddle has no flashmask_attention")
    paddle_ext.enable()
    try:
        yield functional
    finally:
        paddle_ext.disable()


def dense_visible(startend: np.ndarray, causal: bool, sq: int) -> np.ndarray:
    """[B, mask_heads, Sq, Sk] booleans, as Paddle's test_flashmask.py expands the mask."""
    b, mh, sk, c = startend.shape
    visible = np.ones((b, mh, sq, sk), bool)
    has_end = (causal and c == 2) or (not causal and c == 4)
    for bi in range(b):
        for hi in range(mh):
            for j in range(sk):
                se = startend[bi, hi, j]
                visible[bi, hi, se[0]:(se[1] if has_end else sq), j] = False
                if causal:
                    visible[bi, hi, :j, j] = False
                elif has_end:
                    visible[bi, hi, se[2]:se[3], j] = False
                else:
                    visible[bi, hi, :se[1], j] = False
    return visible


def leaf(a):
    t = paddle.to_tensor(np.asarray(a, np.float32))
    t.stop_gradient = False
    return t


def run_and_check(F, startend, causal, b=2, s=300, hq=4, hk=2, d=32, salt=0, **kw):
    g = rng(700 + salt)
    q, dout = g.standard_normal((b, s, hq, d)), g.standard_normal((b, s, hq, d))
    k, v = g.standard_normal((b, s, hk, d)), g.standard_normal((b, s, hk, d))
    qt, kt, vt = leaf(q), leaf(k), leaf(v)
    se = None if startend is None else paddle.to_tensor(startend.astype(np.int32))
    out, lse = F.flashmask_attention(qt, kt, vt, se, causal=causal, return_softmax_lse=True, **kw)
    dq, dk, dv = paddle.grad([out], [qt, kt, vt], [paddle.to_tensor(dout.astype(np.float32))])
    if startend is None:  # window_size: the mask Paddle builds for it
        from paddle_ext.ops.flashmask import window_mask

        startend = window_mask(kw["window_size"], causal, b, s).numpy()
    vis = dense_visible(startend, causal, s)
    # query head h reads mask head h // (hq // mask_heads): mask heads 1, hk or hq
    refs = [reference(q[i], k[i], v[i], dout[i], d ** -0.5, False, visible=np.repeat(vis[i], hq // vis.shape[1], 0))
            for i in range(b)]
    ref = [np.stack([r[j] for r in refs]) for j in range(5)]
    floor = 0.1 * np.linalg.norm(dout)
    check("out", out.numpy(), ref[0])
    got_lse = lse.numpy()
    finite = np.isfinite(ref[1])
    check_lse(got_lse[finite], ref[1][finite])
    for name, got, r in (("dq", dq, ref[2]), ("dk", dk, ref[3]), ("dv", dv, ref[4])):
        check(name, got.numpy(), r, floor=floor)


def document_mask(b, s, bounds, causal, heads=1):
    """Documents [bounds[i], bounds[i+1]): key j hidden below its document (rows >= its end)
    and, non-causal, above it (rows < its start)."""
    ends, starts = np.zeros(s, np.int32), np.zeros(s, np.int32)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        ends[lo:hi], starts[lo:hi] = hi, lo
    cols = [ends] if causal else [ends, starts]
    return np.broadcast_to(np.stack(cols, -1)[None, None], (b, heads, s, len(cols))).copy()


@pytest.mark.parametrize("causal", [True, False])
def test_two_documents(F, causal):
    run_and_check(F, document_mask(2, 300, [0, 260, 300], causal), causal, salt=1 + causal)


def test_eight_documents_gqa_mask_per_kv_head(F):
    bounds = [0, 20, 57, 100, 101, 160, 230, 270, 300]
    run_and_check(F, document_mask(2, 300, bounds, True, heads=2), True, salt=3)


@pytest.mark.parametrize("causal,window", [(True, 40), (False, 25), (False, (50, 10))])
def test_sliding_window(F, causal, window):
    run_and_check(F, None, causal, window_size=window, salt=4 + causal)


def random_mask(b, s, heads, cols, causal, g):
    j = np.arange(s)
    if causal:
        lts = g.integers(j, s + 1, size=(b, heads, s))
        parts = [lts] if cols == 1 else [lts, g.integers(lts, s + 1)]
    else:
        lts = g.integers(j + 1, s + 1, size=(b, heads, s))
        if cols == 2:
            parts = [lts, g.integers(0, j + 1, size=(b, heads, s))]
        else:
            uts = g.integers(0, j + 1, size=(b, heads, s))
            parts = [lts, g.integers(lts, s + 1), uts, g.integers(uts, j + 1)]
    return np.stack(parts, -1).astype(np.int32)


@pytest.mark.parametrize("causal,cols,heads", [(True, 1, 4), (True, 2, 2), (False, 2, 1), (False, 4, 4)])
def test_random_start_end_masks(F, causal, cols, heads):
    g = rng(800 + cols + heads)
    run_and_check(F, random_mask(2, 300, heads, cols, causal, g), causal, salt=6 + cols + heads)


def test_outputs_and_dropout(F):
    g = rng(900)
    q, k, v = (paddle.to_tensor(g.standard_normal((1, 64, 2, 16)).astype(np.float32)) for _ in range(3))
    nothing_hidden = paddle.to_tensor(np.full((1, 1, 64, 1), 64, np.int32))
    out = F.flashmask_attention(q, k, v, nothing_hidden, causal=True)
    assert isinstance(out, paddle.Tensor)  # out alone, as Paddle returns it
    out, lse, seed_offset = F.flashmask_attention(q, k, v, nothing_hidden, causal=True, return_softmax_lse=True,
                                                  return_seed_offset=True)
    assert lse.shape == [1, 2, 64] and seed_offset.dtype == paddle.int64
    # dropout: the mask's seed and offset replay the plugin's flash attention bit for bit
    seed = paddle.to_tensor(np.array([7, 64], np.int64))
    masked = F.flashmask_attention(q, k, v, nothing_hidden, causal=True, dropout=0.3, fixed_seed_offset=seed)
    plain, _ = paddle_ext.ops.flash_attention(q, k, v, 0.3, True, fixed_seed_offset=seed)
    np.testing.assert_array_equal(masked.numpy(), plain.numpy())
    assert not np.array_equal(masked.numpy(), out.numpy())


@pytest.mark.parametrize("make,pattern", [
    (lambda F, q: F.flashmask_attention(q, q, q, paddle.zeros([1, 1, 8, 1], "int64"), causal=True),
     "startend_row_indices.dtype must be paddle.int32"),
    (lambda F, q: F.flashmask_attention(q, q, q, paddle.zeros([1, 1, 8, 4], "int32"), causal=True),
     "when causal is True, the last dimension should be either 1 or 2 but got 4"),
    (lambda F, q: F.flashmask_attention(q, q, q, paddle.zeros([1, 1, 7, 2], "int32")),
     "startend_row_indices.shape\\[2\\] must be equal to seqlen_k"),
    (lambda F, q: F.flashmask_attention(q, q, q, paddle.zeros([1, 1, 8, 2], "int32"), window_size=2),
     "can't use window_size with startend_row_indices"),
])
def test_errors_are_paddles(F, make, pattern):
    q = paddle.zeros([1, 8, 2, 16])
    with pytest.raises(AssertionError, match=pattern):
        make(F, q)
