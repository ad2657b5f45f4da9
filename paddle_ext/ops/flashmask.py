"""FlashMask attention (Paddle 3.x's paddle.nn.functional.flashmask_attention)
on the plugin's flash-attention CPU kernel.

A column-wise sparse mask: startend_row_indices, int32 [batch, mask_heads,
seqlen_k, c] with mask_heads 1 (broadcast), num_heads or num_heads_k, gives
for each key column j the query rows it is hidden from:
- causal, c = 1 (LTS): rows >= LTS, on top of causal (rows < j);
- causal, c = 2 (LTS, LTE): rows in [LTS, LTE);
- not causal, c = 2 (LTS, UTE): rows >= LTS and rows < UTE;
- not causal, c = 4 (LTS, LTE, UTS, UTE): rows in [LTS, LTE) and in [UTS, UTE).
window_size (w or (left, right)) builds that mask for a sliding window, as
Paddle does. Causal is aligned top-left (query i sees keys j <= i), as
Paddle's kernel. The kernel skips every (query block, key block) tile the mask
covers entirely, so the cost follows the unmasked area; partly covered tiles
are masked element by element. A mask that only cuts the sequence into
documents (packed training sequences) runs as variable-length attention over
the documents instead, without the mask (not with dropout).

Beyond Paddle's FlashAttention-2 path: float32 inputs and softmax_scale (its
FA2 path asserts softmax_scale is None). block_mask (FlashMask v3, sm >= 90
only in Paddle) is refused. On GPUs Paddle's own kernel serves the call (the
patch unit keeps it there).
"""

from __future__ import annotations

import numpy as np

from paddle_ext.ops import _modes
from paddle_ext.ops._checks import InvalidArgumentError, dtype_name, require_tensor
from paddle_ext.ops.flash_attention import (
    _check_qkv,
    _check_seed,
    _contiguous,
    _require_bool,
    _require_probability,
    _require_scale,
    _run,
    flash_attention,
)


def window_mask(window_size, causal: bool, batch: int, seqlen: int):
    """startend_row_indices of a sliding window, as Paddle 3.3.1 builds them:
    causal: key j hidden from rows > j + left; else also from rows < j - right."""
    import paddle

    left, right = (window_size, window_size) if isinstance(window_size, int) else tuple(window_size)
    rows = np.arange(seqlen)
    if causal:
        idx = np.clip(rows + left + 1, None, seqlen).reshape(1, 1, seqlen, 1)
    else:
        idx = np.stack([rows + left + 1, rows - right], axis=-1).clip(0, seqlen).reshape(1, 1, seqlen, 2)
    return paddle.to_tensor(np.repeat(idx.astype(np.int32), batch, axis=0))


def _check_startend(startend, query, key, causal: bool) -> None:
    require_tensor("startend_row_indices", startend)
    if dtype_name(startend) != "int32":
        raise InvalidArgumentError(f"startend_row_indices.dtype must be paddle.int32, but got {dtype_name(startend)}")
    shape = list(startend.shape)
    if len(shape) != 4:
        raise InvalidArgumentError(f"startend_row_indices rank must be 4, but got {shape}")
    if shape[0] != int(key.shape[0]):
        raise InvalidArgumentError(f"startend_row_indices.shape[0] must be equal to batch_size, but got {shape[0]} "
                                   f"and {int(key.shape[0])}")
    if shape[2] != int(key.shape[1]):
        raise InvalidArgumentError(f"startend_row_indices.shape[2] must be equal to seqlen_k, but got {shape[2]} "
                                   f"and {int(key.shape[1])}")
    if shape[1] not in (1, int(query.shape[2]), int(key.shape[2])):
        raise InvalidArgumentError("startend_row_indices head_num must be equal to 1(broadcast) or head_num_q or "
                                   f"head_num_k, got {shape[1]}")
    allowed = (1, 2) if causal else (2, 4)
    if shape[3] not in allowed:
        raise InvalidArgumentError(f"Invalid shape of startend_row_indices, when causal is {causal}, the last "
                                   f"dimension should be either {allowed[0]} or {allowed[1]} but got {shape[3]}")


def flashmask_attention(query, key, value, startend_row_indices=None, *, dropout=0.0, causal=False,
                        window_size=None, return_softmax_lse=False, return_seed_offset=False,
                        fixed_seed_offset=None, rng_name="", training=True, name=None, softmax_scale=None,
                        block_mask=None):
    """Paddle 3.3.1's flashmask_attention: [batch, seqlen, num_heads, head_dim]
    query, key / value with num_heads_k dividing num_heads, the mask above.

    Returns out, or [out, softmax_lse (if asked), seed_offset (if asked)] as
    Paddle does.
    """
    _check_qkv(query, key, value, 4)
    _require_bool("causal", causal)
    _require_bool("return_softmax_lse", return_softmax_lse)
    _require_bool("return_seed_offset", return_seed_offset)
    _require_bool("training", training)
    dropout = _require_probability("dropout", dropout)
    _check_seed(fixed_seed_offset, rng_name)
    if block_mask is not None:
        raise InvalidArgumentError("block_mask (FlashMask v3) is not supported by paddle_ext's CPU kernel; "
                                   "Paddle serves it on sm >= 90 GPUs only")
    if window_size is not None:
        if startend_row_indices is not None:
            raise InvalidArgumentError("can't use window_size with startend_row_indices")
        startend_row_indices = window_mask(window_size, causal, int(query.shape[0]), int(query.shape[1]))
    head_dim = int(query.shape[-1])
    scale = head_dim ** -0.5 if softmax_scale is None else _require_scale("softmax_scale", softmax_scale)
    if startend_row_indices is None:
        out, _, lse, seed_offset = flash_attention(query, key, value, dropout, causal, False,
                                                   fixed_seed_offset=fixed_seed_offset, rng_name=rng_name,
                                                   training=training, softmax_scale=scale, return_softmax_lse=True,
                                                   return_seed_offset=True)
    else:
        _check_startend(startend_row_indices, query, key, causal)
        query, key, value, startend_row_indices = (_contiguous(t) for t in (query, key, value, startend_row_indices))
        query, key, value = _modes.legacy_static_grad_inputs(query, key, value)
        out, _, lse, seed_offset = _run("pe_flashmask_attn", query, key, value, startend_row_indices,
                                        fixed_seed_offset, scale, dropout, causal, not training, rng_name)
    outputs = [out]
    if return_softmax_lse:
        outputs.append(lse)
    if return_seed_offset:
        outputs.append(seed_offset)
    return outputs[0] if len(outputs) == 1 else outputs
