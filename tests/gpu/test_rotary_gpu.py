"""paddle_ext.ops.fused_rotary_position_embedding on a GPU against the numpy
float64 reference of tests/test_rotary.py, and against the CPU kernel.

float32 and float64 are computed in double on both devices and rounded once,
so the GPU must give the CPU's bits; float16 / bfloat16 (computed in float32,
where the GPU may fuse multiply-adds) must agree within one unit in the last
place.

The whole module is skipped unless Paddle is a CUDA or ROCm build that sees a
device; it is collected without error on a CPU-only Paddle or without Paddle.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.gpu._device import gpu_skip_reason

_SKIP_REASON = gpu_skip_reason()
if _SKIP_REASON is not None:
    pytest.skip(f"GPU tests of fused_rotary_position_embedding: {_SKIP_REASON}", allow_module_level=True)

pytestmark = pytest.mark.gpu

from tests.test_rotary import (  # noqa: E402
    computed_tables,
    make_case,
    max_relative_error,
    rotate_grad_reference,
    rotate_reference,
    to_bshd,
)


def _places():
    import paddle

    return paddle.CUDAPlace(0), paddle.CPUPlace()


def _run(xs, sin_t, cos_t, ids, neox, time_major, grads, place, dtype=None, **kw):
    """Forward and backward on `place`; (outputs, input grads) as numpy."""
    import paddle

    from paddle_ext.ops import fused_rotary_position_embedding

    def tensor(a, stop_gradient=True):
        t = paddle.to_tensor(a, place=place)
        if dtype is not None:
            t = t.astype(dtype)
        t.stop_gradient = stop_gradient
        return t

    ts = [tensor(x, stop_gradient=False) for x in xs]
    sin = None if sin_t is None else tensor(sin_t)
    cos = None if cos_t is None else tensor(cos_t)
    pos = None if ids is None else paddle.to_tensor(ids, place=place)
    outs = fused_rotary_position_embedding(*ts, sin=sin, cos=cos, position_ids=pos,
                                           use_neox_rotary_style=neox, time_major=time_major, **kw)
    outs = [o for o in outs if o is not None]
    paddle.autograd.backward(outs, [tensor(g) for g in grads])

    def host(t):
        return t.astype("float32").numpy() if dtype in ("float16", "bfloat16") else t.numpy()

    return [host(o) for o in outs], [host(t.grad) for t in ts]


CASES = list(itertools.product([True, False], [False, True], [False, True], [(3,), (5, 1), (4, 2, 2)]))


@pytest.mark.parametrize("neox, with_ids, time_major, heads", CASES)
def test_float32_matches_reference_and_cpu_bits(neox, with_ids, time_major, heads):
    gpu, cpu = _places()
    rng = np.random.default_rng(hash((neox, with_ids, time_major, heads)) % 2**32)
    batch, seq, d = 2, 37, 24
    xs, sin_t, cos_t, ids = make_case(rng, batch, seq, heads, d, time_major, rows=50 if with_ids else None,
                                      with_ids=with_ids)
    grads = [rng.standard_normal(x.shape).astype("float32") for x in xs]
    outs, x_grads = _run(xs, sin_t, cos_t, ids, neox, time_major, grads, gpu)
    positions = ids if with_ids else np.broadcast_to(np.arange(seq), (batch, seq))
    for x, out, g, x_grad in zip(xs, outs, grads, x_grads):
        want = to_bshd(rotate_reference(to_bshd(x, time_major), sin_t, cos_t, positions, neox), time_major)
        assert max_relative_error(out, want) <= 1e-6
        want_grad = to_bshd(rotate_grad_reference(to_bshd(g, time_major), sin_t, cos_t, positions, neox),
                            time_major)
        assert max_relative_error(x_grad, want_grad) <= 1e-6
    cpu_outs, cpu_grads = _run(xs, sin_t, cos_t, ids, neox, time_major, grads, cpu)
    for a, b in zip(outs + x_grads, cpu_outs + cpu_grads):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("time_major", [False, True])
def test_computed_angles_match_reference_and_cpu(dtype, time_major):
    gpu, cpu = _places()
    rng = np.random.default_rng(4)
    batch, seq, d = 2, 300, 64
    xs, _, _, _ = make_case(rng, batch, seq, (4, 1), d, time_major, dtype=dtype)
    grads = [rng.standard_normal(x.shape).astype(dtype) for x in xs]
    outs, x_grads = _run(xs, None, None, None, True, time_major, grads, gpu, rotary_emb_base=50000.0)
    sin_t, cos_t = computed_tables(seq, d, 50000.0)
    positions = np.broadcast_to(np.arange(seq), (batch, seq))
    for x, out in zip(xs, outs):
        want = to_bshd(rotate_reference(to_bshd(x, time_major), sin_t, cos_t, positions, True), time_major)
        np.testing.assert_allclose(out, want, rtol=1e-6 if dtype == "float32" else 1e-12,
                                   atol=1e-12 * np.abs(want).max())
    cpu_outs, cpu_grads = _run(xs, None, None, None, True, time_major, grads, cpu, rotary_emb_base=50000.0)
    # The angles' sin/cos come from each device's libm: equal to about 1 ulp of double.
    for a, b in zip(outs + x_grads, cpu_outs + cpu_grads):
        np.testing.assert_allclose(a, b, rtol=1e-6 if dtype == "float32" else 1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype, ulp", [("float16", 2.0**-10), ("bfloat16", 2.0**-7)])
@pytest.mark.parametrize("neox", [True, False])
def test_half_precision_agrees_with_cpu(dtype, ulp, neox):
    gpu, cpu = _places()
    rng = np.random.default_rng(6)
    xs, sin_t, cos_t, ids = make_case(rng, 2, 33, (8, 2), 64, False, rows=40, with_ids=True)
    grads = [rng.standard_normal(x.shape).astype("float32") for x in xs]
    g = _run(xs, sin_t, cos_t, ids, neox, False, grads, gpu, dtype=dtype)
    c = _run(xs, sin_t, cos_t, ids, neox, False, grads, cpu, dtype=dtype)
    for a, b in zip(g[0] + g[1], c[0] + c[1]):
        np.testing.assert_allclose(a, b, rtol=ulp, atol=ulp * 1e-3)


def test_bad_position_id_raises_index_error_on_gpu():
    import paddle

    from paddle_ext.ops import fused_rotary_position_embedding

    gpu, _ = _places()
    q = paddle.to_tensor(np.zeros((2, 5, 3, 8), np.float32), place=gpu)
    tab = paddle.to_tensor(np.zeros((9, 8), np.float32), place=gpu)
    ids = np.zeros((2, 5), np.int64)
    ids[1, 2] = 9
    with pytest.raises(IndexError, match=r"position_ids\[1, 2\] = 9 is out of range"):
        fused_rotary_position_embedding(q, sin=tab, cos=tab, position_ids=paddle.to_tensor(ids, place=gpu))


def test_huge_head_dim_fails_cleanly():
    import paddle

    from paddle_ext.ops import fused_rotary_position_embedding

    gpu, _ = _places()
    q = paddle.to_tensor(np.zeros((1, 2, 1, 4096), np.float32), place=gpu)
    with pytest.raises(Exception, match="shared memory"):
        fused_rotary_position_embedding(q)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_paddles_name_keeps_paddles_gpu_kernel(dtype):
    """With the plugin enabled, Paddle's function name on GPU tensors gives Paddle's own
    kernel's bits (the unit serves CPU tensors only; the plugin's CUDA kernel computes
    float32 in double and would change them), through the package attribute and
    through the function as imported before enable()."""
    import paddle
    import paddle.incubate.nn.functional as functional

    import paddle_ext

    gpu, _ = _places()
    rng = np.random.default_rng(3)
    xs, sin_t, cos_t, ids = make_case(rng, 2, 16, (4, 2), 64, False, with_ids=True)

    def tensor(a):
        return paddle.to_tensor(a, place=gpu).astype(dtype)

    args = ([tensor(x) for x in xs] + [None, tensor(sin_t), tensor(cos_t), paddle.to_tensor(ids, place=gpu)])
    paddle_ext.disable()
    early = functional.fused_rotary_position_embedding
    stock = [t.astype("float32").numpy() for t in early(*args)[:2]]
    paddle_ext.enable()
    try:
        for fn in (functional.fused_rotary_position_embedding, early):
            got = [t.astype("float32").numpy() for t in fn(*args)[:2]]
            for g, s in zip(got, stock):
                np.testing.assert_array_equal(g, s)
    finally:
        paddle_ext.disable()
