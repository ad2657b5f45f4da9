"""paddle_ext.ops.flash_attention / flash_attn_unpadded on a GPU: the plugin's
CUDA / HIP kernels (PADDLE_EXT_FLASH_ATTN_GPU=plugin) against the float64
reference of tests/test_flash_attention.py and against the CPU kernels, the
dropout mask shared by both devices, and Paddle's native kernel behind the
same API for float16 / bfloat16.

The whole module is skipped unless Paddle is a CUDA or ROCm build that sees a
device; it is collected without error on a CPU-only Paddle or without Paddle.
tests/gpu/device_check.sh builds and runs a Paddle-free check of the same kernels
(GPU against CPU and against float64, timings against PyTorch), then this module when a GPU
build of Paddle is there (docs/gpu_check.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu._device import gpu_skip_reason

_SKIP_REASON = gpu_skip_reason()
if _SKIP_REASON is not None:
    pytest.skip(f"GPU tests of flash_attention: {_SKIP_REASON}", allow_module_level=True)

pytestmark = pytest.mark.gpu

import paddle  # noqa: E402

from paddle_ext.ops.flash_attention import flash_attention, flash_attn_unpadded  # noqa: E402
from tests.test_flash_attention import check, check_lse, padded_case, reference, rng  # noqa: E402


@pytest.fixture(autouse=True)
def plugin_kernel(monkeypatch):
    monkeypatch.setenv("PADDLE_EXT_FLASH_ATTN_GPU", "plugin")


def _on(place, arrays, dtype="float32", grad=True):
    out = []
    for a in arrays:
        t = paddle.to_tensor(a.astype(np.float32), place=place).astype(dtype)
        t.stop_gradient = not grad
        out.append(t)
    return out


def _run(place, q, k, v, dout, causal, dtype="float32", **kw):
    qt, kt, vt = _on(place, (q, k, v), dtype)
    out, _, lse = flash_attention(qt, kt, vt, causal=causal, return_softmax_lse=True, **kw)
    (dot,) = _on(place, (dout,), dtype, grad=False)
    dq, dk, dv = paddle.grad([out], [qt, kt, vt], [dot])
    return [t.astype("float32").numpy() for t in (out, lse, dq, dk, dv)]


@pytest.mark.parametrize("b,sq,sk,hq,hk,d,causal", [
    (2, 17, 17, 2, 2, 32, False),
    (1, 1, 1, 2, 1, 64, False),
    (1, 127, 127, 4, 2, 64, True),
    (2, 100, 37, 4, 1, 128, True),
    (1, 37, 100, 2, 2, 256, True),
    (1, 300, 300, 2, 2, 40, False),
])
def test_gpu_kernel_matches_reference_and_cpu(b, sq, sk, hq, hk, d, causal):
    q, k, v, dout = padded_case(b, sq, sk, hq, hk, d, salt=hash((b, sq, sk, hq, hk, d)) % 2**31)
    gpu = _run(paddle.CUDAPlace(0), q, k, v, dout, causal)
    cpu = _run(paddle.CPUPlace(), q, k, v, dout, causal)
    floor = 0.1 * np.linalg.norm(dout)
    for i in range(b):
        r = reference(q[i], k[i], v[i], dout[i], d ** -0.5, causal)
        check("out", gpu[0][i], r[0])
        finite = np.isfinite(r[1])
        assert np.array_equal(np.isinf(gpu[1][i]), np.isinf(r[1]))
        check_lse(gpu[1][i][finite], r[1][finite])
        check("dq", gpu[2][i], r[2], floor=floor)
        check("dk", gpu[3][i], r[3], floor=floor)
        check("dv", gpu[4][i], r[4])
    for g, c in zip(gpu, cpu):
        np.testing.assert_allclose(g, c, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_kernel_half(dtype):
    q, k, v, dout = padded_case(1, 64, 80, 4, 2, 64, salt=3)
    gpu = _run(paddle.CUDAPlace(0), q, k, v, dout, True, dtype)
    cpu = _run(paddle.CPUPlace(), q, k, v, dout, True, dtype)
    for g, c in zip(gpu, cpu):
        np.testing.assert_allclose(g, c, rtol=2e-2, atol=2e-2)


def test_gpu_dropout_mask_equals_the_cpu_mask():
    q, k, v, _ = padded_case(2, 50, 70, 4, 2, 32, salt=4)
    seed = paddle.to_tensor(np.array([2024, 4096], np.int64))
    results = []
    for place in (paddle.CUDAPlace(0), paddle.CPUPlace()):
        qt, kt, vt = _on(place, (q, k, v), grad=False)
        out, softmax = flash_attention(qt, kt, vt, 0.3, True, True, fixed_seed_offset=seed)
        results.append((out.numpy(), softmax.numpy()))
    (gout, gsm), (cout, csm) = results
    np.testing.assert_array_equal(np.signbit(gsm), np.signbit(csm))
    np.testing.assert_allclose(gsm, csm, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gout, cout, rtol=1e-4, atol=1e-5)


def test_gpu_varlen_matches_cpu():
    lq, lk = [5, 1, 70], [9, 1, 50]
    g = rng(5)
    q, dout = g.standard_normal((sum(lq), 4, 64)), g.standard_normal((sum(lq), 4, 64))
    k, v = g.standard_normal((sum(lk), 2, 64)), g.standard_normal((sum(lk), 2, 64))
    results = []
    for place in (paddle.CUDAPlace(0), paddle.CPUPlace()):
        qt, kt, vt = _on(place, (q, k, v))
        cu_q = paddle.to_tensor(np.array([0, 5, 6, 76], np.int32), place=place)
        cu_k = paddle.to_tensor(np.array([0, 9, 10, 60], np.int32), place=place)
        out, _ = flash_attn_unpadded(qt, kt, vt, cu_q, cu_k, 70, 50, 0.125, causal=True)
        grads = paddle.grad([out], [qt, kt, vt], [paddle.to_tensor(dout.astype(np.float32), place=place)])
        results.append([t.numpy() for t in [out, *grads]])
    for gv, cv in zip(*results):
        np.testing.assert_allclose(gv, cv, rtol=1e-4, atol=1e-5)


def test_native_kernel_behind_the_api(monkeypatch):
    """float16 with as many kv heads as query heads goes to Paddle's kernel on a
    CUDA build; it must agree with the plugin's."""
    if paddle.is_compiled_with_rocm():
        pytest.skip("the native dispatch is for CUDA builds")
    q, k, v, _ = padded_case(2, 128, 128, 4, 4, 64, salt=6)
    qt, kt, vt = _on(paddle.CUDAPlace(0), (q, k, v), "float16", grad=False)
    plugin, _ = flash_attention(qt, kt, vt, causal=True)
    monkeypatch.delenv("PADDLE_EXT_FLASH_ATTN_GPU")
    native, _ = flash_attention(qt, kt, vt, causal=True)
    np.testing.assert_allclose(native.astype("float32").numpy(), plugin.astype("float32").numpy(),
                               rtol=5e-3, atol=5e-3)
