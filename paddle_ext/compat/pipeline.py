"""Version differences in fleet's pipeline parallelism: PipelineLayer's loss functions, tied
weights and V placement (3.3), upstream schedule nodes (3.3's contract), the dataset
preprocessor and micro-step hooks (3.0+)."""

from __future__ import annotations

from typing import Any, Optional

from paddle_ext import upstream
from paddle_ext.compat.version import paddle_before


def pipeline_loss_fns(layers: Any) -> list:
    """A PipelineLayer's loss functions: 3.x keeps a list, 2.6 a single callable."""
    loss = layers._loss_fn
    return list(loss) if isinstance(loss, (list, tuple)) else [loss]


def pipeline_shared_weights(layers: Any) -> list[tuple[Any, list[int]]]:
    """(weight, the global ranks of the stages that hold it) for each weight a PipelineLayer
    ties across stages on this rank (its shared_comm: 3.x names the weight attributes in a
    list, 2.6 names one)."""
    out = []
    for comm in (getattr(layers, "shared_comm", None) or {}).values():
        attrs = comm["weight_attr"]
        for attr in ([attrs] if isinstance(attrs, str) else attrs):
            out.append((getattr(comm["layer"], attr), list(comm["ranks"])))
    return out


def pipeline_is_v(layers: Any) -> bool:
    """True for a PipelineLayer segmented for the V placement: Paddle 3.3's
    PipelineLayer(use_dualpipev=True) holds stages r and 2*pp-1-r in _model_chunks[0]
    and [1] (get_num_virtual_stages() stays 1); the plugin's VPipelineLayer
    (pipeline/v_layer.py, any release) the same, with get_num_virtual_stages() 2 (its
    class attribute _paddle_ext_v marks it and every class made with v_segmented)."""
    return bool(getattr(layers, "_use_dualpipev", False) or getattr(layers, "_paddle_ext_v", False))


def pipeline_layer_supports_v() -> bool:
    """Whether this Paddle's PipelineLayer can build the V segmentation
    (use_dualpipev=, Paddle 3.3+; 2.6 - 3.2 have none)."""
    import inspect

    return "use_dualpipev" in inspect.signature(upstream.pipeline_layer_class().__init__).parameters


def upstream_local_shared_layer_desc_class() -> Any:
    """Paddle's LocalSharedLayerDesc (3.3+: a weight tied within one rank of a V layer),
    or None on releases without it (pipeline/v_layer.py has the plugin's)."""
    try:
        from paddle.distributed.fleet.meta_parallel.parallel_layers.pp_layers import (
            LocalSharedLayerDesc,
        )
    except ImportError:
        return None
    return LocalSharedLayerDesc


def upstream_schedule_node_classes():
    """(ScheduleNode, ScheduleChunk) from fleet.meta_parallel where Paddle's backward has
    3.3's contract, or None: 2.6 and 3.0 have no such classes, and 3.1 and 3.2's
    ScheduleNode.backward wants a gradient for every output (a node returning position ids
    beside its hidden states fails: "2 of Tensor vs 1 of Tensor", measured with 3.1.0 and
    3.2.0) and returns a lone input's gradient bare; 3.3 skips the outputs that need none
    and always returns a tuple, as paddle_ext's own classes do."""
    if paddle_before(3, 3):
        return None
    try:
        from paddle.distributed.fleet.meta_parallel.pp_utils.forward_backward_overlap_utils import (
            ScheduleChunk,
            ScheduleNode,
        )
    except ImportError:
        return None
    return ScheduleNode, ScheduleChunk


def pipeline_dataset_preprocessor_classes() -> tuple:
    """(PipelineDatasetPreprocessor,) where Paddle has it (3.x: the callable a trainer
    passes as forward_backward_pipeline's data), () on 2.6."""
    from paddle.distributed.fleet.meta_parallel import pipeline_parallel

    cls = getattr(pipeline_parallel, "PipelineDatasetPreprocessor", None)
    return (cls,) if cls is not None else ()


def pipeline_micro_step_hook_api() -> Optional[tuple]:
    """(PipelineHook, the global PipelineParallelMicroStepCallback, PipelineParallelMicro-
    StepLocations) of Paddle's PipelineParallel (3.0+), or None (2.6 has no user hooks)."""
    from paddle.distributed.fleet.meta_parallel import pipeline_parallel

    callbacks = getattr(pipeline_parallel, "pipeline_parallel_callbacks_", None)
    hook_cls = getattr(pipeline_parallel, "PipelineHook", None)
    if callbacks is None or hook_cls is None:
        return None
    return hook_cls, callbacks, pipeline_parallel.PipelineParallelMicroStepLocations
