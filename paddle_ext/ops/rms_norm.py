"""RMS normalisation on CPU, with the semantics of Paddle 3.3.1's GPU kernels:
fused_rms_norm_ext (what PaddleFormers calls with its default fuse_rms_norm=True)
and the plain case of fused_rms_norm. Stock Paddle has no CPU kernel for
fused_rms_norm_ext in any release, and only a float32 forward (no backward) for
fused_rms_norm.

For each row r of x (everything before the normalised trailing elements):

    inv_var[r] = 1 / sqrt(mean(x[r] ** 2) + epsilon)
    y[r]       = weight * inv_var[r] * x[r]

computed in float32 for float32, float16 and bfloat16 data, in one threaded
pass over the rows (op pe_rms_norm; its grad op gives x and weight their
gradients in one more pass). y takes the weight's dtype, as on the GPU.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from paddle_ext.ops import _library
from paddle_ext.ops._checks import (
    ArgumentTypeError,
    InvalidArgumentError,
    dtype_name,
    require_dtype,
    require_same_dtype,
    require_tensor,
    same_place,
)

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def fused_rms_norm_ext(x: Any, scale: Any, epsilon: float = 1e-5, name: str | None = None) -> tuple[Any, Any]:
    """RMS-normalises the last dimension of x and scales it.

    Args:
        x: [..., cols] float32, float16 or bfloat16 CPU tensor (cols > 0).
        scale: [cols], float32, float16 or bfloat16, on x's device.
        epsilon: added to the mean square (finite, >= 0).
        name: unused (Paddle's signature).

    Returns:
        (y, invvar): y of x's shape in scale's dtype; invvar float32 [rows]
        (rows = x.numel() / cols), no gradient. Gradients reach x and scale.
    """
    del name
    _check_inputs(x, "scale", scale)
    eps = _check_epsilon(epsilon)
    if x.ndim == 0:
        raise InvalidArgumentError(f"x must have at least 1 dimension, got shape {list(x.shape)}")
    cols = int(x.shape[-1])
    if scale.ndim != 1 or int(scale.shape[0]) != cols:
        raise InvalidArgumentError(f"scale must be 1-D [cols] with cols = {cols} (x's last dimension), got shape "
                         f"{list(scale.shape)}")
    return _normalise(x, scale, cols, eps)


def fused_rms_norm(x: Any, norm_weight: Any, norm_bias: Any, epsilon: float, begin_norm_axis: int = 1,
                   bias: Any = None, residual: Any = None, quant_scale: float = -1, quant_round_type: int = 0,
                   quant_max_bound: float = 0, quant_min_bound: float = 0) -> tuple[Any, Any]:
    """Paddle's fused_rms_norm without int8 quantisation (quant_scale > 0 raises
    ValueError naming it), with the semantics of Paddle's GPU kernel (RmsNormKernel,
    paddle/phi/kernels/gpu/rms_norm_kernel.cu at 02a5e4e0, registered as
    fused_rms_norm_quant on 3.3; its AVX-512 CPU kernel, RmsNormAvxKernel in
    paddle/phi/kernels/fusion/cpu/fused_rms_norm_quant_avx_kernel.cc, agrees):

    - no residual: out = norm(x) * norm_weight (+ norm_bias); a bias is ignored, as
      both kernels ignore it without a residual (the residual branch is the only one
      that reads it);
    - a residual: h = (x + residual) + bias, each add rounded to x's dtype
      (ResidualAddBiasLoad adds in the data type, left to right);
      residual_out = h and out = norm(h) * norm_weight (+ norm_bias).

    Args:
        x: float32, float16 or bfloat16 CPU tensor; the dimensions from
            begin_norm_axis on are normalised together (cols elements).
        norm_weight: [cols], x's dtype. norm_bias: None or [cols], x's dtype,
            added after the scaling.
        epsilon: added to the mean square (finite, >= 0).
        begin_norm_axis: in [-x.ndim, x.ndim).
        bias: None, or (read only with a residual) cols elements of x's dtype.
        residual: None, or x's shape and dtype.

    Returns:
        (out, residual_out): out of x's shape and dtype; residual_out h with a
        residual, else an uninitialised tensor, as Paddle returns. Gradients reach
        every input here (paddle_ext's own API; through Paddle's name the patch
        unit keeps the GPU kernel's lack of a backward with bias or residual).
    """
    import paddle

    del quant_round_type, quant_max_bound, quant_min_bound
    if quant_scale > 0:
        raise InvalidArgumentError(f"quant_scale must be <= 0 (no int8 output), got {quant_scale!r}")
    _check_inputs(x, "norm_weight", norm_weight)
    eps = _check_epsilon(epsilon)
    cols = _normalised_size(x, begin_norm_axis)
    for arg, t in (("norm_weight", norm_weight), ("norm_bias", norm_bias)):
        if t is None:
            continue
        require_tensor(arg, t)
        require_same_dtype(arg, t, "x", x)
        if t.ndim != 1 or int(t.shape[0]) != cols:
            raise InvalidArgumentError(f"{arg} must be 1-D [{cols}] (the size of x's dimensions from begin_norm_axis="
                             f"{begin_norm_axis} on), got shape {list(t.shape)}")
    residual_out = paddle.Tensor()
    if residual is not None:
        x = residual_out = _residual_sum(x, residual, bias, cols)
    if norm_bias is None:
        out, _ = _normalise(x, norm_weight, cols, eps)
    else:
        # As Paddle's kernel: the bias added in float32, one rounding to x's dtype
        # (Paddle's CPU build has no float16 / bfloat16 add either).
        out, _ = _normalise(x, norm_weight.astype("float32"), cols, eps)
        out = (out.reshape([-1, cols]) + norm_bias.astype("float32")).astype(x.dtype).reshape(x.shape)
    return out, residual_out


def _residual_sum(x, residual, bias, cols):
    """(x + residual) + bias in x's dtype, one rounding per add, as the GPU kernel's
    ResidualAddBiasLoad (rms_norm_kernel.cu) sums them. Half-precision adds go through
    float32 (Paddle's CPU build has no float16 / bfloat16 add): 24 bits >= 2 * 11 + 2,
    so each rounded float32 sum rounds to the correctly rounded half sum (where the
    cast rounds to nearest: the CPU float32 -> float16 cast of 2.6.2 and 3.0.0 truncates). New
    tensors: nothing the caller passed is written."""
    for arg, t in (("residual", residual), ("bias", bias)):
        if t is None:
            continue
        require_tensor(arg, t)
        require_same_dtype(arg, t, "x", x)
        if not same_place(t, x):
            raise InvalidArgumentError(f"{arg} must be on x's device {x.place}, got {t.place}")
    if list(residual.shape) != list(x.shape):
        raise InvalidArgumentError(f"residual must have x's shape {list(x.shape)}, got {list(residual.shape)}")
    if bias is not None and int(np.prod(bias.shape)) != cols:
        raise InvalidArgumentError(f"bias must have {cols} elements (the size of x's normalised dimensions), got "
                                   f"shape {list(bias.shape)}")

    def add(a, b):
        if dtype_name(x) == "float32":
            return a + b
        return (a.astype("float32") + b.astype("float32")).astype(x.dtype)

    h = add(x, residual)
    if bias is not None:
        h = add(h.reshape([-1, cols]), bias.reshape([cols])).reshape(x.shape)
    return h


def paddle_forward_with_plugin_backward(forward: Any, x: Any, norm_weight: Any, norm_bias: Any, epsilon: float,
                                        begin_norm_axis: int) -> Any:
    """forward() (Paddle's own fused_rms_norm output for these arguments, which
    it computes on CPU but cannot differentiate there) with gradients for x,
    norm_weight and norm_bias from the plugin's backward kernel: the values
    stay Paddle's, bit for bit."""
    cols = _normalised_size(x, begin_norm_axis)
    eps = _check_epsilon(epsilon)
    tensors = [x, norm_weight] + ([norm_bias] if norm_bias is not None else [])
    return _paddle_forward_layer().apply(forward, eps, cols, *tensors)


def _normalised_size(x, begin_norm_axis):
    if isinstance(begin_norm_axis, bool) or not isinstance(begin_norm_axis, (int, np.integer)):
        raise ArgumentTypeError(f"begin_norm_axis must be an int, got {type(begin_norm_axis).__name__} {begin_norm_axis!r}")
    axis = int(begin_norm_axis)
    if not -x.ndim <= axis < x.ndim:
        raise InvalidArgumentError(f"begin_norm_axis must be in [{-x.ndim}, {x.ndim}) for x of shape {list(x.shape)}, "
                         f"got {begin_norm_axis}")
    return int(np.prod(x.shape[axis % x.ndim:]))


_LAYER = None


def _paddle_forward_layer():
    """The PyLayer class, made on first use (importing paddle_ext.ops imports no Paddle)."""
    global _LAYER
    if _LAYER is None:
        from paddle.autograd import PyLayer

        class PaddleForwardPluginBackward(PyLayer):
            @staticmethod
            def forward(ctx, forward, eps, cols, *tensors):
                ctx.eps, ctx.cols = eps, cols
                # PyLayer wants None for the inputs that take no gradient.
                ctx.wanted = [not t.stop_gradient for t in tensors]
                ctx.save_for_backward(*tensors[:2])
                return forward()

            @staticmethod
            def backward(ctx, out_grad):
                x, weight = ctx.saved_tensor()
                grads = list(rms_norm_grad(x, weight, out_grad, ctx.eps))
                if len(ctx.wanted) == 3:
                    grads.append(out_grad.reshape([-1, ctx.cols]).sum(axis=0) if ctx.wanted[2] else None)
                return tuple(g if wanted else None for g, wanted in zip(grads, ctx.wanted))

        _LAYER = PaddleForwardPluginBackward
    return _LAYER


def rms_norm_grad(x: Any, weight: Any, y_grad: Any, epsilon: float, inv_var: Any = None) -> tuple[Any, Any]:
    """(x_grad, weight_grad) of y = weight * x / sqrt(mean(x ** 2) + epsilon) over
    the trailing weight.numel() elements of x, for a forward computed elsewhere;
    inv_var (float32 [rows]) is recomputed from x when not given."""
    _check_inputs(x, "weight", weight)
    require_tensor("y_grad", y_grad)
    eps = _check_epsilon(epsilon)
    if list(y_grad.shape) != list(x.shape) or dtype_name(y_grad) != dtype_name(weight):
        raise InvalidArgumentError(f"y_grad must have x's shape {list(x.shape)} and weight's dtype {dtype_name(weight)}, "
                         f"got shape {list(y_grad.shape)} and dtype {dtype_name(y_grad)}")
    import paddle

    if x.size == 0:
        return paddle.zeros_like(x), paddle.zeros_like(weight)
    x_grad, weight_grad = _library.run("pe_rms_norm_backward", _contiguous(x), _contiguous(weight), inv_var,
                                       _contiguous(y_grad), eps)
    return x_grad, weight_grad


def _normalise(x, weight, cols, eps):
    import paddle

    if cols == 0:
        raise InvalidArgumentError(f"x's normalised size must be > 0, got shape {list(x.shape)}")
    rows = int(np.prod(x.shape)) // cols
    if rows == 0:  # nothing to normalise (and 2.6's custom-op runner refuses empty outputs)
        y = paddle.zeros(x.shape, dtype=weight.dtype)
        inv_var = paddle.zeros([0], dtype="float32")
    else:
        y, inv_var = _library.run("pe_rms_norm", _contiguous(x), _contiguous(weight), eps)
    inv_var.stop_gradient = True
    return y, inv_var


def _check_inputs(x, weight_name, weight):
    require_tensor("x", x)
    require_dtype("x", x, FLOAT_DTYPES)
    require_tensor(weight_name, weight)
    require_dtype(weight_name, weight, FLOAT_DTYPES)
    if not x.place.is_cpu_place():
        raise InvalidArgumentError(f"x must be a CPU tensor, got one on {x.place}: paddle_ext's RMSNorm kernel is CPU-only "
                         "(Paddle's own fused_rms_norm_ext serves GPU tensors)")
    if str(weight.place) != str(x.place):
        raise InvalidArgumentError(f"{weight_name} must be on x's device {x.place}, got {weight.place}")


def _check_epsilon(value):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentTypeError(f"epsilon must be a number, got {type(value).__name__} {value!r}")
    eps = float(value)
    if not (math.isfinite(eps) and eps >= 0):
        raise InvalidArgumentError(f"epsilon must be a finite number >= 0, got {value!r}")
    return eps


def _contiguous(t):
    return t if t.is_contiguous() else t.contiguous()
