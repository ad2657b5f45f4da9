"""part-6 cherry from: [Distributed] Support forward backward overlap schdule for VPP (#71995).

Upstream #71995 (Paddle 3.1) lets a PipelineLayer subclass define
`overlapped_forward_backward(forward_chunk, forward_inputs, forward_loss_fn_node,
backward_chunk, backward_loss_fn_node, backward_input_grads, scaler,
p2p_async_handle=None)`, run for each steady-state forward/backward pair when
pp_configs.forward_backward_overlap_scheduler is on; the chunks and the loss node it
gets are ScheduleChunk / ScheduleNode objects (#71665) built by
`PipelineLayer.get_schedule_chunk` and the loss's `build_schedule_node()`.

The schedule and its execution live in paddle_ext's PipelineEngine (unit
pipeline_engine: any pp, 1F1B too, unbalanced accumulate_steps, gloo). This unit
adds the model-facing half where Paddle lacks it and widens it where Paddle has it:

- Paddle 2.6 / 3.0: `ScheduleNode` and `ScheduleChunk` in
  paddle.distributed.fleet.meta_parallel (paddle_ext's classes, same interface), so
  model code written for upstream imports them unchanged;
- every release: `PipelineLayer.get_schedule_chunk` / `build_schedule_nodes` from
  paddle_ext.pipeline.nodes, which also take run-function entries without
  `build_schedule_node()` (a SharedLayerDesc `forward_func`, e.g. a head tied to the
  embedding) as one node each, where upstream asserts.
"""

from __future__ import annotations

from paddle_ext import upstream
from paddle_ext.patches._unit import Patcher, PatchUnit


def _get_schedule_chunk(self, chunk_id=None):
    from paddle_ext.pipeline import nodes

    return nodes.schedule_chunk(self, chunk_id)


def _build_schedule_nodes(self, start, end):
    from paddle_ext.pipeline import nodes

    return nodes.build_schedule_nodes(self, start, end)


def _apply(patcher: Patcher) -> None:
    from paddle_ext.pipeline import nodes

    meta_parallel = upstream.meta_parallel_module()
    for name, cls in (("ScheduleNode", nodes.ScheduleNode), ("ScheduleChunk", nodes.ScheduleChunk)):
        if not hasattr(meta_parallel, name):
            patcher.swap(meta_parallel, name, cls)
    layer_cls = upstream.pipeline_layer_class()
    patcher.swap(layer_cls, "get_schedule_chunk", _get_schedule_chunk)
    patcher.swap(layer_cls, "build_schedule_nodes", _build_schedule_nodes)


UNIT = PatchUnit(
    name="fb_overlap",
    upstream=(71995,),
    title="Support forward backward overlap schdule for VPP",
    summary="ScheduleNode/ScheduleChunk on every release; get_schedule_chunk that takes tied heads",
    apply=_apply,
)
