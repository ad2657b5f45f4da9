"""Where Paddle keeps the modules, classes and objects paddle_ext reads or replaces.

The same in every supported release (2.6.2, 3.0-3.3.x): one place that names them, so a
patch unit or an implementation asks for "fleet's PipelineLayer" rather than spelling its
import path. Where the releases differ, the function lives in paddle_ext.compat instead.
"""

from __future__ import annotations

from typing import Any


def mp_ops_module():
    """The module whose _c_lookup_table fleet's VocabParallelEmbedding calls."""
    from paddle.distributed.fleet.layers.mpu import mp_ops

    return mp_ops


def gloo_process_group_class():
    """The pybind class of gloo process groups, or None in builds without gloo."""
    from paddle.base import core

    return getattr(core, "ProcessGroupGloo", None)


def process_group_classes() -> list:
    """The pybind ProcessGroup base and every backend subclass this build has."""
    from paddle.base import core

    names = ("ProcessGroup", "ProcessGroupGloo", "ProcessGroupNCCL", "ProcessGroupBKCL", "ProcessGroupCustom")
    return [getattr(core, n) for n in names if hasattr(core, n)]


def collective_module():
    """paddle.distributed.collective: where new_group lives (paddle.distributed re-exports it)."""
    import paddle.distributed.collective as collective

    return collective


def parallel_module():
    """paddle.distributed.parallel: init_parallel_env calls its own _set_default_store."""
    import paddle.distributed.parallel as parallel

    return parallel


def group_map() -> dict:
    """gid -> Group for every group paddle.distributed made so far (0: the global one),
    read without creating anything (collective._group_map on 2.6 and 3.x)."""
    from paddle.distributed import collective

    return dict(getattr(collective, "_group_map", {}))


def job_store() -> Any:
    """The job's TCPStore once init_parallel_env made it, else None."""
    from paddle.distributed import collective

    return getattr(collective, "_default_store", None)


def global_rank() -> int:
    import paddle.distributed as dist

    return dist.get_rank()


def parallel_env_class():
    from paddle.distributed.parallel import ParallelEnv

    return ParallelEnv


def fleet_modules() -> tuple:
    """(paddle.distributed.fleet, paddle.distributed.fleet.model): both expose distributed_model."""
    import paddle.distributed.fleet as fleet
    import paddle.distributed.fleet.model as fleet_model

    return fleet, fleet_model


def fleet_hcg():
    """The HybridCommunicateGroup fleet.init built, or None."""
    import paddle.distributed.fleet as fleet

    return getattr(fleet.fleet, "_hcg", None)


def fleet_strategy():
    import paddle.distributed.fleet as fleet

    return fleet.fleet._user_defined_strategy


def distributed_strategy_class():
    from paddle.distributed.fleet import DistributedStrategy

    return DistributedStrategy


def pp_config_message(strategy: Any) -> Any:
    """The protobuf message behind strategy.hybrid_configs['pp_configs']."""
    return strategy.strategy.hybrid_configs.pp_configs


def hybrid_communicate_group_class():
    from paddle.distributed.fleet.base.topology import HybridCommunicateGroup

    return HybridCommunicateGroup


def meta_parallel_module():
    """paddle.distributed.fleet.meta_parallel: where upstream exports ScheduleNode."""
    import paddle.distributed.fleet.meta_parallel as meta_parallel

    return meta_parallel


def pipeline_layer_class():
    from paddle.distributed.fleet.meta_parallel import PipelineLayer

    return PipelineLayer


def recompute_modules() -> tuple[Any, Any]:
    """(recompute, recompute_hybrid): the modules of paddle.distributed.fleet.recompute
    (the package's names `recompute` / `recompute_hybrid` are the functions)."""
    import importlib

    package = "paddle.distributed.fleet.recompute"
    return importlib.import_module(f"{package}.recompute"), importlib.import_module(f"{package}.recompute_hybrid")


def hybrid_recompute_layer() -> Any:
    """recompute_hybrid's PyLayer (_HPRecomputeFunction): its backward brings offloaded /
    partitioned inputs back with Tensor.cuda() on every release."""
    return recompute_modules()[1]._HPRecomputeFunction
