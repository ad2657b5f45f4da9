"""c_embedding with an id range check (upstream #55621).

The lookup of a vocabulary-parallel embedding: this rank holds rows
[start_index, start_index + rows) of a table of vocab_size rows; ids in that
range take their row, all other ids give zeros (another rank owns them, and an
all-reduce over the model-parallel group completes the lookup). Unlike stock
Paddle's CPU kernel, an id outside [0, vocab_size) (a negative id, for a
negative vocab_size) raises, as Paddle's GPU kernel does, instead of giving
silent zeros.
"""

from __future__ import annotations

import re

import numpy as np

from paddle_ext import compat
from paddle_ext.ops import _library
from paddle_ext.ops._checks import (
    InvalidArgumentError,
    require_dtype,
    require_int,
    require_ndim,
    require_tensor,
    same_place,
)

# Every dtype Paddle's c_embedding kernels take (CPU: all but bfloat16; GPU: all).
TABLE_DTYPES = ("float32", "float64", "float16", "bfloat16", "complex64", "complex128")
ID_DTYPES = ("int32", "int64")
_BAD_ID = re.compile(r"paddle_ext\.c_embedding: id (-?\d+) at position (\d+) of ids")


def c_embedding(weight, ids, start_index: int = 0, vocab_size: int = -1):
    """Looks ids up in this rank's slice `weight` of a vocabulary-parallel table.

    Args:
        weight: [rows, width] float32, float64, float16, bfloat16, complex64 or
            complex128; rows of the table from start_index on.
        ids: int32 or int64 of any shape.
        start_index: the vocabulary id of weight's first row (>= 0).
        vocab_size: rows of the whole table; every id must lie in [0,
            vocab_size), or, with a negative vocab_size (-1, the default), be
            >= 0 (Paddle's GPU kernel checks `id >= 0 && (vocab_size < 0 ||
            id < vocab_size)`; its CPU kernel checks nothing).
            As in Paddle's GPU kernel, weight's rows need not fit inside it
            (start_index + rows may exceed vocab_size): ids in [start_index,
            start_index + rows) take their row either way.

    Returns:
        ids.shape + [width], weight's dtype. Differentiable in weight: the grad
        is a scatter-add of the output grad rows of in-range ids (duplicates
        accumulate in the order of the ids, from +0: float32, float64 and the
        complex dtypes give Paddle's bits; float16 / bfloat16 sum in float32).

    Raises:
        InvalidArgumentError (a ValueError): weight has no rows or no columns,
            which Paddle's shape inference refuses on every device.
        IndexError: an id is negative or (vocab_size >= 0) not below
            vocab_size; the message names the id, its position in ids and the
            range.
    """
    require_tensor("weight", weight)
    require_tensor("ids", ids)
    require_ndim("weight", weight, 2)
    require_dtype("weight", weight, TABLE_DTYPES)
    require_dtype("ids", ids, ID_DTYPES)
    _require_nonempty_table(weight)
    require_int("start_index", start_index, low=0)
    require_int("vocab_size", vocab_size)
    if not same_place(weight, ids):
        raise InvalidArgumentError(f"weight and ids must be on the same device, got {weight.place} and {ids.place}")
    if 0 in ids.shape:  # no id to check (the custom-op runner of 2.6 and 3.0 refuses empty outputs)
        return compat.empty_embedding_lookup(weight, ids, start_index, vocab_size)
    try:
        (out,) = _library.run("pe_c_embedding", weight, ids, start_index, vocab_size)
    except Exception as err:  # the kernel's PD_CHECK arrives as OSError (3.x) or another type
        match = _BAD_ID.search(str(err))
        if match is None:
            raise
        bad_id, flat = int(match.group(1)), int(match.group(2))
        where = tuple(int(i) for i in np.unravel_index(flat, tuple(ids.shape))) if ids.ndim else ()
        allowed = (f"[0, vocab_size) = [0, {vocab_size})" if vocab_size >= 0 else
                   f"[0, inf) (vocab_size = {vocab_size} < 0 lifts only the upper bound)")
        raise IndexError(f"c_embedding: ids{list(where)} = {bad_id} is out of range: ids must lie in {allowed}") from None
    return out


def _require_nonempty_table(weight) -> None:
    """weight needs a row and a column: Paddle's CEmbeddingInferMeta
    (paddle/phi/infermeta/binary.cc) enforces `height > 0 && width > 0` with
    InvalidArgument (ValueError) before any kernel, on CPU and GPU alike. A static
    program's unknown dimension (-1) is left to the executor."""
    rows, width = (int(d) for d in weight.shape)
    if rows == 0 or width == 0:
        raise InvalidArgumentError(
            f"weight must have rows >= 1 and columns >= 1 (Paddle's c_embedding refuses an empty table), got "
            f"shape {list(weight.shape)}")
