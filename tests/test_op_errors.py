"""Error types of the ops: code written against Paddle catches what Paddle raises.

Paddle refuses bad arguments with AssertionError (its Python wrappers' asserts)
or ValueError (InvalidArgument from its C++ checks); the plugin's argument errors
are both, so each case here is checked with `pytest.raises(AssertionError)` and
`pytest.raises(ValueError)`, and for its message (argument, value, allowed range).
Where stock Paddle itself refuses a call on CPU, the plugin's error must be an
instance of the type Paddle raised (run with the plugin disabled, then enabled).
"""

import numpy as np
import paddle
import pytest

import paddle_ext
import paddle_ext.ops as ops
from paddle_ext.ops._checks import (
    ArgumentTypeError,
    InvalidArgumentError,
    RankError,
    UnsupportedDtypeError,
)


def _z(shape, dtype="float32"):
    return paddle.zeros(shape, dtype=dtype)


def _i32(values):
    return paddle.to_tensor(np.array(values, np.int32))


def _varlen(cu_q, cu_k, total=6, max_q=6, max_k=6, heads_k=2, **kw):
    q, k = _z([total, 2, 32]), _z([total, heads_k, 32])
    return ops.flash_attn_unpadded(q, k, k, _i32(cu_q), _i32(cu_k), max_q, max_k, 0.1, **kw)


Q4 = (1, 8, 4, 32)
R4 = (2, 5, 3, 8)

# (call, message pattern): every one must be caught as AssertionError and as ValueError.
VALUE_ERRORS = {
    "flash_attention dropout": (lambda: ops.flash_attention(_z(Q4), _z(Q4), _z(Q4), dropout=1.5),
                                r"dropout must be in \[0, 1\), got 1.5"),
    "flash_attention heads": (lambda: ops.flash_attention(_z(Q4), _z((1, 8, 3, 32)), _z((1, 8, 3, 32))),
                              r"key and value have 3 heads, which must divide query's 4 heads"),
    "flash_attention batch": (lambda: ops.flash_attention(_z(Q4), _z((2, 8, 4, 32)), _z((2, 8, 4, 32))),
                              r"key's batch size 2 must equal query's 1"),
    "flash_attention head_dim": (lambda: ops.flash_attention(_z(Q4), _z((1, 8, 4, 16)), _z((1, 8, 4, 16))),
                                 r"key's head_dim 16 must equal query's head_dim 32"),
    "flash_attention value shape": (lambda: ops.flash_attention(_z(Q4), _z(Q4), _z((1, 9, 4, 32))),
                                    r"value must have key's shape \[1, 8, 4, 32\], got \[1, 9, 4, 32\]"),
    "flash_attention rank": (lambda: ops.flash_attention(_z((8, 4, 32)), _z((8, 4, 32)), _z((8, 4, 32))),
                             r"query must be 4-D \[batch, seqlen, num_heads, head_dim\], got shape \[8, 4, 32\]"),
    "flash_attention softmax_scale": (lambda: ops.flash_attention(_z(Q4), _z(Q4), _z(Q4), softmax_scale=-1.0),
                                      r"softmax_scale must be a positive float, got -1.0"),
    "flash_attention seed": (lambda: ops.flash_attention(_z(Q4), _z(Q4), _z(Q4), fixed_seed_offset=_z([3], "int64")),
                             r"fixed_seed_offset must be an int64 tensor of 2 elements"),
    "flash_attention key not a tensor": (lambda: ops.flash_attention(_z(Q4), np.zeros(Q4, np.float32), _z(Q4)),
                                         r"key must be a paddle.Tensor, got ndarray"),
    "flash_attention key dtype": (lambda: ops.flash_attention(_z(Q4), _z(Q4, "float16"), _z(Q4, "float16")),
                                  r"key must have query's dtype float32, got float16"),
    "flash_attn_unpadded decreasing cu_seqlens (kernel check)": (
        lambda: _varlen([0, 4, 2, 6], [0, 2, 4, 6]), r"cu_seqlens_q must not decrease"),
    "flash_attn_unpadded cu_seqlens end (kernel check)": (
        lambda: _varlen([0, 2, 4, 6], [0, 2, 4, 5]), r"cu_seqlens_k must end at the number of tokens 6"),
    "flash_attn_unpadded max_seqlen": (lambda: _varlen([0, 6], [0, 6], max_q=-1),
                                       r"max_seqlen_q must be >= 0, got -1"),
    "flash_attn_unpadded batch": (lambda: _varlen([0, 2, 6], [0, 2, 4, 6]),
                                  r"cu_seqlens_q and cu_seqlens_k must both have batch \+ 1 >= 2 entries, got 3 and 4"),
    "flash_attn_unpadded cu_seqlens dtype": (
        lambda: ops.flash_attn_unpadded(_z([6, 2, 32]), _z([6, 2, 32]), _z([6, 2, 32]),
                                        paddle.to_tensor(np.array([0, 6])), _i32([0, 6]), 6, 6, 0.1),
        r"cu_seqlens_q must be int32, got int64"),
    "rotary position_ids without sin/cos": (
        lambda: ops.fused_rotary_position_embedding(_z(R4), position_ids=_z((2, 5), "int64")),
        r"position_ids needs sin and cos"),
    "rotary rotate_half without sin/cos": (
        lambda: ops.fused_rotary_position_embedding(_z(R4), use_neox_rotary_style=False),
        r"use_neox_rotary_style=False \(rotate_half\) needs sin and cos"),
    "rotary odd head_dim": (lambda: ops.fused_rotary_position_embedding(_z((2, 5, 3, 7))),
                            r"q: head_dim \(the last dimension\) must be even, got 7"),
    "rotary rank": (lambda: ops.fused_rotary_position_embedding(_z((2, 5, 8))),
                    r"q must be 4-D \[batch, seq_len, num_heads, head_dim\], got shape \[2, 5, 8\]"),
    "rotary table rows": (lambda: ops.fused_rotary_position_embedding(_z(R4), sin=_z((6, 8)), cos=_z((6, 8))),
                          r"sin and cos must have seq_len = 5 rows without position_ids, got shape \[6, 8\]"),
    "rotary k shape": (lambda: ops.fused_rotary_position_embedding(_z(R4), _z((2, 4, 3, 8))),
                       r"k must match q in batch >= q's, seq_len and head_dim"),
    "rotary base": (lambda: ops.fused_rotary_position_embedding(_z(R4), rotary_emb_base=0.0),
                    r"rotary_emb_base must be a finite number > 0 when sin and cos are not given"),
    "rotary sin dtype": (lambda: ops.fused_rotary_position_embedding(_z(R4), sin=_z((5, 8), "float64"),
                                                                     cos=_z((5, 8), "float64")),
                         r"sin must have q's dtype float32, got float64"),
    "c_embedding start_index": (lambda: ops.c_embedding(_z((5, 2)), _z([2], "int64"), start_index=-1),
                                r"start_index must be in \[0, inf\], got -1"),
    "c_embedding vocab_size": (lambda: ops.c_embedding(_z((5, 2)), _z([2], "int64"), vocab_size=1.5),
                               r"vocab_size must be an int, got float 1.5"),
    "c_embedding weight rank": (lambda: ops.c_embedding(_z([10]), _z([2], "int64")),
                                r"weight must be 2-D, got shape \[10\]"),
    "c_embedding weight not a tensor": (lambda: ops.c_embedding(np.ones((5, 2)), _z([2], "int64")),
                                        r"weight must be a paddle.Tensor, got ndarray"),
    "set_num_threads": (lambda: ops.set_num_threads(0), r"n must be an int >= 1, got 0"),
}


@pytest.mark.parametrize("case", sorted(VALUE_ERRORS))
@pytest.mark.parametrize("caught_as", [AssertionError, ValueError])
def test_argument_errors_are_assertion_and_value_errors(case, caught_as):
    call, pattern = VALUE_ERRORS[case]
    with pytest.raises(caught_as, match=pattern) as info:
        call()
    assert isinstance(info.value, InvalidArgumentError)


@pytest.mark.parametrize("call, pattern", [
    (lambda: ops.flash_attention(_z(Q4, "int32"), _z(Q4, "int32"), _z(Q4, "int32")), r"query must have dtype in"),
    (lambda: ops.fused_rotary_position_embedding(_z(R4, "int64")), r"q must have dtype in"),
    (lambda: ops.c_embedding(_z((5, 2), "int32"), _z([2], "int64")), r"weight must have dtype in"),
    (lambda: ops.c_embedding(_z((5, 2)), _z([2], "float32")), r"ids must have dtype in \('int32', 'int64'\), got float32"),
])
def test_unsupported_dtypes_are_type_and_runtime_errors(call, pattern):
    """Paddle has no kernel for them: NotFound, a RuntimeError; TypeError is what Python code expects."""
    for caught_as in (TypeError, RuntimeError):
        with pytest.raises(caught_as, match=pattern) as info:
            call()
        assert isinstance(info.value, UnsupportedDtypeError)


def test_error_classes():
    assert issubclass(ArgumentTypeError, (TypeError)) and issubclass(ArgumentTypeError, InvalidArgumentError)
    assert issubclass(RankError, IndexError) and issubclass(RankError, InvalidArgumentError)
    assert ops.InvalidArgumentError is InvalidArgumentError


# ---------------------------------------------- what stock Paddle raises on CPU

def _fa():
    import paddle.nn.functional.flash_attention as module

    return module


def _rope():
    import paddle.incubate.nn.functional as functional

    return functional.fused_rotary_position_embedding


def _lookup():
    from paddle_ext import upstream

    return upstream.mp_ops_module()._c_lookup_table


# Calls through Paddle's own names (looked up at call time, so the patched or the
# stock function) that stock Paddle 3.3.1 refuses on CPU.
STOCK_REFUSED = {
    "rotary position_ids without sin/cos": lambda: _rope()(_z(R4), position_ids=_z((2, 5), "int64")),
    "rotary rotate_half without sin/cos": lambda: _rope()(_z(R4), use_neox_rotary_style=False),
    "flash_attention 3-D query": lambda: _fa().flash_attention(_z((8, 4, 32)), _z((8, 4, 32)), _z((8, 4, 32))),
    "flash_attention key dtype": lambda: _fa().flash_attention(_z(Q4), _z(Q4, "float64"), _z(Q4, "float64")),
    "flash_attention head_dim": lambda: _fa().flash_attention(_z(Q4), _z((1, 8, 4, 16)), _z((1, 8, 4, 16))),
    "flash_attention heads": lambda: _fa().flash_attention(_z((1, 8, 3, 32)), _z((1, 8, 2, 32)),
                                                           _z((1, 8, 2, 32))),
    "flash_attention value shape": lambda: _fa().flash_attention(_z(Q4), _z(Q4), _z((1, 9, 4, 32))),
    "flash_attention dropout": lambda: _fa().flash_attention(_z(Q4), _z(Q4), _z(Q4), dropout=1.5),
    "flash_attention query not a tensor": lambda: _fa().flash_attention(np.zeros(Q4, np.float32), _z(Q4), _z(Q4)),
    "c_embedding 1-D weight": lambda: _lookup()(_z([10]), _z([2], "int64"), start_index=0),
    "c_embedding negative start_index": lambda: _lookup()(_z((5, 2)), _z([2], "int64"), start_index=-1),
    "c_embedding float start_index": lambda: _lookup()(_z((5, 2)), _z([2], "int64"), start_index=1.5),
    "c_embedding weight not a tensor": lambda: _lookup()(np.ones((5, 2), np.float32), _z([2], "int64")),
    "c_embedding float ids": lambda: _lookup()(_z((5, 2)), _z([2], "float32")),
    "c_embedding int32 weight": lambda: _lookup()(_z((5, 2), "int32"), _z([2], "int64")),
    "c_embedding table of 0 rows": lambda: _lookup()(_z((0, 2)), _z([2], "int64")),
    "c_embedding table of 0 columns": lambda: _lookup()(_z((5, 0)), _z([2], "int64")),
}


@pytest.mark.parametrize("case", sorted(STOCK_REFUSED))
def test_plugin_raises_an_instance_of_what_stock_paddle_raises(case, clean_series):
    call = STOCK_REFUSED[case]
    with pytest.raises(Exception) as stock:
        call()
    if "is not registered" in str(stock.value) and "Selected wrong DataType" not in str(stock.value):
        pytest.skip(f"this Paddle has no CPU kernel for the op at all ({paddle.__version__}): nothing to compare")
    paddle_ext.enable()
    with pytest.raises(Exception) as ours:
        call()
    assert isinstance(ours.value, type(stock.value)), (
        f"stock Paddle raised {type(stock.value).__name__}: {stock.value}; the plugin "
        f"{type(ours.value).__name__}: {ours.value}")
