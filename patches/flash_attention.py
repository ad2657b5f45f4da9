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
probabilities with dropped entries negated) in dynamic mode; static-graph
programs keep Paddle's own functions.

Code that imported the functions before enable() (`from
paddle.nn.functional.flash_attention import flash_attention`) keeps the object
it imported.
"""

from __future__ import annotations

import functools
import importlib

from paddle_ext import compat
from paddle_ext.ops import _library
from paddle_ext.ops.flash_attention import flash_attention as plugin_flash_attention
from paddle_ext.ops.flash_attention import flash_attn_unpadded as plugin_flash_attn_unpadded
from paddle_ext.patches._unit import Patcher, PatchUnit

MODULE = "paddle.nn.functional.flash_attention"
NAMES = ("flash_attention", "flash_attn_unpadded")
OPS = ("pe_flash_attn", "pe_flash_attn_varlen")


def owner():
    return importlib.import_module(MODULE)


def _flash_attention_3x(original):
    @functools.wraps(original)
    def flash_attention(query, key, value, dropout=0.0, causal=False, return_softmax=False, *,
                        fixed_seed_offset=None, rng_name="", training=True, name=None, softmax_scale=None):
        if compat.in_dynamic_mode():
            return plugin_flash_attention(query, key, value, dropout, causal, return_softmax,
                                          fixed_seed_offset=fixed_seed_offset, rng_name=rng_name,
                                          training=training, name=name, softmax_scale=softmax_scale)
        # Static graphs: Paddle's function; softmax_scale only when set, so that
        # a release without it (2.6) fails only for a program that uses it.
        extra = {} if softmax_scale is None else {"softmax_scale": softmax_scale}
        return original(query, key, value, dropout, causal, return_softmax, fixed_seed_offset=fixed_seed_offset,
                        rng_name=rng_name, training=training, name=name, **extra)

    flash_attention.__paddle_ext_unit__ = "flash_attention"
    return flash_attention


def _flash_attn_unpadded(original):
    @functools.wraps(original)
    def flash_attn_unpadded(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                            dropout=0.0, causal=False, return_softmax=False, fixed_seed_offset=None, rng_name="",
                            training=True, name=None):
        fn = plugin_flash_attn_unpadded if compat.in_dynamic_mode() else original
        return fn(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, dropout,
                  causal, return_softmax, fixed_seed_offset, rng_name, training, name)

    flash_attn_unpadded.__paddle_ext_unit__ = "flash_attention"
    return flash_attn_unpadded


def _apply(patcher: Patcher) -> None:
    module = owner()
    patcher.swap(module, "flash_attention", _flash_attention_3x(module.flash_attention))
    patcher.swap(module, "flash_attn_unpadded", _flash_attn_unpadded(module.flash_attn_unpadded))


def _verify() -> bool:
    module = owner()
    return all(getattr(getattr(module, n), "__paddle_ext_unit__", None) == "flash_attention" for n in NAMES)


def _unavailable() -> str | None:
    try:
        module = owner()
    except ImportError as err:
        return f"this Paddle has no {MODULE} ({err})"
    missing = [n for n in NAMES if not hasattr(module, n)]
    if missing:
        return f"{MODULE} has no {', '.join(missing)}"
    return _library.unavailable(OPS)


UNIT = PatchUnit(
    name="flash_attention",
    upstream=(55758, 56015, 52902),
    title="FlashAttention-2 integration and flash randomness control",
    summary="flash_attention / flash_attn_unpadded run a tiled FA2 kernel on CPU (and 3.x's signature on 2.6.2)",
    apply=_apply,
    verify=_verify,
    unavailable=_unavailable,
)
