"""part-5 cherry from: [Distributed]Add unbalance batch for virtual pp (#58383).

Upstream #58383 let interleaved VPP take accumulate_steps that are not a
multiple of pp_degree (the first group of micro-batches takes acc % pp + pp).
This unit goes further and replaces fleet's PipelineParallel classes with
paddle_ext's PipelineEngine: one schedule IR for FthenB, 1F1B (any accumulate_steps
>= 1, as fleet's) and interleaved VPP with any accumulate_steps >= pp_degree
(pp_degree = 2 with VPP included),
and a runtime that runs on gloo (CPU) as on NCCL. Also: PipelineLayer reads
ParallelEnv().device_id, which a CPU build never sets; and strategy
hybrid_configs['pp_configs'] accepts Paddle 3.3's keys on every release (kept
beside the strategy where the protobuf lacks them), in the dict form and, as 3.x
code sets them, as attributes of strategy.hybrid_configs["pp_configs"]
(config.PpConfigsView on 2.6); unknown ones are ignored, as
3.x ignores them, with a warning naming them, and values are taken as the protobuf
takes them (1 for True).

The engine also carries #55651 (dp/sharding overlap in virtual pp), #56096 (dp and
sharding together) and #57048 (fused gradient buffers): it reduces the gradients over
dp and sharding itself, in fused buckets, overlapped with the backward under
pp_configs.dp_comm_overlap / sharding_comm_overlap (pipeline/grad_sync.py).
"""

from __future__ import annotations

from paddle_ext import upstream
from paddle_ext.patches._unit import Patcher, PatchUnit
from paddle_ext.pipeline import fleet_entry


def _apply(patcher: Patcher) -> None:
    strategy_cls = upstream.distributed_strategy_class()
    patcher.swap(strategy_cls, "hybrid_configs",
                 fleet_entry.checked_hybrid_configs(vars(strategy_cls)["hybrid_configs"]))
    fleet, fleet_model = upstream.fleet_modules()
    wrapped = fleet_entry.engine_distributed_model(fleet_model.distributed_model)
    patcher.swap(fleet_model, "distributed_model", wrapped)
    patcher.swap(fleet, "distributed_model", wrapped)
    patcher.swap(upstream.parallel_env_class(), "device_id", property(fleet_entry.device_id))


UNIT = PatchUnit(
    name="pipeline_engine",
    upstream=(58383, 55651, 56096, 57048, 63167, 57715, 69985, 53831, 54586),
    title="Add unbalance batch for virtual pp",
    summary="fleet.distributed_model returns paddle_ext's PipelineEngine for pp_degree > 1",
    apply=_apply,
)
