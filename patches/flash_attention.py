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
attribute, a closure, a dict) keeps the object it holds.
"""

from __future__ import annotations

import functools
import importlib

from paddle_ext import compat
from paddle_ext.ops import _library
from paddle_ext.ops import flash_attention_packed as packed
from paddle_ext.ops.attention_scores import calc_reduced_attention_scores as plugin_reduced_scores
from paddle_ext.ops.flash_attention import flash_attention as plugin_flash_attention
from paddle_ext.ops.flash_attention import flash_attn_unpadded as plugin_flash_attn_unpadded
from paddle_ext.ops.flashmask import flashmask_attention as plugin_flashmask_attention
from paddle_ext.patches._unit import Patcher, PatchUnit, plugin_else_paddle

MODULE = "paddle.nn.functional.flash_attention"
NAMES = ("flash_attention", "flash_attn_unpadded")
# 3.x names, patched where the release defines them (2.6.2 has none).
PACKED_NAMES = ("flash_attn_qkvpacked", "flash_attn_varlen_qkvpacked", "calc_reduced_attention_scores",
                "flashmask_attention")
PACKAGE = "paddle.nn.functional"
OPS = ("pe_flash_attn", "pe_flash_attn_varlen", "pe_flashmask_attn")


def owner():
    return importlib.import_module(MODULE)


def _plugin_builds_static() -> bool:
    """Whether the plugin's ops serve Paddle's names: always in dynamic mode; in
    static graphs on CPU builds, where Paddle's flash attention ops have no kernel
    (GPU builds keep Paddle's ops in static programs: its kernels answer there)."""
    return compat.in_dynamic_mode() or compat.device_build() == "cpu"


def _gpu_kernel_else_plugin(plugin_call, paddle_call):
    """For the names Paddle serves with GPU kernels only (flash_attn_unpadded, the
    varlen packed one, calc_reduced_attention_scores, flashmask_attention): in
    dynamic mode plugin_else_paddle (Paddle's GPU kernel may take what the plugin
    refuses); in a static program (here on CPU builds only) Paddle's op would have
    no kernel to run, so the plugin's error stands while the program is built."""
    if compat.in_dynamic_mode():
        return plugin_else_paddle(plugin_call, paddle_call)
    return plugin_call()


def _flash_attention_3x(original):
    @functools.wraps(original)
    def flash_attention(query, key, value, dropout=0.0, causal=False, return_softmax=False, *,
                        fixed_seed_offset=None, rng_name="", training=True, name=None, softmax_scale=None):
        # Paddle's function: softmax_scale only when set, so that a release without
        # it (2.6) fails only for a call that uses it.
        extra = {} if softmax_scale is None else {"softmax_scale": softmax_scale}

        def paddle_call():
            return original(query, key, value, dropout, causal, return_softmax, fixed_seed_offset=fixed_seed_offset,
                            rng_name=rng_name, training=training, name=name, **extra)

        if not _plugin_builds_static():  # static graphs on GPU builds
            return paddle_call()
        return plugin_else_paddle(
            lambda: plugin_flash_attention(query, key, value, dropout, causal, return_softmax,
                                           fixed_seed_offset=fixed_seed_offset, rng_name=rng_name,
                                           training=training, name=name, softmax_scale=softmax_scale),
            paddle_call)

    flash_attention.__paddle_ext_unit__ = "flash_attention"
    return flash_attention


def _flash_attn_unpadded(original):
    @functools.wraps(original)
    def flash_attn_unpadded(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                            dropout=0.0, causal=False, return_softmax=False, fixed_seed_offset=None, rng_name="",
                            training=True, name=None):
        args = (query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, dropout,
                causal, return_softmax, fixed_seed_offset, rng_name, training, name)
        if not _plugin_builds_static():
            return original(*args)
        return _gpu_kernel_else_plugin(lambda: plugin_flash_attn_unpadded(*args), lambda: original(*args))

    flash_attn_unpadded.__paddle_ext_unit__ = "flash_attention"
    return flash_attn_unpadded


def _flash_attn_qkvpacked(original):
    @functools.wraps(original)
    def flash_attn_qkvpacked(qkv, dropout=0.0, causal=False, return_softmax=False, *, fixed_seed_offset=None,
                             rng_name="", training=True, name=None):
        def paddle_call():
            return original(qkv, dropout, causal, return_softmax, fixed_seed_offset=fixed_seed_offset,
                            rng_name=rng_name, training=training, name=name)

        if not _plugin_builds_static():  # GPU builds' static programs
            return paddle_call()
        return plugin_else_paddle(
            lambda: packed.flash_attn_qkvpacked(qkv, dropout, causal, return_softmax,
                                                fixed_seed_offset=fixed_seed_offset, rng_name=rng_name,
                                                training=training, name=name),
            paddle_call)

    flash_attn_qkvpacked.__paddle_ext_unit__ = "flash_attention"
    return flash_attn_qkvpacked


def _flash_attn_varlen_qkvpacked(original):
    @functools.wraps(original)
    def flash_attn_varlen_qkvpacked(qkv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                                    dropout=0.0, causal=False, return_softmax=False, fixed_seed_offset=None,
                                    rng_name="", varlen_padded=True, training=True, name=None):
        args = (qkv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, dropout, causal,
                return_softmax, fixed_seed_offset, rng_name, varlen_padded, training, name)
        if not _plugin_builds_static():
            return original(*args)
        return _gpu_kernel_else_plugin(lambda: packed.flash_attn_varlen_qkvpacked(*args),
                                       lambda: original(*args))

    flash_attn_varlen_qkvpacked.__paddle_ext_unit__ = "flash_attention"
    return flash_attn_varlen_qkvpacked


def _calc_reduced_attention_scores(original):
    @functools.wraps(original)
    def calc_reduced_attention_scores(query, key, softmax_lse):
        if not _plugin_builds_static():
            return original(query, key, softmax_lse)
        return _gpu_kernel_else_plugin(lambda: plugin_reduced_scores(query, key, softmax_lse),
                                       lambda: original(query, key, softmax_lse))

    calc_reduced_attention_scores.__paddle_ext_unit__ = "flash_attention"
    return calc_reduced_attention_scores


def _flashmask_attention(original):
    @functools.wraps(original)
    def flashmask_attention(query, key, value, startend_row_indices=None, *, dropout=0.0, causal=False,
                            window_size=None, return_softmax_lse=False, return_seed_offset=False,
                            fixed_seed_offset=None, rng_name="", training=True, name=None, softmax_scale=None,
                            block_mask=None):
        on_cpu = "cpu" in str(getattr(query, "place", "cpu")).lower()
        plugin = on_cpu if compat.in_dynamic_mode() else compat.device_build() == "cpu"
        kwargs = dict(dropout=dropout, causal=causal, window_size=window_size, return_softmax_lse=return_softmax_lse,
                      return_seed_offset=return_seed_offset, fixed_seed_offset=fixed_seed_offset, rng_name=rng_name,
                      training=training, name=name, softmax_scale=softmax_scale, block_mask=block_mask)

        def paddle_call():
            return original(query, key, value, startend_row_indices, **kwargs)

        if not plugin:
            return paddle_call()
        return _gpu_kernel_else_plugin(
            lambda: plugin_flashmask_attention(query, key, value, startend_row_indices, **kwargs), paddle_call)

    flashmask_attention.__paddle_ext_unit__ = "flash_attention"
    return flashmask_attention


_PACKED_WRAPPERS = {"flash_attn_qkvpacked": _flash_attn_qkvpacked,
                    "flash_attn_varlen_qkvpacked": _flash_attn_varlen_qkvpacked,
                    "calc_reduced_attention_scores": _calc_reduced_attention_scores,
                    "flashmask_attention": _flashmask_attention}


def packed_owners() -> list:
    """(module, name) for each of PACKED_NAMES this release defines: in the
    flash_attention module, and in paddle.nn.functional where it re-exports it."""
    module = owner()
    package = importlib.import_module(PACKAGE)
    found = []
    for name in PACKED_NAMES:
        if hasattr(module, name):
            found.append((module, name))
            if getattr(package, name, None) is getattr(module, name):
                found.append((package, name))
    return found


def _apply(patcher: Patcher) -> None:
    module = owner()
    # imported=True: names callers took before enable() too (module docstring)
    patcher.swap(module, "flash_attention", _flash_attention_3x(module.flash_attention), imported=True)
    patcher.swap(module, "flash_attn_unpadded", _flash_attn_unpadded(module.flash_attn_unpadded), imported=True)
    wrappers = {}  # one wrapper per name for both owners
    for target, name in packed_owners():
        if name not in wrappers:
            wrappers[name] = _PACKED_WRAPPERS[name](getattr(target, name))
        patcher.swap(target, name, wrappers[name], imported=True)


def _verify() -> bool:
    module = owner()
    targets = [(module, n) for n in NAMES] + packed_owners()
    return all(getattr(getattr(t, n), "__paddle_ext_unit__", None) == "flash_attention" for t, n in targets)


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
    summary=("flash_attention / flash_attn_unpadded / packed QKV run a tiled FA2 kernel on CPU, static "
             "graphs too (and 3.x's signature on 2.6.2)"),
    apply=_apply,
    verify=_verify,
    unavailable=_unavailable,
)
