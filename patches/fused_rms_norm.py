"""part-1 cherry from: migrate fused_rms_norm to paddle (#60848), which gave fused_rms_norm
its backward op (its review asked for a CPU version too), and Fix fused_rms_norm
bug (#73227), fused_rms_norm_ext for inputs of any rank and bfloat16.

paddle.incubate.nn.functional.fused_rms_norm_ext (PaddleFormers' RMSNorm with its
default fuse_rms_norm=True) has GPU and XPU kernels only: on CPU every call fails
with "The kernel fused_rms_norm_ext is not registered". On 3.3.1 fused_rms_norm has a
float32 CPU forward (fused_rms_norm_quant) but no backward there, and no
float16 / bfloat16 kernel; on 2.6.2 no CPU kernel at all. This unit serves, for CPU tensors in dynamic mode:

- fused_rms_norm_ext and fused_rms_norm_ext_grad: paddle_ext.ops' kernels
  (float32, float16, bfloat16; y in the weight's dtype, invvar float32 [rows],
  as on the GPU);
- fused_rms_norm without bias, residual or int8 quantisation: where Paddle has
  a float32 CPU forward (3.3.1) float32 keeps Paddle's forward values, bit for
  bit, with gradients from the plugin's backward kernel when an input needs
  them; float16 / bfloat16, and float32 where Paddle has no CPU kernel (2.6.2,
  whose fused_rms_norm calls _C_ops.rms_norm), run the plugin's kernels. Every
  other combination (quant_scale > 0, other dtypes, shapes Paddle refuses), and
  a call the plugin's checks refuse (an epsilon < 0 or NaN, which Paddle's
  float32 forward takes), goes to Paddle, which answers or raises as before;
- fused_rms_norm with a bias and / or residual: Paddle's answer where its CPU
  kernel runs (float32 with AVX-512F); elsewhere (float16 / bfloat16, 2.6.2) the
  plugin's forward with the GPU kernel's semantics (paddle_ext.ops.fused_rms_norm:
  the bias is read only with a residual, residual_out = (x + residual) + bias)
  and, as on the GPU, no backward (_fused_without_backward);
- except on a CPU without AVX-512F, where Paddle's float32 kernel (AVX-512 only)
  would stop the process with SIGILL: there the plugin serves float32 too, with
  or without bias / residual, and raises its own error for a call it refuses
  (paddle_float32_kernel).

The unit patches the functions in paddle._C_ops, which Paddle's Python
functions look up at each call, so callers that imported
`paddle.incubate.nn.functional.fused_rms_norm_ext` before enable() (as
paddleformers.nn.norm does) reach it too. GPU tensors, static graphs and
releases without these ops keep Paddle's path.
"""

from __future__ import annotations

import functools

from paddle_ext import compat
from paddle_ext.ops import _library
from paddle_ext.ops import rms_norm as plugin
from paddle_ext.patches._unit import Patcher, PatchUnit, plugin_else_paddle

MARK = "fused_rms_norm"
OPS = ("pe_rms_norm", "pe_rms_norm_backward")


def _on_cpu(*tensors) -> bool:
    import paddle

    return compat.in_dynamic_mode() and all(
        isinstance(t, paddle.Tensor) and t.place.is_cpu_place() for t in tensors if t is not None)


def _kernel_dtypes(*tensors) -> bool:
    """Whether the plugin's kernel takes these dtypes (others, float64 say, stay
    Paddle's, with Paddle's error)."""
    from paddle_ext.ops._checks import dtype_name

    return all(dtype_name(t) in plugin.FLOAT_DTYPES for t in tensors)


def _ext(original):
    @functools.wraps(original)
    def fused_rms_norm_ext(x, scale, epsilon=1e-5, *args):
        if not args and _on_cpu(x, scale) and _kernel_dtypes(x, scale):
            return plugin.fused_rms_norm_ext(x, scale, epsilon)
        return original(x, scale, epsilon, *args)

    return fused_rms_norm_ext


def _ext_grad(original):
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


def _quant(original):
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

    if "float32" not in compat.cpu_kernel_dtypes(compat.fused_rms_norm_op_name() or ""):
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


def owner():
    import paddle

    return paddle._C_ops


def wrappers() -> dict:
    """{name in paddle._C_ops: wrapper factory} for the ops this Paddle has
    (2.6 has no fused_rms_norm_ext; its fused_rms_norm calls rms_norm)."""
    targets = {"fused_rms_norm_ext": _ext, "fused_rms_norm_ext_grad": _ext_grad}
    quant = compat.fused_rms_norm_op_name()
    if quant is not None:
        targets[quant] = _quant
    module = owner()
    return {name: factory for name, factory in targets.items() if hasattr(module, name)}


def present() -> list[str]:
    return list(wrappers())


def _apply(patcher: Patcher) -> None:
    module = owner()
    for name, factory in wrappers().items():
        wrapper = factory(getattr(module, name))
        wrapper.__paddle_ext_unit__ = MARK
        patcher.swap(module, name, wrapper)


def _verify() -> bool:
    module = owner()
    return all(getattr(getattr(module, n), "__paddle_ext_unit__", None) == MARK for n in present())


def _unavailable() -> str | None:
    if not present():
        return "this Paddle has no fused_rms_norm_ext / fused_rms_norm_quant ops"
    return _library.unavailable(OPS)


UNIT = PatchUnit(
    name="fused_rms_norm",
    upstream=(60848, 73227),
    title="fused_rms_norm_ext and fused_rms_norm backward on CPU",
    summary="fused_rms_norm_ext runs a threaded one-pass CPU kernel; fused_rms_norm gets a CPU backward",
    apply=_apply,
    verify=_verify,
    unavailable=_unavailable,
)
