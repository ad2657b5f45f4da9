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
releases without these ops keep Paddle's path. The wrappers and the probe of Paddle's
float32 kernel live in paddle_ext.ops.routes.rms_norm.
"""

from __future__ import annotations

from paddle_ext import compat
from paddle_ext.ops.routes import rms_norm as routes
from paddle_ext.patches._unit import Patcher, PatchUnit, Wrap, install


def owner():
    import paddle

    return paddle._C_ops


def table() -> list[Wrap]:
    """The ops of paddle._C_ops the unit wraps, where this Paddle has them (2.6 has no
    fused_rms_norm_ext; its fused_rms_norm calls rms_norm)."""
    rows = [Wrap(owner, "fused_rms_norm_ext", routes.ext, optional=True),
            Wrap(owner, "fused_rms_norm_ext_grad", routes.ext_grad, optional=True)]
    quant = compat.fused_rms_norm_op_name()
    if quant is not None:
        rows.append(Wrap(owner, quant, routes.quant, optional=True))
    return rows


def present() -> list[str]:
    """The names of table() this Paddle has."""
    module = owner()
    return [row.attr for row in table() if hasattr(module, row.attr)]


def _apply(patcher: Patcher) -> None:
    install(patcher, table())


def _requires() -> str | None:
    return None if present() else "this Paddle has no fused_rms_norm_ext / fused_rms_norm_quant ops"


UNIT = PatchUnit(
    name="fused_rms_norm",
    upstream=(60848, 73227),
    title="fused_rms_norm_ext and fused_rms_norm backward on CPU",
    summary="fused_rms_norm_ext runs a threaded one-pass CPU kernel; fused_rms_norm gets a CPU backward",
    apply=_apply,
    requires=_requires,
    requires_ops=routes.OPS,
)
