"""Every difference between the supported Paddle releases (2.6.2, 3.0-3.3.x).

Nothing else in paddle_ext branches on the Paddle version: when a new
difference turns up, it gets a function here.
"""

from __future__ import annotations

import functools
from typing import Any

SUPPORTED = ((2, 6), (3, 0), (3, 1), (3, 2), (3, 3))


@functools.cache
def paddle_version() -> tuple[int, int, int]:
    import paddle

    parts = paddle.__version__.split(".")[:3]
    nums = []
    for p in parts:
        digits = "".join(ch for ch in p if ch.isdigit())
        nums.append(int(digits) if digits else 0)
    while len(nums) < 3:
        nums.append(0)
    return tuple(nums)  # type: ignore[return-value]


def version_string() -> str:
    import paddle

    return paddle.__version__


def is_supported(version: tuple[int, int, int] | None = None) -> bool:
    v = version or paddle_version()
    # 0.0.0 is a develop build: assume the newest API.
    return v[:2] in SUPPORTED or v == (0, 0, 0)


def device_build() -> str:
    """'cuda', 'rocm', 'xpu' or 'cpu': what the installed Paddle was compiled for."""
    import paddle

    if paddle.is_compiled_with_rocm():
        return "rocm"
    if paddle.is_compiled_with_cuda():
        return "cuda"
    if paddle.is_compiled_with_xpu():
        return "xpu"
    return "cpu"


def in_dynamic_mode() -> bool:
    import paddle

    return paddle.in_dynamic_mode()


@functools.cache
def _custom_op_runner():
    # 3.x exposes the eager custom-op entry as _C_ops._run_custom_op; 2.6 as core.eager's.
    from paddle import _C_ops

    runner = getattr(_C_ops, "_run_custom_op", None)
    if runner is None:
        from paddle.base import core

        runner = core.eager._run_custom_op
    return runner


def run_custom_op(op_name: str, *args: Any) -> list:
    """Runs a registered custom op eagerly; always returns the list of outputs."""
    outs = _custom_op_runner()(op_name, *args)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def register_custom_op_library(path: str) -> None:
    import warnings

    with warnings.catch_warnings():  # importing cpp_extension warns that ccache is missing
        warnings.simplefilter("ignore")
        from paddle.utils.cpp_extension.extension_utils import load_op_meta_info_and_register_op

    load_op_meta_info_and_register_op(path)


def mp_ops_module():
    """The module whose _c_lookup_table fleet's VocabParallelEmbedding calls."""
    from paddle.distributed.fleet.layers.mpu import mp_ops

    return mp_ops


def gloo_process_group_class():
    """The pybind class of gloo process groups, or None in builds without gloo."""
    from paddle.base import core

    return getattr(core, "ProcessGroupGloo", None)


def c_identity_owners() -> list:
    """Modules whose `c_identity` fleet's model-parallel code calls: 3.x uses
    _C_ops (and _legacy_C_ops in places), 2.6 only _legacy_C_ops."""
    import paddle

    return [m for m in (getattr(paddle, "_C_ops", None), getattr(paddle, "_legacy_C_ops", None))
            if m is not None and hasattr(m, "c_identity")]


def pipeline_loss_fns(layers: Any) -> list:
    """A PipelineLayer's loss functions: 3.x keeps a list, 2.6 a single callable."""
    loss = layers._loss_fn
    return list(loss) if isinstance(loss, (list, tuple)) else [loss]


def fleet_modules() -> tuple:
    """(paddle.distributed.fleet, paddle.distributed.fleet.model): both expose distributed_model."""
    import paddle.distributed.fleet as fleet
    import paddle.distributed.fleet.model as fleet_model

    return fleet, fleet_model


def parallel_env_class():
    from paddle.distributed.parallel import ParallelEnv

    return ParallelEnv


def pipeline_layer_class():
    from paddle.distributed.fleet.meta_parallel import PipelineLayer

    return PipelineLayer


def fleet_hcg():
    """The HybridCommunicateGroup fleet.init built, or None."""
    import paddle.distributed.fleet as fleet

    return getattr(fleet.fleet, "_hcg", None)


def fleet_strategy():
    import paddle.distributed.fleet as fleet

    return fleet.fleet._user_defined_strategy


def collective_module():
    """paddle.distributed.collective: where new_group lives (paddle.distributed re-exports it)."""
    import paddle.distributed.collective as collective

    return collective


def distributed_strategy_class():
    from paddle.distributed.fleet import DistributedStrategy

    return DistributedStrategy



def pp_config_message(strategy: Any) -> Any:
    """The protobuf message behind strategy.hybrid_configs['pp_configs']."""
    return strategy.strategy.hybrid_configs.pp_configs
