"""part-3 cherry from: add check for cembedding (#55621).

Upstream added the id range check to the GPU c_embedding kernel only; stock
CPU kernels still return zeros for ids outside the vocabulary, and no release
has a bfloat16 CPU kernel. This unit routes fleet's VocabParallelEmbedding
lookup (mp_ops._c_lookup_table) through paddle_ext.ops.c_embedding, which
checks on every device (the wrapper: paddle_ext.ops.routes.c_embedding). Static-graph
programs keep Paddle's own op.
"""

from __future__ import annotations

from paddle_ext import upstream
from paddle_ext.ops.routes import c_embedding as routes
from paddle_ext.patches._unit import Patcher, PatchUnit, Wrap, install

TABLE = (Wrap(upstream.mp_ops_module, "_c_lookup_table", routes.checked_lookup_table),)


def _apply(patcher: Patcher) -> None:
    install(patcher, TABLE)


UNIT = PatchUnit(
    name="c_embedding_check",
    upstream=(55621,),
    title="add check for cembedding",
    summary="VocabParallelEmbedding lookups raise on ids outside [0, vocab_size), on CPU too",
    apply=_apply,
    requires_ops=routes.OPS,
)
