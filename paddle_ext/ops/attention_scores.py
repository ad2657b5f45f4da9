"""calc_reduced_attention_scores (Paddle 3.x) on every device: the attention
probabilities summed over the queries, from the log-sum-exp a flash attention
forward returned, without that forward's S x S matrix.

    result[b, h, 0, j] = sum_i exp(scale * q[b, i, h] . k[b, j, h'] - lse[b, h, i])

with scale = 1 / sqrt(head_dim), h' = h // (num_heads / num_heads_k) and i over
seqlen_q: softmax(Q K^T * scale) summed over dim -2, as Paddle's GPU kernel
computes it (no causal mask: it takes none). lse is what paddle_ext.ops.
flash_attention(..., return_softmax_lse=True) returns, [batch, num_heads,
seqlen_q]; Paddle's GPU flash_attn gives it padded to a multiple of 128 rows,
so a longer last dimension is read up to seqlen_q.

Computed in float32 with Paddle ops, a block of queries at a time, so memory
stays at block x seqlen_k per head; it runs in static graphs as well.
"""

from __future__ import annotations

from paddle_ext.ops._checks import (
    InvalidArgumentError,
    RankError,
    dtype_name,
    require_dtype,
    require_same_dtype,
    require_tensor,
)

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
QUERY_BLOCK = 512


def calc_reduced_attention_scores(query, key, softmax_lse):
    """Sum over queries of softmax(query key^T / sqrt(head_dim)), for inference.

    Args:
        query: [batch, seqlen_q, num_heads, head_dim] (float32, float16,
            bfloat16 or float64), stop_gradient=True.
        key: [batch, seqlen_k, num_heads_k, head_dim], query's dtype;
            num_heads_k divides num_heads; stop_gradient=True.
        softmax_lse: float32 [batch, num_heads, >= seqlen_q], the forward's
            log-sum-exp of the scaled scores.

    Returns:
        float32 [batch, num_heads, 1, seqlen_k].
    """
    import paddle

    for name, t in (("query", query), ("key", key), ("softmax_lse", softmax_lse)):
        require_tensor(name, t)
    if not (query.stop_gradient and key.stop_gradient):
        raise InvalidArgumentError("calc_reduced_attention_scores() is for inference only: query and key must "
                                   f"have stop_gradient=True, got {query.stop_gradient} and {key.stop_gradient}")
    for name, t, rank in (("query", query, 4), ("key", key, 4), ("softmax_lse", softmax_lse, 3)):
        if t.ndim != rank:
            raise RankError(f"{name} must be {rank}-D, got shape {list(t.shape)}")
    require_dtype("query", query, FLOAT_DTYPES)
    require_same_dtype("key", key, "query", query)
    if dtype_name(softmax_lse) != "float32":
        raise InvalidArgumentError(f"softmax_lse must be float32, got {dtype_name(softmax_lse)}")
    batch, seqlen_q, heads, head_dim = query.shape
    batch_k, _, heads_k, head_dim_k = key.shape
    if batch_k != batch or head_dim_k != head_dim:
        raise InvalidArgumentError(f"key must match query in batch and head_dim: query is {list(query.shape)}, "
                                   f"key is {list(key.shape)}")
    if heads_k < 1 or heads % heads_k:
        raise InvalidArgumentError(f"key has {heads_k} heads, which must divide query's {heads} heads")
    lse_shape = list(softmax_lse.shape)
    if lse_shape[:2] != [batch, heads] or 0 <= lse_shape[2] < seqlen_q:
        raise InvalidArgumentError(f"softmax_lse must be [batch, num_heads, >= seqlen_q] = [{batch}, {heads}, "
                                   f">= {seqlen_q}], got {lse_shape}")

    if seqlen_q < 0:
        raise InvalidArgumentError("calc_reduced_attention_scores in a static program needs seqlen_q known "
                                   f"(query's dimension 1), got shape {list(query.shape)}")
    scale = float(head_dim) ** -0.5
    q = query.astype("float32").transpose([0, 2, 1, 3])  # [b, h, sq, d]
    k = key.astype("float32").transpose([0, 2, 1, 3])
    if heads_k != heads:
        k = paddle.repeat_interleave(k, heads // heads_k, axis=1)
    total = None
    for start in range(0, seqlen_q, QUERY_BLOCK):
        stop = min(start + QUERY_BLOCK, seqlen_q)
        scores = paddle.matmul(q[:, :, start:stop], k, transpose_y=True) * scale
        probs = paddle.exp(scores - softmax_lse[:, :, start:stop].unsqueeze(-1))
        part = probs.sum(axis=2, keepdim=True)
        total = part if total is None else total + part
    if total is None:  # no queries
        total = paddle.zeros([batch, heads, 1, key.shape[1]], "float32")
    return total
