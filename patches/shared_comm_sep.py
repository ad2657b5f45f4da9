"""cherry from: [Distribtued] Pp shared weights attrs subset (#71717), which rebuilt
PipelineLayer._construct_shared_comm over the topology's pipe lines (in Paddle 3.1.0's wheel,
not in 3.0.0's), with its comm-group follow-up (#72187).

Paddle 2.6 and 3.0 build a tied weight's groups from dp x sharding x mp, each rank keeping its
own sep coordinate, so a pipeline with `sep_degree > 1` and a SharedLayerDesc (an embedding
tied to the lm head: every GPT/Llama pipe of PaddleFormers with tied embeddings) could not be
built: the sep halves create different member lists under one group id (on gloo
"Connection refused" inside PipelineLayer's constructor, measured without the plugin). This
unit builds those groups over the pipe lines, as 3.1 does, wherever a sep axis has more than
one rank; otherwise Paddle's own construction runs, unchanged. Only the groups are 3.1's: the
attribute-subset semantics of #71717 are not carried.
"""

from __future__ import annotations

import functools

from paddle_ext import upstream
from paddle_ext.patches._unit import Patcher, PatchUnit
from paddle_ext.pipeline.shared_comm import needs_pipe_line_groups, pipe_line_shared_comm

NATIVE_FROM = (3, 1)


def _over_pipe_lines(original):
    @functools.wraps(original)
    def _construct_shared_comm(self):
        if not needs_pipe_line_groups(self):
            return original(self)
        return pipe_line_shared_comm(self)
    return _construct_shared_comm


def _apply(patcher: Patcher) -> None:
    cls = upstream.pipeline_layer_class()
    patcher.swap(cls, "_construct_shared_comm", _over_pipe_lines(cls._construct_shared_comm))


UNIT = PatchUnit(
    name="shared_comm_sep",
    upstream=(71717, 72187),
    title="tied-weight groups of a PipelineLayer over the pipe lines (sep included)",
    summary="a pipeline with sep_degree > 1 and tied weights builds on Paddle 2.6 and 3.0",
    apply=_apply,
    native_from=NATIVE_FROM,
)
