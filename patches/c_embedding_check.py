"""part-3 cherry from: add check for cembedding (#55621).

Upstream added the id range check to the GPU c_embedding kernel only; stock
CPU kernels still return zeros for ids outside the vocabulary, and no release
has a bfloat16 CPU kernel. This unit routes fleet's VocabParallelEmbedding
lookup (mp_ops._c_lookup_table) through paddle_ext.ops.c_embedding, which
checks on every device. Static-graph programs keep Paddle's own op.
"""

from __future__ import annotations

import functools

from paddle_ext import compat
from paddle_ext.ops import _library
from paddle_ext.ops.c_embedding import c_embedding
from paddle_ext.patches._unit import Patcher, PatchUnit


def _checked_lookup_table(original):
    @functools.wraps(original)
    def _c_lookup_table(table, index, start_index=0, vocab_size=-1, name=None):
        if not compat.in_dynamic_mode():
            return original(table, index, start_index=start_index, vocab_size=vocab_size, name=name)
        return c_embedding(table, index, start_index=start_index, vocab_size=vocab_size)

    _c_lookup_table.__paddle_ext_unit__ = "c_embedding_check"
    return _c_lookup_table


def _apply(patcher: Patcher) -> None:
    mp_ops = compat.mp_ops_module()
    patcher.swap(mp_ops, "_c_lookup_table", _checked_lookup_table(mp_ops._c_lookup_table))


def _verify() -> bool:
    lookup = compat.mp_ops_module()._c_lookup_table
    return getattr(lookup, "__paddle_ext_unit__", None) == "c_embedding_check"


def _unavailable() -> str | None:
    try:
        _library.load()
    except _library.OpLibraryError as err:
        return str(err)
    return None


UNIT = PatchUnit(
    name="c_embedding_check",
    upstream=(55621,),
    title="add check for cembedding",
    summary="VocabParallelEmbedding lookups raise on ids outside [0, vocab_size), on CPU too",
    apply=_apply,
    verify=_verify,
    unavailable=_unavailable,
)
