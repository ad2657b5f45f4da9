"""Packed-QKV flash attention (Paddle 3.3.1's flash_attn_qkvpacked and
flash_attn_varlen_qkvpacked) over paddle_ext's flash attention kernels.

Paddle's layout, with groups = num_heads / num_heads_k:

- flash_attn_qkvpacked: qkv [batch, seqlen, groups + 2, num_heads_k, head_dim];
- flash_attn_varlen_qkvpacked: qkv [total_tokens, groups + 2, num_heads_k, head_dim].

qkv[..., :groups, :, :] flattened to num_heads = groups * num_heads_k heads is
the query (query head g * num_heads_k + j is qkv[..., g, j, :]), qkv[..., -2, :, :]
the key and qkv[..., -1, :, :] the value. That is what Paddle's GPU kernel does
(a flattened view of the first slots, then FlashAttention-2, where query head h
reads kv head h // groups) and what its CPU fallback does (the same slices, then
the math path), so the result is that of flash_attention / flash_attn_unpadded on
those three tensors, and gradients reach qkv through the slices.

varlen_padded=True (Paddle's default): sequence b occupies rows
[b * max_seqlen_q, b * max_seqlen_q + len_q(b)) of the query slots and
[b * max_seqlen_k, b * max_seqlen_k + len_k(b)) of the key / value slots, with
the lengths from cu_seqlens (Paddle's kernel strides batches by max_seqlen);
the padding rows are not attended to and their output and gradients are zeros.
It runs as one varlen call in which each padding stretch is a sequence of its
own paired with an empty one (queries that see no key give zeros, keys that no
query sees get no gradient): the real sequences see exactly what they see
unpadded. With dropout the mask comes from that call (its batch is 3 * batch + 2,
sequence b its entry 3 * b).

Both work in static graphs too: everything here is Paddle ops plus the plugin's
custom ops.
"""

from __future__ import annotations

from paddle_ext.ops._checks import (
    ArgumentTypeError,
    InvalidArgumentError,
    RankError,
    dtype_name,
    require_tensor,
)
from paddle_ext.ops.flash_attention import flash_attention, flash_attn_unpadded


def _split(qkv, slot_axis: int):
    """(query, key, value) of a packed qkv whose slots are on `slot_axis`."""
    require_tensor("qkv", qkv)
    rank = slot_axis + 3
    if qkv.ndim != rank:
        layout = ("[batch, seqlen, num_heads/num_heads_k + 2, num_heads_k, head_dim]" if slot_axis == 2
                  else "[total_tokens, num_heads/num_heads_k + 2, num_heads_k, head_dim]")
        raise RankError(f"qkv must be {rank}-D {layout}, got shape {list(qkv.shape)}")
    shape = list(qkv.shape)
    slots, head_dim = shape[slot_axis], shape[-1]
    if 0 <= slots < 3:
        raise InvalidArgumentError(f"qkv's dimension {slot_axis} (num_heads/num_heads_k + 2) must be >= 3, "
                                   f"got {slots} in shape {shape}")
    lead = [slice(None)] * slot_axis
    query = qkv[(*lead, slice(0, -2))]
    key = qkv[(*lead, -2)]
    value = qkv[(*lead, -1)]
    # 0 keeps a dimension as it is (static graphs may not know it).
    query = query.reshape([0] * slot_axis + [-1, head_dim])
    return query, key, value


def flash_attn_qkvpacked(qkv, dropout=0.0, causal=False, return_softmax=False, *, fixed_seed_offset=None,
                         rng_name="", training=True, name=None):
    """Attention over a packed qkv [batch, seqlen, num_heads/num_heads_k + 2, num_heads_k, head_dim].

    Args: as paddle_ext.ops.flash_attention (qkv's dtype: float32, float16 or bfloat16).

    Returns:
        (out [batch, seqlen, num_heads, head_dim], softmax or None).
    """
    query, key, value = _split(qkv, 2)
    out, softmax = flash_attention(query, key, value, dropout, causal, return_softmax,
                                   fixed_seed_offset=fixed_seed_offset, rng_name=rng_name, training=training,
                                   name=name)[:2]
    return out, softmax


def flash_attn_varlen_qkvpacked(qkv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, dropout=0.0,
                                causal=False, return_softmax=False, fixed_seed_offset=None, rng_name="",
                                varlen_padded=True, training=True, name=None):
    """Varlen attention over a packed qkv [total_tokens, num_heads/num_heads_k + 2, num_heads_k, head_dim].

    Args: as paddle_ext.ops.flash_attn_unpadded, plus varlen_padded (see the
    module docs): True, sequence b starts at row b * max_seqlen_q (b *
    max_seqlen_k for key / value); False, the sequences are contiguous as
    cu_seqlens say.

    Returns:
        (out [total_tokens, num_heads, head_dim], softmax or None); padding rows
        of out are zeros.
    """
    if not isinstance(varlen_padded, bool):
        raise ArgumentTypeError(f"varlen_padded must be a bool, got {type(varlen_padded).__name__} {varlen_padded!r}")
    query, key, value = _split(qkv, 1)
    args = (max_seqlen_q, max_seqlen_k, scale, dropout, causal, return_softmax, fixed_seed_offset, rng_name,
            training, name)
    if not varlen_padded:
        out, softmax = flash_attn_unpadded(query, key, value, cu_seqlens_q, cu_seqlens_k, *args)[:2]
        return out, softmax
    total = qkv.shape[0]
    for arg, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        require_tensor(arg, t)
        if dtype_name(t) != "int32":
            raise ArgumentTypeError(f"{arg} must be int32, got {dtype_name(t)}")
    if list(cu_seqlens_q.shape) != list(cu_seqlens_k.shape):
        raise InvalidArgumentError("cu_seqlens_q and cu_seqlens_k must have the same batch + 1 entries, got "
                                   f"shapes {list(cu_seqlens_q.shape)} and {list(cu_seqlens_k.shape)}")
    segments_q = _padded_segments("q", cu_seqlens_q, max_seqlen_q, total, qkv)
    segments_k = _padded_segments("k", cu_seqlens_k, max_seqlen_k, total, qkv)
    out, softmax = flash_attn_unpadded(query, key, value, segments_q, segments_k, *args)[:2]
    if softmax is not None:
        softmax = softmax[0:-2:3]  # the real sequences: 0, 3, ..., 3 * batch - 3
    return out, softmax


def _padded_segments(which: str, cu_seqlens, max_seqlen, total, qkv):
    """The cumulative lengths (int32 [3 * batch + 3]) of one varlen call over the
    padded rows: for each sequence b (rows from start = b * max_seqlen) three
    segments, paired across query and key:

        query: [start, start + len_q)  [.., start + max)      empty
        key:   [start, start + len_k)  empty                  [.., start + max)

    then the rows after batch * max_seqlen the same way (query rows, then key
    rows, each paired with an empty segment). Padding queries see no key, so
    their output and gradients are zeros; padding keys are seen by no query.
    Paddle ops only, so it also runs in static graphs."""
    import paddle

    from paddle_ext.ops import _modes

    arg = f"cu_seqlens_{which}"
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int):
        raise ArgumentTypeError(f"max_seqlen_{which} must be an int, got {type(max_seqlen).__name__} {max_seqlen!r}")
    if max_seqlen < 1:
        raise InvalidArgumentError(f"max_seqlen_{which} must be >= 1 with varlen_padded=True (the stride of "
                                   f"the sequences' rows), got {max_seqlen}")
    if cu_seqlens.ndim != 1 or cu_seqlens.shape[0] == 1:
        raise InvalidArgumentError(f"{arg} must be 1-D with batch + 1 >= 2 entries, got shape "
                                   f"{list(cu_seqlens.shape)}")
    if _modes.in_dynamic_mode():
        _check_padded_layout(arg, cu_seqlens.numpy(), max_seqlen, int(total), which)
    cu = cu_seqlens.astype("int64")
    lengths = cu[1:] - cu[:-1]
    ends = paddle.cumsum(paddle.full_like(lengths, max_seqlen))  # max, 2 max, ...
    real_end = ends - max_seqlen + lengths
    if which == "q":
        points = paddle.stack([real_end, ends, ends], axis=1)
    else:
        points = paddle.stack([real_end, real_end, ends], axis=1)
    rows = paddle.full([1], total, "int64") if total >= 0 else paddle.shape(qkv)[0:1].astype("int64")
    tail = [rows, rows] if which == "q" else [ends[-1:], rows]
    zero = paddle.zeros([1], "int64")
    return paddle.concat([zero, points.reshape([-1]), *tail]).astype("int32")


def _check_padded_layout(arg: str, cu, max_seqlen: int, total: int, which: str) -> None:
    lengths = cu[1:].astype("int64") - cu[:-1]
    if cu[0] != 0 or (lengths < 0).any():
        raise InvalidArgumentError(f"{arg} must start at 0 and not decrease, got {cu.tolist()}")
    if (lengths > max_seqlen).any():
        b = int((lengths > max_seqlen).argmax())
        raise InvalidArgumentError(f"{arg}: sequence {b} has {int(lengths[b])} tokens, more than "
                                   f"max_seqlen_{which}={max_seqlen} (its padded length)")
    if len(lengths) * max_seqlen > total:
        raise InvalidArgumentError(f"qkv must have at least batch * max_seqlen_{which} = {len(lengths)} * "
                                   f"{max_seqlen} rows with varlen_padded=True, got {total}")
