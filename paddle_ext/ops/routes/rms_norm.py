"""fused_rms_norm_ext, fused_rms_norm_ext_grad and fused_rms_norm (fused_rms_norm_quant on
3.x) of paddle._C_ops answered by the plugin's kernels for CPU tensors in dynamic mode:
the wrappers the fused_rms_norm patch unit installs (patches/fused_rms_norm.py says
which call goes where and why), the PyLayer of a fused call without backward, and the
probe of Paddle's own float32 CPU kernel.
"""

from __future__ import annotations

import functools

from paddle_ext import compat
from paddle_ext.ops import rms_norm as plugin
from paddle_ext.ops._checks import cpu_kernel_dtypes
from paddle_ext.ops._modes import in_dynamic_mode
from paddle_ext.ops.routes import plugin_else_paddle

OPS = ("pe_rms_norm", "pe_rms_norm_backward")


def _on_cpu(*tensors) -> bool:
    import paddle

    return in_dynamic_mode() and all(
        isinstance(t, paddle.Tensor) and t.place.is_cpu_place() for t in tensors if t is not None)


def _kernel_dtypes(*tensors) -> bool:
    """Whether the plugin's kernel takes these dtypes (others, float64 say, stay
    Paddle's, with Paddle's error)."""
    from paddle_ext.ops._checks import dtype_name

    return all(dtype_name(t) in plugin.FLOAT_DTYPES for t in tensors)


def ext(original):
    @functools.wraps(original)
    def fused_rms_norm_ext(x, scale, epsilon=1e-5, *args):
        if not args and _on_cpu(x, scale) and _kernel_dtypes(x, scale):
            return plugin.fused_rms_norm_ext(x, scale, epsilon)
        return original(x, scale, epsilon, *args)

    return fused_rms_norm_ext


def ext_grad(original):
    @functools.wraps(original)
    def fused_rms_norm_ext_grad(x, scale, invvar, y_grad, epsilon, *args):
        if not args and _on_cpu(x, scale, invvar, y_grad) and _kernel_dtypes(x, scale, y_grad):
            return plugin.rms_norm_grad(x, scale, y_grad, epsilon, inv_var=invvar)
        return original(x, scale, invvar, y_grad, epsilon, *args)

    return fused_rms_norm_ext_grad


def _plain_case(x, norm_weight, norm_bias, begin_norm_axis, quant_scale) -> bool:
    """Whether the plugin covers this fused_rms_norm call without bias or residual
    (else Paddle's own path)."""
    from paddle_ext.ops._checks import dtype_name

    if quant_scale > 0 or not _on_cpu(x, norm_weight, norm_bias):
        return False
    if not _kernel_dtypes(x) or not isinstance(begin_norm_axis, int):
        return False
    if not -x.ndim <= begin_norm_axis < x.ndim:  # negative as 3.3's Python function reads it (2.6's passes it on)
        return False
    cols = 1
    for d in x.shape[begin_norm_axis % x.ndim:]:
        cols *= int(d)
    return all(t is None or (dtype_name(t) == dtype_name(x) and list(t.shape) == [cols])
               for t in (norm_weight, norm_bias))


def quant(original):
    @functools.wraps(original)
    def fused_rms_norm_quant(x, bias, residual, norm_weight, norm_bias, epsilon, begin_norm_axis, quant_scale,
                             quant_round_type, quant_max_bound, quant_min_bound, *args):
        call = (x, bias, residual, norm_weight, norm_bias, epsilon, begin_norm_axis, quant_scale,
                quant_round_type, quant_max_bound, quant_min_bound, *args)
        from paddle_ext.ops._checks import dtype_name

        paddle_runs = dtype_name(x) == "float32" and paddle_float32_kernel(original) == RUNS
        crashes = dtype_name(x) == "float32" and _on_cpu(x) and paddle_float32_kernel(original) == UNRUNNABLE
        fused = bias is not None or residual is not None
        if fused and not args and quant_scale <= 0 and (crashes or (not paddle_runs and _kernel_dtypes(x)
                                                                and _on_cpu(x, bias, residual, norm_weight, norm_bias))):
            fused_call = functools.partial(_fused_without_backward, x, bias, residual, norm_weight, norm_bias,
                                           epsilon, begin_norm_axis)
            if crashes:  # a refusal is the plugin's to raise: Paddle's kernel cannot be asked here
                return fused_call()
            return plugin_else_paddle(fused_call, lambda: original(*call))
        if args or fused or not _plain_case(x, norm_weight, norm_bias, begin_norm_axis, quant_scale):
            return original(*call)
        if not paddle_runs:
            plugin_call = lambda: plugin.fused_rms_norm(x, norm_weight, norm_bias, epsilon, begin_norm_axis)  # noqa: E731
            if crashes:  # a refusal is the plugin's to raise: Paddle's kernel cannot be asked here
                return plugin_call()
            return plugin_else_paddle(plugin_call, lambda: original(*call))
        import paddle

        tensors = [t for t in (x, norm_weight, norm_bias) if t is not None]
        if not paddle.is_grad_enabled() or all(t.stop_gradient for t in tensors):
            return original(*call)
        outputs = []

        def paddle_forward():
            outputs.extend(original(*call))
            return outputs[0]

        def plugin_backward():
            out = plugin.paddle_forward_with_plugin_backward(paddle_forward, x, norm_weight, norm_bias, epsilon,
                                                             begin_norm_axis)
            return (out, *outputs[1:])

        # an epsilon the plugin's backward refuses (< 0, NaN): Paddle's forward, without a CPU backward
        return plugin_else_paddle(plugin_backward, lambda: original(*call))

    return fused_rms_norm_quant


def _fused_without_backward(x, bias, residual, norm_weight, norm_bias, epsilon, begin_norm_axis):
    """fused_rms_norm with a bias and / or residual, where Paddle's CPU kernel cannot
    answer (none registered, or AVX-512 code on a CPU without it): the plugin's forward,
    with the semantics of Paddle's GPU kernel (paddle_ext.ops.fused_rms_norm), and, as
    on the GPU, no backward: Paddle's GPU grad kernel (RmsNormGradKernel,
    paddle/phi/kernels/gpu/rms_norm_grad_kernel.cu) throws Unimplemented("bias or
    residual or norm_bias is not supported yet") when the backward runs, and its CPU
    build has no grad kernel at all. The outputs take part in autograd when an input
    wants a gradient, and the backward raises NotImplementedError naming the reason
    (Paddle reports an error raised in a PyLayer's backward as OSError, "(External)",
    with that text), rather than gradients no Paddle kernel gives."""
    import paddle

    def forward():
        return plugin.fused_rms_norm(x, norm_weight, norm_bias, epsilon, begin_norm_axis, bias, residual)

    inputs = [t for t in (x, bias, residual, norm_weight, norm_bias) if t is not None]
    if not paddle.is_grad_enabled() or all(t.stop_gradient for t in inputs):
        out, residual_out = forward()
        # as Paddle's outputs there (a custom op's output under no_grad would want a gradient)
        out.stop_gradient = residual_out.stop_gradient = True
        return out, residual_out
    if residual is not None:
        return tuple(_no_backward_layer().apply(forward, *inputs))
    # Without a residual, residual_out is an unwritten tensor, which 2.6's PyLayer
    # cannot return: it stays outside the layer.
    unwritten = []

    def out_only():
        out, residual_out = forward()
        unwritten.append(residual_out)
        return out

    out = _no_backward_layer().apply(out_only, *inputs)
    return out, unwritten[0]


_NO_BACKWARD = None


def _no_backward_layer():
    """The PyLayer class, made on first use."""
    global _NO_BACKWARD
    if _NO_BACKWARD is None:
        from paddle.autograd import PyLayer

        class FusedRmsNormWithoutBackward(PyLayer):
            @staticmethod
            def forward(ctx, forward, *inputs):
                return forward()

            @staticmethod
            def backward(ctx, *grads):
                raise NotImplementedError(
                    "fused_rms_norm has no backward with a bias or residual: Paddle's GPU grad kernel "
                    "(rms_norm_grad_kernel.cu) raises Unimplemented('bias or residual or norm_bias is not supported "
                    "yet') and its CPU build has none; paddle_ext.ops.fused_rms_norm gives these gradients")

        _NO_BACKWARD = FusedRmsNormWithoutBackward
    return _NO_BACKWARD


NONE, RUNS, UNRUNNABLE = "none", "runs", "unrunnable"


@functools.cache
def paddle_float32_kernel(original) -> str:
    """Paddle's own float32 CPU forward of fused_rms_norm: NONE (2.6.2 registers no CPU
    kernel; the plugin serves float32 too), RUNS (3.x on a CPU with AVX-512F: Paddle's
    values are kept), or UNRUNNABLE: registered, but written in AVX-512 intrinsics only
    (phi::fusion::RmsNormAvxKernel), so on a CPU without AVX-512F a call stops the process
    with SIGILL (paddle_ext.cpu_math.has_avx512f; measured with 3.3.1 on an AMD EPYC Zen 1):
    the plugin serves float32 and is never to hand a call to Paddle's kernel. Read from
    the kernel registry and the CPU's flags; asked by one call only where /proc/cpuinfo
    cannot tell."""
    import paddle

    from paddle_ext import cpu_math

    if "float32" not in cpu_kernel_dtypes(compat.fused_rms_norm_op_name() or ""):
        return NONE
    avx512f = cpu_math.has_avx512f()
    if avx512f is False:
        return UNRUNNABLE
    if avx512f is None:
        try:
            original(paddle.ones([1, 2]), None, None, paddle.ones([2]), None, 1e-5, 1, -1.0, 0, 0.0, 0.0)
        except Exception:  # noqa: BLE001 - any refusal means: no kernel here
            return NONE
    return RUNS
