"""How fleet hands models and strategies to paddle_ext's engine: the wrappers the
pipeline_engine patch unit installs (patches/pipeline_engine.py says what and why).
"""

from __future__ import annotations

import functools
import weakref

from paddle_ext import upstream

# The distributed_model wrappers made here (engine_serves asks whether fleet's is one).
_ENTRIES: weakref.WeakSet = weakref.WeakSet()


def engine_distributed_model(original):
    """fleet.distributed_model that returns paddle_ext's PipelineEngine for a PipelineLayer
    under pp_degree > 1, and Paddle's answer for anything else."""
    @functools.wraps(original)
    def distributed_model(model):
        from paddle_ext.pipeline.engine import PipelineEngine, PipelineSettings

        hcg = upstream.fleet_hcg()
        if (hcg is not None and hcg.get_pipe_parallel_world_size() > 1
                and isinstance(model, upstream.pipeline_layer_class())):
            strategy = upstream.fleet_strategy()
            return PipelineEngine(model, hcg, PipelineSettings.from_strategy(strategy), strategy)
        return original(model)

    _ENTRIES.add(distributed_model)
    return distributed_model


def engine_serves() -> bool:
    """Whether fleet.distributed_model is engine_distributed_model's (the Trainers' dp overlap,
    paddle_ext.trainer_overlap, is lifted only then)."""
    fleet, _ = upstream.fleet_modules()
    return fleet.distributed_model in _ENTRIES


def device_id(self) -> int:
    """ParallelEnv.device_id: PipelineLayer reads it, a CPU build never sets it."""
    # Set only when a GPU/XPU/custom device was selected; CPU runs use 0.
    return getattr(self, "_device_id", 0)


def checked_hybrid_configs(original: property) -> property:
    """DistributedStrategy.hybrid_configs taking Paddle 3.3's pp_configs keys on every release
    (paddle_ext.config: kept beside the strategy where the protobuf lacks them)."""
    def get_hybrid_configs(self):
        from paddle_ext import config

        return config.with_pp_configs_view(self, original.fget(self))

    def set_hybrid_configs(self, configs):
        from paddle_ext import config

        if isinstance(configs, dict) and "pp_configs" in configs:
            native = {f.name for f in upstream.pp_config_message(self).DESCRIPTOR.fields}
            configs = {**configs, "pp_configs": config.split_pp_configs(self, configs["pp_configs"], native)}
        original.fset(self, configs)

    return property(get_hybrid_configs, set_hybrid_configs, original.fdel, original.__doc__)
