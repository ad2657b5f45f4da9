"""fleet's VocabParallelEmbedding lookup (mp_ops._c_lookup_table) answered by
paddle_ext.ops.c_embedding, which checks the ids on every device: the wrapper the
c_embedding_check patch unit installs. Static-graph programs keep Paddle's own op.
"""

from __future__ import annotations

import functools

from paddle_ext.ops._modes import in_dynamic_mode
from paddle_ext.ops.c_embedding import c_embedding

OPS = ("pe_c_embedding",)


def checked_lookup_table(original):
    @functools.wraps(original)
    def _c_lookup_table(table, index, start_index=0, vocab_size=-1, name=None):
        if not in_dynamic_mode():
            return original(table, index, start_index=start_index, vocab_size=vocab_size, name=name)
        return c_embedding(table, index, start_index=start_index, vocab_size=vocab_size)

    return _c_lookup_table
