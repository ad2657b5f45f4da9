"""Reads of a fleet PipelineLayer's internals that are the same in every supported release
(its run functions, VPP chunks, recompute interval, shared layers); where the releases
differ (loss functions, tied weights, the V placement) paddle_ext.compat reads them."""

from __future__ import annotations

from typing import Any

from paddle_ext import compat


def pipeline_run_function(layers: Any, chunk_id: Any = None) -> list:
    """The callables a PipelineLayer runs for `chunk_id` (None: the only chunk). Both
    2.6 and 3.x keep VPP chunks in `_model_chunks[i].get_run_function()`."""
    if chunk_id is None or (layers.get_num_virtual_stages() <= 1 and not compat.pipeline_is_v(layers)):
        return list(layers.run_function)
    return list(layers._model_chunks[chunk_id].get_run_function())


def pipeline_recompute_interval(layers: Any) -> int:
    return int(getattr(layers, "_recompute_interval", 0) or 0)


def pipeline_model_chunks(layers: Any) -> list:
    """A PipelineLayer's model chunks on this rank: its virtual-stage chunks with VPP,
    else the layer itself (2.6 and 3.x: get_model_chunks() is None without VPP)."""
    if compat.pipeline_is_v(layers):  # get_model_chunks() is None there: one "virtual stage"
        return list(layers._model_chunks)
    chunks = layers.get_model_chunks() if layers.get_num_virtual_stages() > 1 else None
    return list(chunks) if chunks else [layers]


def pipeline_shared_layer_params(layers: Any) -> list:
    """Parameters of the PipelineLayer's shared (tied) layers on this rank: both
    releases keep those layers in `shared_layers` (3.x also in shared_comm[key]['layer'])."""
    shared = getattr(layers, "shared_layers", None) or {}
    params, seen = [], set()
    for layer in shared.values():
        for p in layer.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params
