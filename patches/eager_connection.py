"""part-8 cherry from: [Distributed] support eager communication connection (#57517).

With FLAGS_eager_communication_connection on, upstream creates the pipeline group's
p2p communicators when fleet builds its topology. This unit connects every group
fleet.init made (data, model, sharding, sep, pipeline: collectives and, for the
pipeline group, p2p), on Paddle 2.6 too, where the flag is read from the
environment; paddle_ext's PipelineEngine connects its own pipeline links the same way
(paddle_ext.comm.eager). Gloo connects each group when it is created; its process
group gets eager_connect methods that say so, because Paddle 3.x's fleet.init calls
eager_connect_ring_exchange(nccl_config=...) with the flag on, which the gloo binding
rejects (TypeError: fleet.init failed on CPU).
"""

from __future__ import annotations

import functools

from paddle_ext import upstream
from paddle_ext.comm import eager
from paddle_ext.patches._unit import Patcher, PatchUnit


def _connecting_init(original):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if eager.enabled():
            pipe = self.get_pipe_parallel_group()
            others = [g for gid, g in sorted(upstream.group_map().items()) if g is not pipe]
            eager.connect(others)
            eager.connect([pipe], p2p=True)
    return __init__


def _gloo_connected(self, *args, **kwargs):
    """Gloo connected this group's full mesh when it was constructed: nothing to do."""


def _apply(patcher: Patcher) -> None:
    cls = upstream.hybrid_communicate_group_class()
    patcher.swap(cls, "__init__", _connecting_init(cls.__init__))
    gloo = upstream.gloo_process_group_class()
    if gloo is not None:
        # Paddle 3.x's topology calls eager_connect_ring_exchange(nccl_config=...) on the
        # pipeline group when the flag is on; the gloo binding takes no argument, so
        # fleet.init raised TypeError on CPU.
        for name in ("eager_connect", "eager_connect_ring_exchange"):
            patcher.swap(gloo, name, _gloo_connected)


UNIT = PatchUnit(
    name="eager_connection",
    upstream=(57517,),
    title="support eager communication connection",
    summary="FLAGS_eager_communication_connection connects every fleet group at init, on 2.6 too",
    apply=_apply,
)
