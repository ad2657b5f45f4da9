"""paddle_ext.ops' RMSNorm kernels against a numpy float64 reference written from
Paddle's GPU kernels (fused_rms_norm_ext: RMSLnFwd / RMSLnBwd), their gradients,
their argument errors, and the fused_rms_norm patch unit."""

import numpy as np
import paddle
import pytest

import paddle_ext
import paddle_ext.ops as ops
from paddle_ext import compat
from paddle_ext.ops.routes import rms_norm as routes
from paddle_ext.patches import fused_rms_norm as unit

F = paddle.incubate.nn.functional
pytestmark = pytest.mark.usefixtures("clean_series")
HAS_EXT = hasattr(paddle._C_ops, "fused_rms_norm_ext")
QUANT_OP = compat.fused_rms_norm_op_name()
HAS_QUANT = QUANT_OP is not None
# float32 bounds come from the issue; the half-precision ones are a few roundings
# of their 8 (bfloat16) and 11 (float16) bit mantissas.
TOLERANCE = {"float32": 1e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


# ----------------------------------------------------------------- reference

def reference(x, w, g, eps, cols):
    """float64 (y, inv_var, dx, dw) over rows of `cols` trailing elements."""
    shape = x.shape
    x = np.asarray(x, np.float64).reshape(-1, cols)
    w = np.asarray(w, np.float64)
    g = np.asarray(g, np.float64).reshape(-1, cols)
    inv = 1.0 / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps)
    y = w * inv * x
    dot = (g * w * x).sum(axis=1, keepdims=True)
    dx = inv * w * g - inv ** 3 * dot / cols * x
    dw = (g * x * inv).sum(axis=0)
    return y.reshape(shape), inv[:, 0], dx.reshape(shape), dw


def rel(got, want):
    """Norm-wise relative error: max |got - want| / max |want|."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-300))


def as_f64(t):
    return t.astype("float32").numpy().astype(np.float64)


def tensors(shape, cols, dtype, wdtype=None, seed=0):
    rng = np.random.default_rng(seed)
    x = paddle.to_tensor(rng.standard_normal(shape).astype("float32")).astype(dtype)
    w = paddle.to_tensor((rng.random(cols) + 0.5).astype("float32")).astype(wdtype or dtype)
    g = paddle.to_tensor(rng.standard_normal(shape).astype("float32")).astype(wdtype or dtype)
    x.stop_gradient = False
    w.stop_gradient = False
    return x, w, g


# ------------------------------------------------------ fused_rms_norm_ext (ops)

@pytest.mark.parametrize("shape", [[4, 7], [3, 4097], [2, 3, 64], [37], [1, 1, 5]])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_ext_forward_and_gradients_match_float64(shape, dtype):
    cols = shape[-1]
    x, w, g = tensors(shape, cols, dtype)
    y, inv_var = ops.fused_rms_norm_ext(x, w, 1e-6)
    paddle.autograd.backward([y], [g])
    ry, rinv, rdx, rdw = reference(as_f64(x), as_f64(w), as_f64(g), 1e-6, cols)
    assert y.dtype == w.dtype and list(y.shape) == shape
    assert inv_var.dtype == paddle.float32 and list(inv_var.shape) == [int(np.prod(shape[:-1]))]
    assert inv_var.stop_gradient
    tol = TOLERANCE[dtype]
    assert rel(as_f64(y), ry) < tol
    assert rel(inv_var.numpy(), rinv) < 1e-6  # float32 in every case
    assert rel(as_f64(x.grad), rdx) < tol * (4 if dtype != "float32" else 1)
    assert rel(as_f64(w.grad), rdw) < tol * (4 if dtype != "float32" else 1)
    assert x.grad.dtype == x.dtype and w.grad.dtype == w.dtype


def test_hidden_size_one_gradient_is_a_cancellation_bounded_by_its_terms():
    # With one column y = w * x / sqrt(x^2 + eps), and dx = w g inv - w g inv^3 x^2
    # is the difference of two nearly equal terms (as in Paddle's GPU kernel): the
    # error is bounded relative to the terms, not to their tiny difference.
    x, w, g = tensors([64, 1], 1, "float32")
    y, _ = ops.fused_rms_norm_ext(x, w, 1e-6)
    paddle.autograd.backward([y], [g])
    ry, _, rdx, rdw = reference(as_f64(x), as_f64(w), as_f64(g), 1e-6, 1)
    assert rel(y.numpy(), ry) < 1e-6
    terms = np.abs(as_f64(g) * as_f64(w) / np.sqrt(as_f64(x) ** 2 + 1e-6)).max()
    assert np.abs(x.grad.numpy() - rdx).max() < 1e-6 * terms
    assert rel(w.grad.numpy(), rdw) < 1e-6


@pytest.mark.parametrize("xdtype, wdtype", [("bfloat16", "float32"), ("float32", "bfloat16"),
                                            ("float16", "float32")])
def test_ext_mixed_dtypes_give_y_the_weight_dtype_as_the_gpu_kernel(xdtype, wdtype):
    x, w, g = tensors([5, 96], 96, xdtype, wdtype)
    y, _ = ops.fused_rms_norm_ext(x, w)
    paddle.autograd.backward([y], [g])
    ry, _, rdx, rdw = reference(as_f64(x), as_f64(w), as_f64(g), 1e-5, 96)
    assert y.dtype == w.dtype and x.grad.dtype == x.dtype and w.grad.dtype == w.dtype
    tol = max(TOLERANCE[xdtype], TOLERANCE[wdtype])
    assert rel(as_f64(y), ry) < tol
    assert rel(as_f64(x.grad), rdx) < 4 * tol and rel(as_f64(w.grad), rdw) < 4 * tol


def test_ext_equals_paddles_unfused_composition():
    x, w, g = tensors([8, 640], 640, "float32", seed=3)
    eps = 1e-6
    xc = x.detach()
    wc = w.detach()
    xc.stop_gradient = wc.stop_gradient = False
    composed = xc * paddle.rsqrt((xc * xc).mean(axis=-1, keepdim=True) + eps) * wc
    (composed * g).sum().backward()
    y, _ = ops.fused_rms_norm_ext(x, w, eps)
    paddle.autograd.backward([y], [g])
    assert rel(y.numpy(), composed.numpy()) < 1e-6
    assert rel(x.grad.numpy(), xc.grad.numpy()) < 1e-6
    assert rel(w.grad.numpy(), wc.grad.numpy()) < 1e-6


def test_frozen_weight_and_weight_only_uses():
    x, w, g = tensors([6, 33], 33, "float32")
    w.stop_gradient = True
    y, _ = ops.fused_rms_norm_ext(x, w)
    paddle.autograd.backward([y], [g])
    assert w.grad is None and x.grad is not None


def test_results_do_not_depend_on_the_thread_count():
    x, w, g = tensors([300, 257], 257, "float32", seed=5)
    before = ops.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            ops.set_num_threads(n)
            xx = x.detach()
            ww = w.detach()
            xx.stop_gradient = ww.stop_gradient = False
            y, inv = ops.fused_rms_norm_ext(xx, ww)
            paddle.autograd.backward([y], [g])
            results.append([t.numpy() for t in (y, inv, xx.grad, ww.grad)])
    finally:
        ops.set_num_threads(before)
    for other in results[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(results[0], other))


def test_no_rows_gives_empty_outputs():
    x = paddle.zeros([0, 8])
    y, inv = ops.fused_rms_norm_ext(x, paddle.ones([8]))
    assert list(y.shape) == [0, 8] and list(inv.shape) == [0]


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: ops.fused_rms_norm_ext(paddle.ones([2, 4]), paddle.ones([3])), ValueError,
     r"scale must be 1-D \[cols\] with cols = 4 .*got shape \[3\]"),
    (lambda: ops.fused_rms_norm_ext(paddle.ones([2, 4]), paddle.ones([1, 4])), ValueError, r"got shape \[1, 4\]"),
    (lambda: ops.fused_rms_norm_ext(paddle.ones([2, 4], "int32"), paddle.ones([4])), TypeError,
     r"x must have dtype in \('float32', 'float16', 'bfloat16'\), got int32"),
    (lambda: ops.fused_rms_norm_ext(paddle.ones([2, 4]), paddle.ones([4], "float64")), TypeError,
     r"scale must have dtype in .* got float64"),
    (lambda: ops.fused_rms_norm_ext(paddle.ones([2, 4]), paddle.ones([4]), -1.0), ValueError,
     r"epsilon must be a finite number >= 0, got -1.0"),
    (lambda: ops.fused_rms_norm_ext(paddle.ones([2, 4]), paddle.ones([4]), "1e-5"), TypeError,
     r"epsilon must be a number, got str"),
    (lambda: ops.fused_rms_norm_ext(np.ones([2, 4]), paddle.ones([4])), TypeError, r"x must be a paddle.Tensor"),
    (lambda: ops.fused_rms_norm_ext(paddle.ones([2, 0]), paddle.ones([0])), ValueError,
     r"x's normalised size must be > 0"),
    (lambda: ops.fused_rms_norm(paddle.ones([2, 4]), paddle.ones([4]), None, 1e-5, 2), ValueError,
     r"begin_norm_axis must be in \[-2, 2\) for x of shape \[2, 4\], got 2"),
    (lambda: ops.fused_rms_norm(paddle.ones([2, 4]), paddle.ones([4]), None, 1e-5, 1, residual=paddle.ones([1, 4])),
     ValueError, r"residual must have x's shape \[2, 4\], got \[1, 4\]"),
    (lambda: ops.fused_rms_norm(paddle.ones([2, 4]), paddle.ones([4]), None, 1e-5, 1, residual=paddle.ones([2, 4]),
                                bias=paddle.ones([3])), ValueError, r"bias must have 4 elements .*got shape \[3\]"),
    (lambda: ops.fused_rms_norm(paddle.ones([2, 4]), paddle.ones([4]), None, 1e-5, 1,
                                residual=paddle.ones([2, 4], "float16")), TypeError,
     r"residual must have x's dtype float32, got float16"),
    (lambda: ops.fused_rms_norm(paddle.ones([2, 4]), paddle.ones([4]), None, 1e-5, 1, quant_scale=0.5),
     ValueError, r"quant_scale must be <= 0 .*got 0.5"),
    (lambda: ops.fused_rms_norm(paddle.ones([2, 4]), paddle.ones([4]), paddle.ones([3]), 1e-5, 1), ValueError,
     r"norm_bias must be 1-D \[4\] .*got shape \[3\]"),
])
def test_bad_arguments_raise_naming_them(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


# ------------------------------------------------ fused_rms_norm (ops, plain)

@pytest.mark.parametrize("shape, axis", [([4, 24], 1), ([2, 3, 16], 1), ([2, 3, 16], 2), ([2, 3, 16], -1),
                                         ([3, 5, 7], -2)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_fused_rms_norm_plain_matches_float64(shape, axis, dtype):
    cols = int(np.prod(shape[axis % len(shape):]))
    x, w, g = tensors(shape, cols, dtype)
    b = paddle.to_tensor(np.linspace(-1, 1, cols).astype("float32")).astype(dtype)
    b.stop_gradient = False
    out, _ = ops.fused_rms_norm(x, w, b, 1e-6, axis)
    paddle.autograd.backward([out], [g])
    ry, _, rdx, rdw = reference(as_f64(x), as_f64(w), as_f64(g), 1e-6, cols)
    ry = (ry.reshape(-1, cols) + as_f64(b)).reshape(shape)
    tol = TOLERANCE[dtype]
    assert out.dtype == x.dtype and list(out.shape) == shape
    assert rel(as_f64(out), ry) < tol
    assert rel(as_f64(x.grad), rdx) < 4 * tol
    assert rel(as_f64(w.grad), rdw) < 4 * tol
    assert rel(as_f64(b.grad), as_f64(g).reshape(-1, cols).sum(axis=0)) < 4 * tol


# ------------------------------------------------------------ the patch unit

def test_stock_paddle_has_no_cpu_kernel_and_enabling_serves_both_import_styles():
    if not HAS_EXT:
        pytest.skip("this Paddle has no fused_rms_norm_ext")
    from paddle.incubate.nn.functional import fused_rms_norm_ext as imported_early

    x, w, g = tensors([3, 40], 40, "float32")
    with pytest.raises(RuntimeError, match="fused_rms_norm_ext"):
        F.fused_rms_norm_ext(x, w)
    paddle_ext.enable()
    assert {u: s for u, _, s, _ in paddle_ext.patch_table()}["fused_rms_norm"] == "applied"
    y1, inv1 = F.fused_rms_norm_ext(x, w, 1e-6)
    y2, inv2 = imported_early(x, w, 1e-6)
    y3, inv3 = ops.fused_rms_norm_ext(x, w, 1e-6)
    assert np.array_equal(y1.numpy(), y3.numpy()) and np.array_equal(y2.numpy(), y3.numpy())
    assert np.array_equal(inv1.numpy(), inv3.numpy())
    paddle.autograd.backward([y1], [g])
    ry, _, rdx, rdw = reference(as_f64(x), as_f64(w), as_f64(g), 1e-6, 40)
    assert rel(x.grad.numpy(), rdx) < 1e-6 and rel(w.grad.numpy(), rdw) < 1e-6
    # the explicit grad op PaddleFormers' fp8 / ERNIE code calls
    dx, dw = paddle._C_ops.fused_rms_norm_ext_grad(x.detach(), w.detach(), inv1, g, 1e-6)
    assert np.array_equal(dx.numpy(), x.grad.numpy()) and np.array_equal(dw.numpy(), w.grad.numpy())


# Paddle's own float32 CPU forward of fused_rms_norm, as the unit reads it: none (2.6.2),
# runs, or unrunnable (AVX-512F only, on a CPU without it: a call would stop the test
# process with SIGILL, so tests never make one then).
PADDLE_FLOAT32 = routes.paddle_float32_kernel(getattr(paddle._C_ops, QUANT_OP)) if HAS_QUANT else routes.NONE
PADDLE_FLOAT32_RUNS = PADDLE_FLOAT32 == routes.RUNS
NO_PADDLE_FLOAT32 = "this Paddle's float32 fused_rms_norm forward does not run on this CPU"

@pytest.fixture
def without_avx512f(monkeypatch):
    """The unit reads this CPU as one without AVX-512F, where Paddle's float32 kernel
    (RmsNormAvxKernel) would die of SIGILL: every float32 call is then the plugin's."""
    from paddle_ext import cpu_math

    monkeypatch.setattr(cpu_math, "has_avx512f", lambda: False)
    routes.paddle_float32_kernel.cache_clear()
    yield
    routes.paddle_float32_kernel.cache_clear()


CHILD_STOCK_CALL = """
import paddle
F = paddle.incubate.nn.functional
try:
    F.fused_rms_norm(paddle.ones([1, 2]), paddle.ones([2]), None, 1e-5, 1)
    print("ANSWERED")
except RuntimeError as err:
    print("REFUSED", str(err).splitlines()[0])
"""


@pytest.mark.skipif(not HAS_QUANT, reason="this Paddle has no fused_rms_norm_quant")
def test_the_units_reading_of_paddles_float32_kernel_is_what_a_stock_call_does():
    """In a child process without the plugin: Paddle's kernel answers where the unit
    reads RUNS, reports no kernel where NONE, and dies of SIGILL where UNRUNNABLE."""
    import signal
    import subprocess
    import sys

    child = subprocess.run([sys.executable, "-c", CHILD_STOCK_CALL], capture_output=True, text=True,
                           timeout=240)
    outcome = {routes.RUNS: (0, "ANSWERED"), routes.NONE: (0, "REFUSED"), routes.UNRUNNABLE: (-signal.SIGILL, "")}
    code, word = outcome[PADDLE_FLOAT32]
    assert child.returncode == code, (PADDLE_FLOAT32, child.returncode, child.stderr[-2000:])
    assert word in child.stdout
    if PADDLE_FLOAT32 == routes.NONE:
        assert "not registered" in child.stdout


def test_fused_rms_norm_float32_where_paddle_has_no_usable_cpu_kernel_runs_the_plugin():
    if not HAS_QUANT or PADDLE_FLOAT32_RUNS:
        pytest.skip("this Paddle computes fused_rms_norm's float32 forward on CPU")
    x, w, g = tensors([2, 3, 16], 48, "float32")
    if PADDLE_FLOAT32 == routes.NONE:
        with pytest.raises(RuntimeError, match="not registered"):
            F.fused_rms_norm(x, w, None, 1e-6, 1)
    paddle_ext.enable()
    out, _ = F.fused_rms_norm(x, w, None, 1e-6, 1)
    paddle.autograd.backward([out], [g])
    ry, _, rdx, rdw = reference(as_f64(x), as_f64(w), as_f64(g), 1e-6, 48)
    assert rel(out.numpy(), ry) < 1e-6 and rel(x.grad.numpy(), rdx) < 1e-6 and rel(w.grad.numpy(), rdw) < 1e-6


@pytest.mark.skipif(not HAS_QUANT, reason="this Paddle has no fused_rms_norm_quant")
def test_where_paddles_float32_kernel_cannot_run_the_plugin_never_hands_it_a_call(without_avx512f):
    """Calls the plugin refuses would reach Paddle's AVX-512 kernel: they raise a clear
    error instead of stopping the process; bias and residual are the plugin's too."""
    from paddle_ext.ops._checks import InvalidArgumentError

    x = paddle.to_tensor(np.random.default_rng(3).standard_normal([3, 8]).astype("float32"))
    w = paddle.ones([8])
    paddle_ext.enable()
    out, residual_out = F.fused_rms_norm(x, w, None, 1e-6, 1, residual=paddle.ones([3, 8]))
    assert np.array_equal(residual_out.numpy(), x.numpy() + np.float32(1))
    out, _ = F.fused_rms_norm(x, w, None, 1e-6, 1, bias=paddle.ones([8]))  # ignored without a residual
    assert rel(out.numpy(), reference(as_f64(x), as_f64(w), as_f64(x), 1e-6, 8)[0]) < 1e-6
    with pytest.raises(InvalidArgumentError, match="epsilon must be a finite number >= 0, got -0.001") as err:
        F.fused_rms_norm(x, w, None, -1e-3, 1)
    assert isinstance(err.value, ValueError) and isinstance(err.value, AssertionError)
    if PADDLE_FLOAT32 == routes.NONE:  # 2.6.2: no CPU kernel at all
        with pytest.raises(RuntimeError, match="not registered"):
            F.fused_rms_norm(x, w, None, 1e-6, 1, quant_scale=0.5)
    else:
        with pytest.raises(OSError, match="NOT supported quant int8"):  # Paddle refuses before its AVX-512 code
            F.fused_rms_norm(x, w, None, 1e-6, 1, quant_scale=0.5)
    out, _ = F.fused_rms_norm(x, w, None, 1e-6, 1)
    ry, _, _, _ = reference(as_f64(x), as_f64(w), as_f64(x), 1e-6, 8)
    assert rel(out.numpy(), ry) < 1e-6


def test_ext_in_a_dtype_the_kernel_lacks_keeps_paddles_error():
    if not HAS_EXT:
        pytest.skip("this Paddle has no fused_rms_norm_ext")
    x, w = paddle.ones([2, 4], "float64"), paddle.ones([4], "float64")
    with pytest.raises(RuntimeError) as stock:
        F.fused_rms_norm_ext(x, w)
    paddle_ext.enable()
    with pytest.raises(RuntimeError) as patched:
        F.fused_rms_norm_ext(x, w)
    assert str(patched.value) == str(stock.value)


def half_cast_rounds_to_nearest() -> bool:
    """Whether this Paddle's CPU float32 -> float16 cast rounds to nearest (3.3.1) rather than
    toward zero (2.6.2, 3.0.0): 1 + 1.5 ulp of float16 lies between two halves."""
    x = np.array([1.00146484375], dtype=np.float32)
    return paddle.to_tensor(x).astype("float16").numpy()[0] == np.float16(x[0])


def test_fused_rms_norm_float32_keeps_paddles_forward_bits_and_gains_a_backward():
    if not PADDLE_FLOAT32_RUNS:
        pytest.skip(NO_PADDLE_FLOAT32)
    x, w, g = tensors([2, 3, 16], 48, "float32")
    b = paddle.to_tensor(np.linspace(-1, 1, 48).astype("float32"))
    b.stop_gradient = False
    stock, _ = F.fused_rms_norm(x, w, b, 1e-6, 1)
    # 3.3 registers the op as fused_rms_norm_quant, 3.0 as rms_norm: neither has a CPU grad kernel
    with pytest.raises(RuntimeError, match="(fused_rms_norm_quant|rms_norm)_grad"):
        paddle.autograd.backward([stock], [g])
    x.clear_gradient()
    paddle_ext.enable()
    out, residual_out = F.fused_rms_norm(x, w, b, 1e-6, 1)
    assert np.array_equal(out.numpy(), stock.numpy())
    paddle.autograd.backward([out], [g])
    _, _, rdx, rdw = reference(as_f64(x), as_f64(w), as_f64(g), 1e-6, 48)
    assert rel(x.grad.numpy(), rdx) < 1e-6 and rel(w.grad.numpy(), rdw) < 1e-6
    assert rel(b.grad.numpy(), g.numpy().reshape(-1, 48).sum(axis=0)) < 1e-6
    with paddle.no_grad():  # no gradient wanted: Paddle's call as it is
        again, _ = F.fused_rms_norm(x, w, b, 1e-6, 1)
    assert np.array_equal(again.numpy(), stock.numpy())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fused_rms_norm_half_runs_the_plugin_where_paddle_has_no_kernel(dtype):
    if not HAS_QUANT:
        pytest.skip("this Paddle has no fused_rms_norm_quant")
    x, w, g = tensors([4, 32], 32, dtype)
    with pytest.raises(RuntimeError, match="not registered"):
        F.fused_rms_norm(x, w, None, 1e-6, 1)
    paddle_ext.enable()
    out, _ = F.fused_rms_norm(x, w, None, 1e-6, -1)
    paddle.autograd.backward([out], [g])
    ry, _, rdx, _ = reference(as_f64(x), as_f64(w), as_f64(g), 1e-6, 32)
    assert out.dtype == x.dtype and rel(as_f64(out), ry) < TOLERANCE[dtype]
    assert rel(as_f64(x.grad), rdx) < 4 * TOLERANCE[dtype]


def stock_outcome(call):
    try:
        out = call()
    except Exception as err:  # noqa: BLE001 - compared below
        return type(err), str(err).split("\n")[0]
    return "ok", out[0].numpy()


@pytest.mark.parametrize("case", ["residual", "bias", "quant", "bad_weight", "bad_axis"])
def test_uncovered_fused_rms_norm_calls_keep_paddles_answer(case):
    if not HAS_QUANT:
        pytest.skip("this Paddle has no fused_rms_norm_quant")
    if case in ("residual", "bias") and not PADDLE_FLOAT32_RUNS:
        pytest.skip("Paddle has no usable float32 kernel here: the plugin's (test_fused_bias_residual_...)")
    x = paddle.to_tensor(np.random.default_rng(1).standard_normal([3, 8]).astype("float32"))
    w = paddle.ones([8])
    args = {"residual": dict(residual=paddle.ones([3, 8])), "bias": dict(bias=paddle.ones([8])),
            "quant": dict(quant_scale=0.5), "bad_weight": {}, "bad_axis": {}}[case]
    weight = paddle.ones([4]) if case == "bad_weight" else w
    axis = 5 if case == "bad_axis" else 1

    def call():
        return F.fused_rms_norm(x, weight, None, 1e-6, axis, **args)

    stock = stock_outcome(call)
    paddle_ext.enable()
    patched = stock_outcome(call)
    assert stock[0] == patched[0]
    if stock[0] == "ok":
        assert np.array_equal(stock[1], patched[1])
    else:
        assert stock[1] == patched[1]


@pytest.mark.parametrize("epsilon", [-1e-3, float("nan")])
def test_epsilon_the_plugin_refuses_keeps_paddles_forward(epsilon):
    """Paddle's float32 CPU forward takes any epsilon; the plugin's backward refuses one
    < 0 or NaN, so such a call is Paddle's (its forward, no CPU backward), not refused."""
    if not PADDLE_FLOAT32_RUNS:
        pytest.skip(NO_PADDLE_FLOAT32)
    x = paddle.to_tensor(np.random.default_rng(2).standard_normal([3, 8]).astype("float32") + 2.0)
    x.stop_gradient = False
    w = paddle.ones([8])

    def call():
        return F.fused_rms_norm(x, w, None, epsilon, 1)

    stock = stock_outcome(call)
    paddle_ext.enable()
    patched = stock_outcome(call)
    assert stock[0] == patched[0] == "ok"
    np.testing.assert_array_equal(stock[1], patched[1])


def test_enable_disable_restores_paddles_ops():
    names = unit.present()
    assert names or not (HAS_EXT or HAS_QUANT)
    originals = {n: getattr(paddle._C_ops, n) for n in names}
    paddle_ext.enable()
    assert all(getattr(paddle._C_ops, n) is not f for n, f in originals.items())
    paddle_ext.enable({"paddle_ext": {"patches": {"fused_rms_norm": False}}})
    assert all(getattr(paddle._C_ops, n) is f for n, f in originals.items())
    paddle_ext.enable()
    paddle_ext.disable()
    assert all(getattr(paddle._C_ops, n) is f for n, f in originals.items())


# ----------------------- fused_rms_norm with bias / residual where Paddle's kernel cannot run

def fused_reference(x, w, nb, bias, residual, eps, cols):
    """float64 (out, residual_out) of Paddle's GPU kernel (rms_norm_kernel.cu): the bias is
    read only with a residual (ResidualAddBiasLoad), h = x + residual + bias, out = norm(h)
    * w (+ nb); residual_out = h (None without a residual)."""
    h = np.asarray(x, np.float64)
    if residual is not None:
        h = h + np.asarray(residual, np.float64)
        if bias is not None:
            h = (h.reshape(-1, cols) + np.asarray(bias, np.float64).reshape(cols)).reshape(h.shape)
    out, _, _, _ = reference(h, w, h, eps, cols)
    if nb is not None:
        out = (out.reshape(-1, cols) + np.asarray(nb, np.float64)).reshape(h.shape)
    return out, (h if residual is not None else None)


def fused_inputs(shape, cols, dtype="float32", seed=7):
    rng = np.random.default_rng(seed)
    make = lambda s: paddle.to_tensor(rng.standard_normal(s).astype("float32")).astype(dtype)  # noqa: E731
    w = paddle.to_tensor((rng.random(cols) + 0.5).astype("float32")).astype(dtype)
    return make(shape), w, make([cols]), make([cols]), make(shape)


FUSED_CASES = [("residual", False), ("bias", False), ("both", False), ("both", True), ("residual", True)]


@pytest.mark.skipif(not HAS_QUANT, reason="this Paddle has no fused_rms_norm_quant")
@pytest.mark.parametrize("shape, axis", [([4, 40], 1), ([2, 3, 16], 1), ([2, 3, 17], -1)])
@pytest.mark.parametrize("case, with_norm_bias", FUSED_CASES)
def test_fused_bias_residual_without_avx512f_follow_the_gpu_kernel(without_avx512f, shape, axis, case,
                                                                   with_norm_bias):
    cols = int(np.prod(shape[axis % len(shape):]))
    x, w, nb, bias, residual = fused_inputs(shape, cols)
    bias = bias if case in ("bias", "both") else None
    residual = residual if case in ("residual", "both") else None
    nb = nb if with_norm_bias else None
    before = [t.numpy().copy() for t in (x, bias, residual) if t is not None]
    paddle_ext.enable()
    # UNRUNNABLE, or NONE where Paddle has no float32 CPU kernel at all (2.6.2): the plugin's either way
    assert routes.paddle_float32_kernel(getattr(paddle._C_ops, QUANT_OP)) != routes.RUNS
    out, residual_out = F.fused_rms_norm(x, w, nb, 1e-6, axis, bias=bias, residual=residual)
    want, want_residual = fused_reference(as_f64(x), as_f64(w), None if nb is None else as_f64(nb),
                                          None if bias is None else as_f64(bias),
                                          None if residual is None else as_f64(residual), 1e-6, cols)
    assert out.dtype == x.dtype and list(out.shape) == shape
    assert rel(out.numpy(), want) < 1e-6
    if residual is None:
        assert not residual_out._is_initialized()  # as Paddle's kernels: not written without a residual
    else:
        assert rel(residual_out.numpy(), want_residual) < 1e-6
        # float32 rounding as the GPU kernel's: (x + residual) rounded, then + bias rounded
        h32 = x.numpy() + residual.numpy()
        if bias is not None:
            h32 = (h32.reshape(-1, cols) + bias.numpy()).reshape(shape)
        assert np.array_equal(residual_out.numpy(), h32)
    assert all(np.array_equal(b, t.numpy()) for b, t in zip(before, [t for t in (x, bias, residual) if t is not None]))


@pytest.mark.skipif(not PADDLE_FLOAT32_RUNS, reason=NO_PADDLE_FLOAT32)
@pytest.mark.parametrize("case, with_norm_bias", FUSED_CASES)
def test_fused_bias_residual_without_avx512f_agree_with_paddles_avx512_kernel(without_avx512f, case, with_norm_bias):
    """On a CPU that has AVX-512F, Paddle's own kernel answers these calls: its CPU and GPU
    kernels agree here, and so does the plugin's answer for a CPU without AVX-512F."""
    x, w, nb, bias, residual = fused_inputs([6, 72], 72, seed=11)
    bias = bias if case in ("bias", "both") else None
    residual = residual if case in ("residual", "both") else None
    nb = nb if with_norm_bias else None

    def call():
        return F.fused_rms_norm(x, w, nb, 1e-6, 1, bias=bias, residual=residual)

    stock_out, stock_residual = call()  # Paddle's AVX-512 kernel: the unit is not enabled yet
    paddle_ext.enable()
    out, residual_out = call()
    assert routes.paddle_float32_kernel(getattr(paddle._C_ops, QUANT_OP)) == routes.UNRUNNABLE
    assert rel(out.numpy(), stock_out.numpy()) < 1e-6
    if residual is not None:
        assert np.array_equal(residual_out.numpy(), stock_residual.numpy())
    else:
        assert not residual_out._is_initialized() and not stock_residual._is_initialized()


@pytest.mark.skipif(not HAS_QUANT, reason="this Paddle has no fused_rms_norm_quant")
@pytest.mark.parametrize("case", ["bias", "residual"])
def test_fused_bias_residual_without_avx512f_have_no_backward_as_on_the_gpu(without_avx512f, case):
    """Paddle's GPU grad kernel throws Unimplemented with a bias or residual (its CPU build
    has no grad kernel): the outputs want gradients, and the backward raises saying why."""
    x, w, _, bias, residual = fused_inputs([3, 8], 8)
    x.stop_gradient = False
    kwargs = {"bias": bias} if case == "bias" else {"residual": residual}
    paddle_ext.enable()
    out, residual_out = F.fused_rms_norm(x, w, None, 1e-6, 1, **kwargs)
    assert not out.stop_gradient
    with pytest.raises(OSError, match=r"NotImplementedError: fused_rms_norm has no backward with a bias or residual"):
        out.sum().backward()
    with paddle.no_grad():
        again, _ = F.fused_rms_norm(x, w, None, 1e-6, 1, **kwargs)
    assert again.stop_gradient and np.array_equal(again.numpy(), out.numpy())


@pytest.mark.skipif(not HAS_QUANT, reason="this Paddle has no fused_rms_norm_quant")
@pytest.mark.parametrize("kwargs, pattern", [
    (lambda: {"residual": paddle.ones([3, 5])}, r"residual must have x's shape \[3, 8\], got \[3, 5\]"),
    (lambda: {"residual": paddle.ones([1, 8])}, r"residual must have x's shape \[3, 8\], got \[1, 8\]"),
    (lambda: {"residual": paddle.ones([3, 8]), "bias": paddle.ones([5])}, r"bias must have 8 elements .*\[5\]"),
])
def test_fused_shapes_paddles_kernels_would_read_past_are_refused_without_avx512f(without_avx512f, kwargs, pattern):
    """Paddle's shape inference checks neither bias nor residual; both its kernels then read
    past their ends. Without AVX-512F the plugin answers instead, and refuses those."""
    from paddle_ext.ops._checks import InvalidArgumentError

    x = paddle.ones([3, 8])
    paddle_ext.enable()
    with pytest.raises(InvalidArgumentError, match=pattern):
        F.fused_rms_norm(x, paddle.ones([8]), None, 1e-6, 1, **kwargs())


@pytest.mark.skipif(not HAS_QUANT, reason="this Paddle has no fused_rms_norm_quant")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fused_bias_residual_half_run_the_plugin_where_paddle_has_no_kernel(dtype):
    x, w, nb, bias, residual = fused_inputs([4, 32], 32, dtype)
    with pytest.raises(RuntimeError, match="not registered"):
        F.fused_rms_norm(x, w, nb, 1e-6, 1, bias=bias, residual=residual)
    paddle_ext.enable()
    out, residual_out = F.fused_rms_norm(x, w, nb, 1e-6, 1, bias=bias, residual=residual)
    want, want_residual = fused_reference(as_f64(x), as_f64(w), as_f64(nb), as_f64(bias), as_f64(residual), 1e-6, 32)
    assert out.dtype == x.dtype and residual_out.dtype == x.dtype
    assert rel(as_f64(out), want) < 2 * TOLERANCE[dtype]
    assert rel(as_f64(residual_out), want_residual) < TOLERANCE[dtype]
    if dtype == "float16" and half_cast_rounds_to_nearest():
        # numpy's float16 adds round each sum to nearest, as the GPU's half adds; the CPU
        # float32 -> float16 cast of 2.6.2 and 3.0.0 truncates, so there the sums can be one
        # ulp lower
        h16 = (x.numpy() + residual.numpy()) + bias.numpy()
        assert np.array_equal(residual_out.numpy(), h16)


def test_ops_fused_rms_norm_with_residual_gives_gradients_to_every_input():
    """paddle_ext's own API differentiates the fused sum (an extension: Paddle's name keeps
    the GPU kernel's missing backward)."""
    x, w, nb, bias, residual = fused_inputs([5, 24], 24, seed=3)
    for t in (x, w, bias, residual):
        t.stop_gradient = False
    g = paddle.to_tensor(np.random.default_rng(4).standard_normal([5, 24]).astype("float32"))
    out, residual_out = ops.fused_rms_norm(x, w, None, 1e-6, 1, bias=bias, residual=residual)
    paddle.autograd.backward([out], [g])
    h = as_f64(x) + as_f64(residual) + as_f64(bias)
    ry, _, rdh, rdw = reference(h, as_f64(w), as_f64(g), 1e-6, 24)
    assert rel(out.numpy(), ry) < 1e-6 and rel(residual_out.numpy(), h) < 1e-6
    assert rel(x.grad.numpy(), rdh) < 1e-6 and rel(residual.grad.numpy(), rdh) < 1e-6
    assert rel(bias.grad.numpy(), rdh.sum(axis=0)) < 1e-6 and rel(w.grad.numpy(), rdw) < 1e-6
