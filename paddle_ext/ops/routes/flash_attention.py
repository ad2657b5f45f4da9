"""paddle.nn.functional.flash_attention's names answered by the plugin's kernels: the
wrappers the flash_attention patch unit installs (patches/flash_attention.py says which
call goes where and why). The wrappers of flash_attention and flash_attn_unpadded carry
`__paddle_ext_unit__ = "flash_attention"`: paddle_ext.ops.flash_attention._paddle_native
(and bench/flash_attn_cpu.py) unwrap them to reach Paddle's own function on a GPU build.
"""

from __future__ import annotations

import functools

from paddle_ext import devices
from paddle_ext.ops import flash_attention_packed as packed
from paddle_ext.ops._modes import in_dynamic_mode
from paddle_ext.ops.attention_scores import calc_reduced_attention_scores as plugin_reduced_scores
from paddle_ext.ops.flash_attention import flash_attention as plugin_flash_attention
from paddle_ext.ops.flash_attention import flash_attn_unpadded as plugin_flash_attn_unpadded
from paddle_ext.ops.flashmask import flashmask_attention as plugin_flashmask_attention
from paddle_ext.ops.routes import plugin_else_paddle

OPS = ("pe_flash_attn", "pe_flash_attn_varlen", "pe_flashmask_attn")


def _plugin_builds_static() -> bool:
    """Whether the plugin's ops serve Paddle's names: always in dynamic mode; in
    static graphs on CPU builds, where Paddle's flash attention ops have no kernel
    (GPU builds keep Paddle's ops in static programs: its kernels answer there)."""
    return in_dynamic_mode() or devices.device_build() == "cpu"


def _gpu_kernel_else_plugin(plugin_call, paddle_call):
    """For the names Paddle serves with GPU kernels only (flash_attn_unpadded, the
    varlen packed one, calc_reduced_attention_scores, flashmask_attention): in
    dynamic mode plugin_else_paddle (Paddle's GPU kernel may take what the plugin
    refuses); in a static program (here on CPU builds only) Paddle's op would have
    no kernel to run, so the plugin's error stands while the program is built."""
    if in_dynamic_mode():
        return plugin_else_paddle(plugin_call, paddle_call)
    return plugin_call()


def flash_attention(original):
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


def flash_attn_unpadded(original):
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


def flash_attn_qkvpacked(original):
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

    return flash_attn_qkvpacked


def flash_attn_varlen_qkvpacked(original):
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

    return flash_attn_varlen_qkvpacked


def calc_reduced_attention_scores(original):
    @functools.wraps(original)
    def calc_reduced_attention_scores(query, key, softmax_lse):
        if not _plugin_builds_static():
            return original(query, key, softmax_lse)
        return _gpu_kernel_else_plugin(lambda: plugin_reduced_scores(query, key, softmax_lse),
                                       lambda: original(query, key, softmax_lse))

    return calc_reduced_attention_scores


def flashmask_attention(original):
    @functools.wraps(original)
    def flashmask_attention(query, key, value, startend_row_indices=None, *, dropout=0.0, causal=False,
                            window_size=None, return_softmax_lse=False, return_seed_offset=False,
                            fixed_seed_offset=None, rng_name="", training=True, name=None, softmax_scale=None,
                            block_mask=None):
        on_cpu = "cpu" in str(getattr(query, "place", "cpu")).lower()
        plugin = on_cpu if in_dynamic_mode() else devices.device_build() == "cpu"
        kwargs = dict(dropout=dropout, causal=causal, window_size=window_size, return_softmax_lse=return_softmax_lse,
                      return_seed_offset=return_seed_offset, fixed_seed_offset=fixed_seed_offset, rng_name=rng_name,
                      training=training, name=name, softmax_scale=softmax_scale, block_mask=block_mask)

        def paddle_call():
            return original(query, key, value, startend_row_indices, **kwargs)

        if not plugin:
            return paddle_call()
        return _gpu_kernel_else_plugin(
            lambda: plugin_flashmask_attention(query, key, value, startend_row_indices, **kwargs), paddle_call)

    return flashmask_attention
