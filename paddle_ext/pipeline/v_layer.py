"""A PipelineLayer segmented for the V placement, built by the plugin on any Paddle release.

Rank r of pp holds stages r and 2*pp-1-r of the LayerDesc list cut into 2*pp parts
(docs/v_placement.md). Paddle 3.3 builds that itself (`PipelineLayer(use_dualpipev=True)`);
2.6.2 - 3.2 have no such option, and the zb-v / dualpipev kinds need it. The plugin's
layer is Paddle's interleaved PipelineLayer (two chunks per rank, `chunk_id` forwards,
PipelineLayerChunk) with two of its steps replaced: the segmentation (stages r and
2*pp-1-r, not r and r+pp) and the stage a layer index belongs to (which the tied-weight
groups are built from). So everything Paddle does with the chunks (seeds per layer index,
SharedLayerDesc, recompute, state dicts) stays Paddle's.

Tied weights: a SharedLayerDesc whose uses all land on one rank (the embedding and the
lm head, both on rank 0 in the V) builds one layer used twice, and Paddle makes no
group for it; one whose uses land on several ranks gets Paddle's broadcast and gradient
all-reduce as usual. A LocalSharedLayerDesc (Paddle 3.3's, or `LocalSharedLayerDesc`
here where Paddle has none) ties a weight on one rank only; here it is that
SharedLayerDesc, so a LocalSharedLayerDesc whose uses land on two ranks is refused.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

from paddle_ext import compat


def v_stage_of(stage: int, pp: int) -> int:
    """The pipeline rank holding V stage `stage` (0 <= stage < 2*pp)."""
    if not 0 <= stage < 2 * pp:
        raise ValueError(f"stage = {stage} is out of range: the V has stages 0 .. {2 * pp - 1} at pp = {pp}")
    return stage if stage < pp else 2 * pp - 1 - stage


def _layer_desc_classes() -> tuple:
    from paddle.distributed.fleet.meta_parallel import LayerDesc, SharedLayerDesc

    return LayerDesc, SharedLayerDesc


@functools.cache
def local_shared_layer_desc_class() -> type:
    """Paddle's LocalSharedLayerDesc (3.3+), else the plugin's class of the same
    signature: (key, layer_func, forward_func=None, shared_weight_attr="weight", *inputs,
    **kwargs)."""
    upstream = compat.upstream_local_shared_layer_desc_class()
    if upstream is not None:
        return upstream
    layer_desc, _ = _layer_desc_classes()

    class LocalSharedLayerDesc(layer_desc):
        """A layer whose `shared_weight_attr` weights are those of the first layer of
        the same key on this rank (the V's embedding and lm head)."""

        def __init__(self, key: str, layer_func: Any, forward_func: Any = None,
                     shared_weight_attr: Any = "weight", *inputs: Any, **kwargs: Any) -> None:
            super().__init__(layer_func, *inputs, **kwargs)
            self.layer_name = key
            self.forward_func = forward_func
            self.shared_weight_attr = [shared_weight_attr] if isinstance(shared_weight_attr, str) else list(
                shared_weight_attr)

    return LocalSharedLayerDesc


def _as_shared(desc: Any) -> Any:
    """A LocalSharedLayerDesc as the SharedLayerDesc that ties the same weight."""
    _, shared = _layer_desc_classes()
    local = local_shared_layer_desc_class()
    if not isinstance(desc, local) or isinstance(desc, shared):
        return desc
    return shared(desc.layer_name, desc.layer_func, desc.forward_func, desc.shared_weight_attr,
                  *desc.inputs, **desc.kwargs)


@functools.cache
def v_pipeline_layer_class() -> type:
    """The plugin's V-segmented PipelineLayer class (a subclass of this Paddle's)."""
    base = compat.pipeline_layer_class()

    class VPipelineLayer(base):
        """PipelineLayer(layers, ..., seg_method) for the V placement; see the module
        docstring. `_use_dualpipev` is True, as on Paddle 3.3's V layer."""

        def __init__(self, layers: Sequence[Any], num_stages: Optional[int] = None, topology: Any = None,
                     loss_fn: Any = None, seg_method: Any = "uniform", recompute_interval: int = 0,
                     recompute_ctx: Any = None) -> None:
            local = local_shared_layer_desc_class()
            descs = [_as_shared(d) for d in layers]
            # before nn.Layer.__init__: plain attributes, read by the segmentation below
            object.__setattr__(self, "_v_seg_method", seg_method)
            object.__setattr__(self, "_v_local_keys", {d.layer_name for d in layers if isinstance(d, local)})
            # Paddle's interleaved constructor wants a "layer:" method; the V segmentation
            # (_segment_network_for_interleave below) uses the caller's.
            super().__init__(layers=descs, num_stages=num_stages, topology=topology, loss_fn=loss_fn,
                             seg_method="layer:", recompute_interval=recompute_interval,
                             recompute_ctx=recompute_ctx, num_virtual_pipeline_stages=2)
            self._use_dualpipev = True

        def _segment_network_for_interleave(self, seg_method: Any) -> None:
            from paddle.distributed.fleet.meta_parallel.parallel_layers.pp_layers import (
                SegmentLayers,
            )

            pp = self._num_stages
            if len(self._layers_desc) < 2 * pp:
                raise ValueError(f"layers: {len(self._layers_desc)} layer descriptions cannot fill the V's "
                                 f"2 * pp_degree = {2 * pp} stages")
            self.segment_parts = SegmentLayers(self._layers_desc, num_parts=2 * pp,
                                               method=self._v_seg_method).do_segment()
            parts, r = self.segment_parts, self._stage_id
            self._start_poss = [parts[r], parts[2 * pp - 1 - r]]
            self._end_poss = [parts[r + 1], parts[2 * pp - r]]
            self._check_local_ties()

        def _check_local_ties(self) -> None:
            ranks: dict = {}
            for idx, desc in enumerate(self._layers_desc):
                if getattr(desc, "layer_name", None) in self._v_local_keys:
                    ranks.setdefault(desc.layer_name, set()).add(self.get_stage_from_index(idx))
            for key, on in ranks.items():
                if len(on) > 1:
                    raise ValueError(f"LocalSharedLayerDesc {key!r}: its uses land on pipeline ranks {sorted(on)}; "
                                     "a local tie must stay on one rank (use SharedLayerDesc across ranks)")

        def get_stage_from_index(self, layer_idx: int) -> int:
            """The pipeline rank holding layer `layer_idx` (the V: stages r and 2*pp-1-r)."""
            parts = self.segment_parts
            for stage in range(len(parts) - 1):
                if parts[stage] <= layer_idx < parts[stage + 1]:
                    return v_stage_of(stage, self._num_stages)
            raise ValueError(f"layer_idx = {layer_idx} is out of range: the layer list has {parts[-1]} layers")

    return VPipelineLayer


def v_pipeline_layer(layers: Sequence[Any], topology: Any = None, loss_fn: Any = None,
                     seg_method: Any = "uniform", num_stages: Optional[int] = None,
                     recompute_interval: int = 0, recompute_ctx: Any = None,
                     native: Optional[bool] = None) -> Any:
    """A V-segmented PipelineLayer from a LayerDesc list, for pp_configs.use_dualpipev /
    schedule_mode "ZBV". native=None: Paddle's own (`use_dualpipev=True`) where this
    Paddle has it, else the plugin's VPipelineLayer; True / False force one (True is
    refused on a Paddle without it)."""
    if native is None:
        native = compat.pipeline_layer_supports_v()
    kwargs = dict(layers=list(layers), num_stages=num_stages, topology=topology, loss_fn=loss_fn,
                  seg_method=seg_method, recompute_interval=recompute_interval, recompute_ctx=recompute_ctx)
    if native:
        if not compat.pipeline_layer_supports_v():
            raise ValueError("native = True: this Paddle's PipelineLayer has no use_dualpipev (Paddle 3.3+); "
                             "leave native unset for the plugin's V layer")
        return compat.pipeline_layer_class()(use_dualpipev=True, **kwargs)
    return v_pipeline_layer_class()(**kwargs)
