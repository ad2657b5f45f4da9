"""part-1 cherry from: FlashAttention-2 integration (#55758) and its follow-up
(#56015), with flash randomness control (#52902).

Upstream's flash attention runs on GPUs only: on CPU, Paddle's
paddle.nn.functional.flash_attention.flash_attention falls back to the plain
S x S math path (one thread by default, quadratic memory; it ignores
softmax_scale, fixed_seed_offset and rng_name; on 2.6.2 causal=True fails
there, its fused causal softmax being GPU-only), flash_attn_unpadded has no
CPU kernel at all, and 2.6.2's flash_attention lacks 3.x's softmax_scale.
This unit points both names of that module at paddle_ext.ops.flash_attention
(tiled CPU kernel, CUDA / HIP kernels, Paddle's native GPU kernel where it
takes the call; 3.3.1's signatures, GPU semantics: return_softmax gives the
probabilities with dropped entries negated), and 3.x's packed-QKV names
flash_attn_qkvpacked / flash_attn_varlen_qkvpacked (module and
paddle.nn.functional; no CPU kernel in Paddle) at
paddle_ext.ops.flash_attention_packed and calc_reduced_attention_scores at
paddle_ext.ops.attention_scores, and flashmask_attention (on CPU tensors:
paddle_ext.ops.flashmask; GPU tensors keep Paddle's kernel), where the
release has them. On CPU builds
static graphs (paddle.static, to_static) get the plugin's custom ops as well:
Paddle's flash_attn / flash_attn_unpadded / packed ops have no CPU kernel;
GPU builds keep Paddle's ops in static programs.

A call the plugin refuses goes to Paddle's own function unchanged, and its
answer is the call's (the plugin's error is raised only when Paddle refuses
the call too): enabling the plugin refuses nothing Paddle accepts. On CPU that
is Paddle's math path for what the plugin's kernel does not take (float64 and
integer dtypes: the kernel computes in float32 at most; key / value batches
that broadcast against query's, a value head_dim other than query's, head_dim
0, 5-D inputs), for dropout=1.0, for an rng_name no generator is registered
under and a fixed_seed_offset that is not int64 [2] (the math path ignores
both) and for non-bool flags (causal=1). Paddle's GPU kernels refuse most of
these (FA2 takes float16 / bfloat16 only), so there the plugin's error stands.
softmax_scale is the exception the other way: Paddle's CPU math path ignores
it and its GPU FA2 refuses it (AssertionError); the plugin honours it, as FA3
does.

Code that imported the functions before enable() (`from
paddle.nn.functional.flash_attention import flashmask_attention`, as
PaddleFormers' attention interface does when it is imported) reaches the plugin
too: the unit rebinds every loaded module's global bound to Paddle's function
(Patcher.swap(imported=True); disable() binds Paddle's back, also where a module
imported the plugin's meanwhile). Paddle's own flashmask_attention cannot be
reached through paddle._C_ops as rotary's is: on a CPU build it fails before its
op, reading FLAGS_cudnn_deterministic. A function held elsewhere (a class
attribute, a closure, a dict) keeps the object it holds. The wrappers live in
paddle_ext.ops.routes.flash_attention; the unit is their table.
"""

from __future__ import annotations

import importlib

from paddle_ext.ops.routes import flash_attention as routes
from paddle_ext.patches._unit import Patcher, PatchUnit, Wrap, install

MODULE = "paddle.nn.functional.flash_attention"
NAMES = ("flash_attention", "flash_attn_unpadded")

# imported=True everywhere: names callers took before enable() too (module docstring),
# paddle.nn.functional's re-exports of the 3.x names included.
TABLE = (
    Wrap(MODULE, "flash_attention", routes.flash_attention, imported=True),
    Wrap(MODULE, "flash_attn_unpadded", routes.flash_attn_unpadded, imported=True),
    # 3.x names, wrapped where the release defines them (2.6.2 has none)
    Wrap(MODULE, "flash_attn_qkvpacked", routes.flash_attn_qkvpacked, imported=True, optional=True),
    Wrap(MODULE, "flash_attn_varlen_qkvpacked", routes.flash_attn_varlen_qkvpacked, imported=True, optional=True),
    Wrap(MODULE, "calc_reduced_attention_scores", routes.calc_reduced_attention_scores, imported=True,
         optional=True),
    Wrap(MODULE, "flashmask_attention", routes.flashmask_attention, imported=True, optional=True),
)


def owner():
    return importlib.import_module(MODULE)


def _apply(patcher: Patcher) -> None:
    install(patcher, TABLE)


def _requires() -> str | None:
    try:
        module = owner()
    except ImportError as err:
        return f"this Paddle has no {MODULE} ({err})"
    missing = [n for n in NAMES if not hasattr(module, n)]
    return f"{MODULE} has no {', '.join(missing)}" if missing else None


UNIT = PatchUnit(
    name="flash_attention",
    upstream=(55758, 56015, 52902),
    title="FlashAttention-2 integration and flash randomness control",
    summary=("flash_attention / flash_attn_unpadded / packed QKV run a tiled FA2 kernel on CPU, static "
             "graphs too (and 3.x's signature on 2.6.2)"),
    apply=_apply,
    requires=_requires,
    requires_ops=routes.OPS,
)
