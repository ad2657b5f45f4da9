"""Schedule nodes for the forward/backward overlap scheduler, from one place.

    from paddle_ext.pipeline.nodes import ScheduleNode, ScheduleChunk

are Paddle's own classes where Paddle has them with 3.3's backward (fleet.meta_parallel)
and paddle_ext's equivalents elsewhere (2.6, 3.0, and 3.1 / 3.2, whose backward wants a
gradient for every output: compat.upstream_schedule_node_classes;
runtime/schedule_nodes.py), so a model's `build_schedule_node()` and
`overlapped_forward_backward` are written once.
With paddle_ext enabled, the `fb_overlap` patch unit also makes
`from paddle.distributed.fleet.meta_parallel import ScheduleNode, ScheduleChunk`
work on those releases, as upstream code writes it.

`schedule_chunk(layers, chunk_id)` builds what upstream's
`PipelineLayer.get_schedule_chunk` builds: one node per entry of the chunk's run
function, each from the entry's `build_schedule_node()`. Unlike upstream it also
takes entries without that method (a SharedLayerDesc's `forward_func`, e.g. a head
tied to the embedding), as one node each. `loss_node(loss_fn)` does the same for the
loss: `loss_fn.build_schedule_node()` where defined.
"""

from __future__ import annotations

from typing import Any

from paddle_ext import compat
from paddle_ext.pipeline import layer_internals

_classes = compat.upstream_schedule_node_classes()
if _classes is None:
    from paddle_ext.pipeline.runtime.schedule_nodes import ScheduleChunk, ScheduleNode
else:
    ScheduleNode, ScheduleChunk = _classes

UPSTREAM = _classes is not None  # True when these are Paddle's own classes

__all__ = ["ScheduleNode", "ScheduleChunk", "UPSTREAM", "schedule_chunk", "loss_node",
           "build_schedule_nodes"]


def _node_of(fn: Any, index: int) -> Any:
    build = getattr(fn, "build_schedule_node", None)
    if build is not None:
        return build()
    name = getattr(getattr(fn, "func", fn), "__name__", type(fn).__name__)
    return ScheduleNode(fn, name=f"{index}:{name}")


def build_schedule_nodes(layers: Any, start: int, end: int, chunk_id: Any = None) -> Any:
    """A ScheduleChunk of run-function entries [start, end) of `chunk_id`."""
    run_function = layer_internals.pipeline_run_function(layers, chunk_id)
    return ScheduleChunk(nodes=[_node_of(fn, start + i)
                                for i, fn in enumerate(run_function[start:end])])


def schedule_chunk(layers: Any, chunk_id: Any = None) -> Any:
    """The ScheduleChunk of model chunk `chunk_id` (None when the layer has one chunk)."""
    interval = layer_internals.pipeline_recompute_interval(layers)
    if interval != 0:
        raise ValueError(f"the forward/backward overlap scheduler needs recompute_interval == 0 "
                         f"(the PipelineLayer has {interval}), as upstream: a model that "
                         "recomputes can do so inside its schedule nodes")
    run_function = layer_internals.pipeline_run_function(layers, chunk_id)
    return build_schedule_nodes(layers, 0, len(run_function), chunk_id)


def loss_node(loss_fn: Any) -> Any:
    """The loss as a schedule node (its `build_schedule_node()` where it has one)."""
    build = getattr(loss_fn, "build_schedule_node", None)
    return build() if build is not None else ScheduleNode(loss_fn, name="loss_fn")
