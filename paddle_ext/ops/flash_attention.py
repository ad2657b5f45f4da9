"""FlashAttention-2 (upstream #55758, #56015) with flash randomness control (#52902).

Paddle 3.3.1's API, on every device: `flash_attention` ([batch, seqlen, heads,
head_dim]) and `flash_attn_unpadded` ([total_tokens, heads, head_dim] with
int32 cumulative sequence lengths), plus what Paddle's FlashAttention-2 lacks:

- grouped-query and multi-query attention: key / value may have fewer heads
  than query, as long as they divide query's heads (query head h reads kv head
  h // (heads_q // heads_k));
- a choice of causal alignment when seqlen_q != seqlen_k: causal_alignment=
  "top_left" (the default, Paddle's: its FlashAttention-2 fork and its CPU
  math path; query i sees keys j <= i) or "bottom_right" (flash-attention >=
  2.1, PyTorch: query i sees keys j <= i + seqlen_k - seqlen_q; a query that
  sees no key gives zeros). Through Paddle's names it is always top-left;
- any head_dim on CPU (a multiple of 8 runs the kernel directly, any other on
  zero-padded copies); up to 256 on GPU;
- the per-row log-sum-exp (`return_softmax_lse=True`) and the dropout seed and
  offset the call used (`return_seed_offset=True`), which replays the same
  mask when passed back as fixed_seed_offset.

CPU: a tiled kernel with an online softmax (paddle_ext's own, see
csrc/ops/cpu/flash_attn_cpu.cc); memory is linear in the sequence length, and
the backward pass recomputes the probabilities from the saved log-sum-exp.
float16 / bfloat16 inputs are computed in float32. Threads: the kernel uses
paddle_ext.ops.set_num_threads(n) threads, by default the PADDLE_EXT_NUM_THREADS
environment variable, else every core; Paddle's own
paddle.base.core.set_num_threads (which its CPU math path follows, one thread
by default) does not change it. The threads themselves are those of the OpenMP
runtime Paddle's wheel loads for MKL (paddle_ext.ops.thread_pool() says which):
MKL's workers spin for KMP_BLOCKTIME (200 ms) after each call, and separate
threads competed with them for the cores (measured on 2 cores, S=1024 forward:
27 ms right after a Paddle matmul on its own std::threads, 15 ms on the shared
OpenMP threads). PADDLE_EXT_THREAD_POOL=std keeps the kernels on std::threads.

GPU (CUDA / ROCm builds of Paddle): Paddle's native flash attention when it
supports the call (float16 / bfloat16, as many kv heads as query heads, no
causal alignment question, Paddle's default scale, no lse / seed request):
it is the faster kernel there; the plugin's CUDA / HIP kernel otherwise.
PADDLE_EXT_FLASH_ATTN_GPU=plugin always takes the plugin's kernel.

Dropout: a counter-based Philox4x32-10 stream keyed by (seed, offset, batch,
head, row, column): the same mask in forward and backward and on every
backend. Without fixed_seed_offset a call draws batch * heads * 32 from the
offset of Paddle's generator (rng_name's generator, registered with
paddle.base.core.set_random_seed_generator, else the device's default one),
as flash-attention does; with dropout == 0 or training=False it draws nothing.
return_softmax gives the probabilities with dropped entries negated (the
flash-attention convention: the sign bit is the mask), [batch, heads,
seqlen_q, seqlen_k] (varlen: max_seqlen_q, max_seqlen_k, zero-padded).
"""

from __future__ import annotations

import ctypes
import functools
import os
import re

from paddle_ext.ops import _library, _modes
from paddle_ext.ops._checks import (
    ArgumentTypeError,
    InvalidArgumentError,
    RankError,
    contiguous,
    dtype_name,
    require_dtype,
    require_ndim,
    require_same_dtype,
    require_tensor,
    same_place,
)

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
MAX_GPU_HEAD_DIM = 256
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
_KERNEL_MESSAGE = re.compile(r"paddle_ext\.flash_attention: ([^\n\[]*)")


def cpu_isa() -> str:
    """The code path the CPU kernels take: "avx2" (AVX2 + FMA, picked at run time)
    or "generic" (the portable one; PADDLE_EXT_FLASH_ATTN_ISA=generic forces it)."""
    fn = _library.load().paddle_ext_flash_attn_cpu_isa
    fn.restype = ctypes.c_char_p
    return fn().decode()


def _require_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def _require_probability(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"{name} must be a float in [0, 1), got {type(value).__name__} {value!r}")
    if not 0.0 <= float(value) < 1.0:
        raise InvalidArgumentError(f"{name} must be in [0, 1), got {value}")
    return float(value)


def _require_scale(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"{name} must be a positive float, got {type(value).__name__} {value!r}")
    if not float(value) > 0.0:
        raise InvalidArgumentError(f"{name} must be a positive float, got {value}")
    return float(value)


def _check_qkv(query, key, value, rank: int) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        require_tensor(name, t)
    layout = "[batch, seqlen, num_heads, head_dim]" if rank == 4 else "[total_tokens, num_heads, head_dim]"
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.ndim != rank:
            raise RankError(f"{name} must be {rank}-D {layout}, got shape {list(t.shape)}")
    require_dtype("query", query, FLOAT_DTYPES)
    for name, t in (("key", key), ("value", value)):
        require_same_dtype(name, t, "query", query)
        if not same_place(t, query):
            raise InvalidArgumentError(f"{name} must be on query's device {query.place}, got {t.place}")
    qs, ks, vs = list(query.shape), list(key.shape), list(value.shape)
    if vs != ks:
        raise InvalidArgumentError(f"value must have key's shape {ks}, got {vs}")
    if rank == 4 and ks[0] != qs[0]:
        raise InvalidArgumentError(f"key's batch size {ks[0]} must equal query's {qs[0]}")
    head_dim = qs[-1]
    if ks[-1] != head_dim:
        raise InvalidArgumentError(f"key's head_dim {ks[-1]} must equal query's head_dim {head_dim}")
    if head_dim < 1:
        raise InvalidArgumentError(f"head_dim (the last dim of query) must be >= 1, got {head_dim}")
    if head_dim > MAX_GPU_HEAD_DIM and _on_gpu(query):
        raise InvalidArgumentError(f"head_dim (the last dim of query) must be in [1, {MAX_GPU_HEAD_DIM}] on GPU, "
                                   f"got {head_dim}")
    heads_q, heads_k = qs[-2], ks[-2]
    if heads_k < 1 or heads_q % heads_k != 0:
        raise InvalidArgumentError(f"key and value have {heads_k} heads, which must divide query's {heads_q} heads "
                                   "(grouped-query attention)")


def _on_gpu(t) -> bool:
    """Whether a tensor is on a GPU; a static program's variable is not known to be
    (the plugin's ops serve static programs on CPU builds only)."""
    from paddle_ext.ops import _modes

    return _modes.in_dynamic_mode() and "cpu" not in str(t.place).lower()


def _bottom_right(causal_alignment) -> bool:
    if causal_alignment not in CAUSAL_ALIGNMENTS:
        raise InvalidArgumentError(f"causal_alignment must be one of {', '.join(map(repr, CAUSAL_ALIGNMENTS))}, "
                                   f"got {causal_alignment!r}")
    return causal_alignment == "bottom_right"


def _check_seed(fixed_seed_offset, rng_name) -> None:
    if fixed_seed_offset is not None:
        require_tensor("fixed_seed_offset", fixed_seed_offset)
        if dtype_name(fixed_seed_offset) != "int64" or int(fixed_seed_offset.size) != 2:
            raise InvalidArgumentError("fixed_seed_offset must be an int64 tensor of 2 elements (seed, offset), got "
                                       f"{dtype_name(fixed_seed_offset)} of shape {list(fixed_seed_offset.shape)}")
    if not isinstance(rng_name, str):
        raise ArgumentTypeError(f"rng_name must be a str, got {type(rng_name).__name__} {rng_name!r}")
    if rng_name:
        from paddle.base import core

        try:
            core.get_random_seed_generator(rng_name)
        except Exception:
            raise InvalidArgumentError(f"rng_name {rng_name!r} names no generator: register it with "
                                       "paddle.base.core.set_random_seed_generator(name, seed)") from None


_contiguous = contiguous


def _run(op_name: str, *args):
    try:
        return _library.run(op_name, *args)
    except Exception as err:  # PD_CHECK arrives as OSError (3.x) or another type
        match = _KERNEL_MESSAGE.search(str(err))
        if match is None:
            raise
        raise InvalidArgumentError(match.group(1).strip()) from None


def _results(out, softmax, lse, seed_offset, return_softmax, return_softmax_lse, return_seed_offset):
    results = [out, softmax if return_softmax else None]
    if return_softmax_lse:
        results.append(lse)
    if return_seed_offset:
        results.append(seed_offset)
    return tuple(results)


# ---- Paddle's native GPU kernels ---------------------------------------------

@functools.cache
def _paddle_native():
    """Paddle's own flash_attention / flash_attn_unpadded, as Paddle defines them
    (past any wrapper the patch unit installed), or None without a CUDA build."""
    import paddle

    if not paddle.is_compiled_with_cuda() or paddle.is_compiled_with_rocm():
        return None
    import paddle.nn.functional.flash_attention as module

    def original(fn):
        while getattr(fn, "__paddle_ext_unit__", None) is not None:
            fn = fn.__wrapped__
        return fn

    return original(module.flash_attention), original(module.flash_attn_unpadded)


def _native_gpu(query, key, alignment_unclear, scale_supported, extras_wanted):
    """Paddle's GPU flash attention when it takes this call: see the module docs.
    alignment_unclear: causal with (possibly) fewer queries than keys, where
    releases differ in how they align the mask."""
    if os.environ.get("PADDLE_EXT_FLASH_ATTN_GPU", "").lower() == "plugin":
        return None
    place = str(query.place).lower()
    if "gpu" not in place and "cuda" not in place:
        return None
    if dtype_name(query) not in ("float16", "bfloat16") or extras_wanted or not scale_supported:
        return None
    if int(query.shape[-1]) % 8 != 0:  # head_dims Paddle's kernel may not take
        return None
    if int(key.shape[-2]) != int(query.shape[-2]) or alignment_unclear:
        return None
    return _paddle_native()


# ---- the API -----------------------------------------------------------------

def flash_attention(query, key, value, dropout=0.0, causal=False, return_softmax=False, *,
                    fixed_seed_offset=None, rng_name="", training=True, name=None, softmax_scale=None,
                    return_softmax_lse=False, return_seed_offset=False, causal_alignment="top_left"):
    """softmax(query key^T * scale) value over [batch, seqlen, num_heads, head_dim].

    Args:
        query: [batch, seqlen_q, num_heads, head_dim], float32, float16 or bfloat16;
            any head_dim on CPU, up to 256 on GPU.
        key, value: [batch, seqlen_k, num_heads_k, head_dim], query's dtype;
            num_heads_k divides num_heads (grouped-query / multi-query attention).
        dropout: probability of dropping an attention weight (when training).
        causal: query i attends to keys j <= i (causal_alignment="top_left") or
            j <= i + seqlen_k - seqlen_q ("bottom_right").
        return_softmax: also return the probabilities, dropped entries negated.
        fixed_seed_offset: int64 tensor [seed, offset] for the dropout mask;
            None draws from the generator (see the module docs).
        rng_name: the generator to draw from ("" = the device's default one).
        training: False switches dropout off.
        name: unused (Paddle's API).
        softmax_scale: the scale; None = 1 / sqrt(head_dim).
        return_softmax_lse: also return the log-sum-exp, float32 [batch, num_heads, seqlen_q].
        return_seed_offset: also return the int64 [seed, offset] the call used.
        causal_alignment: "top_left" (Paddle's) or "bottom_right" (flash-attention
            >= 2.1); matters only when causal and seqlen_q != seqlen_k.

    Returns:
        (out, softmax or None), then softmax_lse and seed_offset when asked for;
        out has query's shape and dtype.
    """
    _check_qkv(query, key, value, 4)
    dropout = _require_probability("dropout", dropout)
    _require_bool("causal", causal)
    _require_bool("return_softmax", return_softmax)
    _require_bool("training", training)
    _require_bool("return_softmax_lse", return_softmax_lse)
    _require_bool("return_seed_offset", return_seed_offset)
    _check_seed(fixed_seed_offset, rng_name)
    bottom_right = _bottom_right(causal_alignment)
    head_dim = int(query.shape[-1])
    scale = head_dim ** -0.5 if softmax_scale is None else _require_scale("softmax_scale", softmax_scale)
    native = _native_gpu(query, key, causal and int(query.shape[1]) != int(key.shape[1]), softmax_scale is None,
                         return_softmax_lse or return_seed_offset)
    if native is not None:
        out, softmax = native[0](query, key, value, dropout, causal, return_softmax,
                                 fixed_seed_offset=fixed_seed_offset, rng_name=rng_name, training=training)
        return out, softmax
    query, key, value = _modes.legacy_static_grad_inputs(*(_contiguous(t) for t in (query, key, value)))
    out, softmax, lse, seed_offset = _run(
        "pe_flash_attn", query, key, value, fixed_seed_offset, scale, dropout, causal, return_softmax,
        not training, rng_name, bottom_right)
    return _results(out, softmax, lse, seed_offset, return_softmax, return_softmax_lse, return_seed_offset)


def flash_attn_unpadded(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                        dropout=0.0, causal=False, return_softmax=False, fixed_seed_offset=None, rng_name="",
                        training=True, name=None, *, return_softmax_lse=False, return_seed_offset=False,
                        causal_alignment="top_left"):
    """Attention over variable-length sequences packed as [total_tokens, num_heads, head_dim].

    Sequence b is query tokens [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and key /
    value tokens [cu_seqlens_k[b], cu_seqlens_k[b + 1]); sequences attend only
    to themselves.

    Args:
        query: [total_q, num_heads, head_dim]; key, value: [total_k, num_heads_k, head_dim].
        cu_seqlens_q, cu_seqlens_k: int32 [batch + 1], starting at 0, not
            decreasing, ending at total_q / total_k.
        max_seqlen_q, max_seqlen_k: at least every sequence's length (the
            softmax's padded size).
        scale: the scale of query key^T.
        dropout, causal, return_softmax, fixed_seed_offset, rng_name, training,
        name, return_softmax_lse, return_seed_offset, causal_alignment: as in
        flash_attention (alignment per sequence); softmax_lse is float32
        [num_heads, total_q].

    Returns:
        (out, softmax or None), then softmax_lse and seed_offset when asked for.
    """
    _check_qkv(query, key, value, 3)
    for arg, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        require_tensor(arg, t)
        require_ndim(arg, t, 1)
        if dtype_name(t) != "int32":
            raise ArgumentTypeError(f"{arg} must be int32, got {dtype_name(t)}")
        if not same_place(t, query):
            raise InvalidArgumentError(f"{arg} must be on query's device {query.place}, got {t.place}")
    if int(cu_seqlens_q.shape[0]) != int(cu_seqlens_k.shape[0]) or int(cu_seqlens_q.shape[0]) < 2:
        raise InvalidArgumentError("cu_seqlens_q and cu_seqlens_k must both have batch + 1 >= 2 entries, got "
                                   f"{int(cu_seqlens_q.shape[0])} and {int(cu_seqlens_k.shape[0])}")
    for arg, v in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ArgumentTypeError(f"{arg} must be an int, got {type(v).__name__} {v!r}")
        if v < 0:
            raise InvalidArgumentError(f"{arg} must be >= 0, got {v}")
    scale = _require_scale("scale", scale)
    dropout = _require_probability("dropout", dropout)
    _require_bool("causal", causal)
    _require_bool("return_softmax", return_softmax)
    _require_bool("training", training)
    _require_bool("return_softmax_lse", return_softmax_lse)
    _require_bool("return_seed_offset", return_seed_offset)
    _check_seed(fixed_seed_offset, rng_name)
    bottom_right = _bottom_right(causal_alignment)
    native = _native_gpu(query, key, causal and cu_seqlens_q is not cu_seqlens_k, True,
                         return_softmax_lse or return_seed_offset)
    if native is not None:
        return native[1](query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                         dropout, causal, return_softmax, fixed_seed_offset, rng_name, training)
    query, key, value = _modes.legacy_static_grad_inputs(*(_contiguous(t) for t in (query, key, value)))
    out, softmax, lse, seed_offset = _run(
        "pe_flash_attn_varlen", query, key, value, cu_seqlens_q, cu_seqlens_k, fixed_seed_offset,
        max_seqlen_q, max_seqlen_k, scale, dropout, causal, return_softmax, not training, rng_name, bottom_right)
    return _results(out, softmax, lse, seed_offset, return_softmax, return_softmax_lse, return_seed_offset)
