"""Fused rotary position embedding (upstream #54351, rotate-half #56401,
time-major #61417), with Paddle 3.3.1's signature and semantics, on every
device: stock Paddle has no CPU kernel in any release, and 2.6.2's function
lacks time_major and rotary_emb_base.

For the token (b, s) at position p = position_ids[b, s] (or s), with the rows
cos = cos[p, :] and sin = sin[p, :] covering the whole head_dim:

    out[i] = x[i] * cos[i] + sign(i) * x[partner(i)] * sin[i]

use_neox_rotary_style=True pairs ADJACENT elements (0, 1), (2, 3), ...;
False pairs the two halves, i with i + head_dim / 2 (rotate_half); sign is -1
for the first element of a pair, +1 for the second. Without sin and cos the
angles are p * rotary_emb_base ** (-2 * (i // 2) / head_dim). The backward
pass applies the transposed rotation to the output grads; sin, cos and
position_ids get no gradient (as in Paddle). q, k and v go through the op
pe_rotary one at a time (one pass over each), so each has its own grad node.

A lone sin or cos is ignored, as Paddle's kernels ignore it (they read the
tables only when both are given): the angles come from rotary_emb_base, and
Paddle's wrapper's rules for a call without tables hold (position_ids and
use_neox_rotary_style=False raise). Where Paddle's kernel reads out of bounds
or leaves output unwritten, this raises instead: k or v with another seq_len
than q, or a smaller batch, position ids outside the tables. A k or v with a
larger batch than q, which Paddle's GPU kernel takes (FusedRopeKernel,
paddle/phi/kernels/fusion/gpu/fused_rope_kernel.cu, enforces only
batch(q) <= batch(k), then launches over q's batch), is rotated for q's batch
as there; the rest of its output, which the GPU kernel leaves unwritten, is
zeros here, and gets zero gradient (CPU tensors in dynamic mode: on a GPU
tensor the call is refused, so that the patch unit hands it to Paddle's own
kernel). Bad arguments raise paddle_ext.ops._checks' errors, which
are also what Paddle raises for them: InvalidArgumentError is both the
AssertionError Paddle's wrapper raises (position_ids or rotate-half without
tables) and the ValueError of its shape checks.
"""

from __future__ import annotations

import math
import re

import numpy as np

from paddle_ext.ops import _library
from paddle_ext.ops._checks import (
    ArgumentTypeError,
    InvalidArgumentError,
    RankError,
    contiguous,
    dtype_name,
    require_dtype,
    require_same_dtype,
    require_tensor,
    same_place,
)

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
POSITION_DTYPES = ("int64", "int32")
_BAD_POSITION = re.compile(r"paddle_ext\.rotary: position id (-?\d+) at index (\d+) of position_ids")


def fused_rotary_position_embedding(q, k=None, v=None, sin=None, cos=None, position_ids=None,
                                    use_neox_rotary_style=True, time_major=False, rotary_emb_base=10000.0):
    """Rotates q (and k, v when given) by their positions; see the module doc.

    Args:
        q: [batch, seq_len, num_heads, head_dim] (or [seq_len, batch, ...] with
            time_major=True), float32, float16, bfloat16 or float64; head_dim even.
        k, v: optional, like q with the same batch, seq_len, head_dim and dtype;
            num_heads may differ (grouped-query attention). v is rotated too.
            On CPU in dynamic mode the batch may be larger than q's (as
            Paddle's GPU kernel allows): the entries past q's batch come out
            as zeros (the GPU kernel leaves them unwritten).
        sin, cos: optional, together, q's dtype, [rows, head_dim] or
            [1, rows, 1, head_dim]; rows = seq_len, or >= seq_len with
            position_ids. Without them (or with only one of them, which is
            then ignored, as Paddle ignores it) the angles come from
            rotary_emb_base (then use_neox_rotary_style must be True and
            position_ids None, as in Paddle).
        position_ids: optional [batch, seq_len] int64 (int32 is accepted), each
            in [0, rows).
        use_neox_rotary_style: True rotates adjacent pairs, False the halves.
        time_major: whether the first dimension of q, k, v is seq_len.
        rotary_emb_base: base of the computed angles (> 0; any number when
            sin and cos are given, which Paddle then ignores, as this does).

    Returns:
        (out_q, out_k, out_v), each of its input's shape and dtype, None for an
        input not given. Float16 and bfloat16 are computed in float32; float32
        in float64, so its result is the correctly rounded one.

    Raises:
        TypeError / InvalidArgumentError (a ValueError and an AssertionError)
            naming the argument for bad arguments;
        IndexError naming position_ids[b, s] for a position outside the tables.
    """
    _check_flag("use_neox_rotary_style", use_neox_rotary_style)
    _check_flag("time_major", time_major)
    base = _check_number(rotary_emb_base)
    require_tensor("q", q)
    require_dtype("q", q, FLOAT_DTYPES)
    _require_4d("q", q, time_major)
    q_shape = list(q.shape)
    head_dim = q_shape[3]
    if head_dim % 2:
        raise InvalidArgumentError(f"q: head_dim (the last dimension) must be even, got {head_dim} in shape {q_shape}")
    batch, seq = (q_shape[1], q_shape[0]) if time_major else (q_shape[0], q_shape[1])
    for name, t in (("k", k), ("v", v)):
        if t is not None:
            _check_like_q(name, t, q, time_major)

    if (sin is None) != (cos is None):
        # Paddle's kernels read the tables only when both are given (flag_sin_cos):
        # a lone sin or cos is ignored and the angles come from rotary_emb_base.
        sin = cos = None
    if sin is None:
        if position_ids is not None:
            raise InvalidArgumentError("position_ids needs sin and cos: Paddle computes the angles from "
                                       "rotary_emb_base only for positions 0..seq_len-1")
        if not use_neox_rotary_style:
            raise InvalidArgumentError("use_neox_rotary_style=False (rotate_half) needs sin and cos: Paddle "
                                       "computes angles from rotary_emb_base only for adjacent pairs")
        _check_base(base, rotary_emb_base)  # used only here: with tables Paddle ignores it
    else:
        rows = _check_table("sin", sin, q, head_dim)
        _check_table("cos", cos, q, head_dim)
        if list(sin.shape) != list(cos.shape):
            raise InvalidArgumentError(f"sin and cos must have the same shape, got sin {list(sin.shape)} and "
                                       f"cos {list(cos.shape)}")
        if position_ids is None and rows != seq:
            raise InvalidArgumentError(f"sin and cos must have seq_len = {seq} rows without position_ids, got shape "
                                       f"{list(sin.shape)}")
        if position_ids is not None and rows < seq:
            raise InvalidArgumentError(f"sin and cos must have at least seq_len = {seq} rows (Paddle requires it with "
                                       f"position_ids), got shape {list(sin.shape)}")
    if position_ids is not None:
        require_tensor("position_ids", position_ids)
        require_dtype("position_ids", position_ids, POSITION_DTYPES)
        if list(position_ids.shape) != [batch, seq]:
            raise InvalidArgumentError(f"position_ids must be [batch, seq_len] = {[batch, seq]}, got shape "
                                       f"{list(position_ids.shape)}")
        _require_same_place("position_ids", position_ids, q)
        if dtype_name(position_ids) != "int64":
            position_ids = position_ids.astype("int64")

    tables = [None if t is None else contiguous(t) for t in (sin, cos, position_ids)]
    batch_axis = 1 if time_major else 0
    attrs = (bool(use_neox_rotary_style), bool(time_major), base)
    outs = []
    checked = position_ids is None
    for t in (q, k, v):
        if t is None:
            outs.append(None)
            continue
        if 0 in t.shape or batch == 0:  # nothing to rotate (and 2.6's custom-op runner refuses empty outputs)
            import paddle

            outs.append(paddle.zeros_like(t))
            continue
        whole, extra = t, int(t.shape[batch_axis]) - batch
        if extra:  # a k / v of a larger batch: q's batch is rotated, as on the GPU
            import paddle

            t = paddle.slice(t, axes=[batch_axis], starts=[0], ends=[batch])
        try:  # the kernel checks the position ids with the first tensor it rotates
            (out,) = _library.run("pe_rotary", contiguous(t), *tables, *attrs, not checked)
        except Exception as err:  # the kernel's PD_CHECK arrives as OSError (3.x) or another type
            match = _BAD_POSITION.search(str(err))
            if match is None:
                raise
            value, flat = int(match.group(1)), int(match.group(2))
            where = [int(j) for j in np.unravel_index(flat, (batch, seq))]
            rows = int(sin.shape[0] if sin.ndim == 2 else sin.shape[1])
            raise IndexError(
                f"position_ids{where} = {value} is out of range: position ids must lie in [0, rows) = "
                f"[0, {rows}), the rows of sin and cos") from None
        checked = True
        if extra:
            rest = list(whole.shape)
            rest[batch_axis] = extra
            out = paddle.concat([out, paddle.zeros(rest, dtype=whole.dtype)], axis=batch_axis)
        outs.append(out)
    return tuple(outs)


def _check_flag(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def _check_number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentTypeError(f"rotary_emb_base must be a number, got {type(value).__name__} {value!r}")
    return float(value)


def _check_base(base, value):
    """The base of computed angles: Paddle's kernel would give NaN / inf angles for
    one <= 0 or not finite."""
    if not (math.isfinite(base) and base > 0):
        raise InvalidArgumentError(f"rotary_emb_base must be a finite number > 0 when sin and cos are not given "
                                   f"(it is unused with them), got {value!r}")


def _require_4d(name, t, time_major):
    if t.ndim != 4:
        layout = "[seq_len, batch, num_heads, head_dim]" if time_major else "[batch, seq_len, num_heads, head_dim]"
        raise RankError(f"{name} must be 4-D {layout}, got shape {list(t.shape)}")


def _require_same_place(name, t, q):
    if not same_place(t, q):
        raise InvalidArgumentError(f"{name} must be on q's device {q.place}, got {t.place}")


def _check_like_q(name, t, q, time_major):
    require_tensor(name, t)
    _require_4d(name, t, time_major)
    require_same_dtype(name, t, "q", q)
    shape, q_shape = list(t.shape), list(q.shape)
    b = 1 if time_major else 0
    larger_batch = shape[b] > q_shape[b] and _larger_batch_served(q)
    if (shape[b] != q_shape[b] and not larger_batch) or shape[1 - b] != q_shape[1 - b] or shape[3] != q_shape[3]:
        batch_rule = ("batch >= q's" if _larger_batch_served(q) else "batch") + ", seq_len and head_dim"
        raise InvalidArgumentError(f"{name} must match q in {batch_rule} (num_heads may differ): "
                                   f"q is {q_shape}, {name} is {shape}")
    _require_same_place(name, t, q)


def _larger_batch_served(q) -> bool:
    """Whether a k / v of a larger batch than q is computed here: for CPU tensors in
    dynamic mode, where Paddle has no kernel. A GPU tensor's call is refused, so that
    the patch unit hands it to Paddle's own kernel (which leaves the extra entries
    unwritten); a static program's shapes may not be known."""
    from paddle_ext.ops import _modes

    return _modes.in_dynamic_mode() and q.place.is_cpu_place()


def _check_table(name, t, q, head_dim):
    """Returns the table's rows."""
    require_tensor(name, t)
    require_same_dtype(name, t, "q", q)
    shape = list(t.shape)
    if len(shape) == 2 and shape[1] == head_dim:
        rows = shape[0]
    elif len(shape) == 4 and shape[0] == 1 and shape[2] == 1 and shape[3] == head_dim:
        rows = shape[1]
    else:
        raise InvalidArgumentError(f"{name} must be [seq_len, head_dim] or [1, seq_len, 1, head_dim] with head_dim = "
                                   f"{head_dim} (q's last dimension), got shape {shape}")
    _require_same_place(name, t, q)
    return rows


