"""A PipelineLayer segmented for the V placement, built by the plugin on any Paddle release.

Rank r of pp holds stages r and 2*pp-1-r of the LayerDesc list cut into 2*pp parts
(docs/v_placement.md). Paddle 3.3 builds that itself (`PipelineLayer(use_dualpipev=True)`);
2.6.2 - 3.2 have no such option, and the zb-v / dualpipev kinds need it. The plugin's
layer is Paddle's interleaved PipelineLayer (two chunks per rank, `chunk_id` forwards,
PipelineLayerChunk) with two of its steps replaced: the segmentation (stages r and
2*pp-1-r, not r and r+pp) and the stage a layer index belongs to (which the tied-weight
groups are built from). So everything Paddle does with the chunks (seeds per layer index,
SharedLayerDesc, recompute, state dicts) stays Paddle's.

Tied weights (a key whose uses all land on one rank, as the V's embedding and lm head on
rank 0; every rank rewrites the same descriptions): a LocalSharedLayerDesc builds its
layer with the first use's weights passed in, as Paddle 3.3 does (one parameter); a
SharedLayerDesc of the same class is the one layer used again, as Paddle's shared layer;
one of another class (PaddleFormers' EmbeddingPipe / LMHeadPipe) builds its own layer,
its weights set from the first's and both given the sum of the two gradients after the
step, as Paddle ties two ranks (broadcast, then all-reduce). A LocalSharedLayerDesc
whose uses land on two ranks is refused; a SharedLayerDesc spread over ranks stays
Paddle's (its groups built from this layer's stage map).
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

from paddle_ext import compat, upstream


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
    paddles = compat.upstream_local_shared_layer_desc_class()
    if paddles is not None:
        return paddles
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


class _TieGroup:
    """The uses of one tied key that all land on this V's one rank."""

    def __init__(self, key: str, attrs: list) -> None:
        self.key, self.attrs = key, attrs
        self.first: Any = None
        self.copies: list = []   # "copy" uses: own parameters, kept equal (see _tied_desc_class)


@functools.cache
def _tied_desc_class() -> type:
    import paddle.nn as nn

    layer_desc, _ = _layer_desc_classes()

    class ForwardWith(nn.Layer):
        """A tied layer run through the desc's forward_func (as Paddle's partial does)."""

        def __init__(self, inner: Any, forward_func: Any) -> None:
            super().__init__()
            self.inner = inner
            self._forward_func = forward_func

        def forward(self, *args: Any) -> Any:
            return self._forward_func(self.inner, *args)

    class TiedDesc(layer_desc):
        """One use of a tie that stays on one rank. role: "first" builds the layer; "same"
        is that layer again (a SharedLayerDesc of the same class: Paddle's one shared
        layer); "param" builds its own layer with the first's weights passed in (a
        LocalSharedLayerDesc, as Paddle 3.3 builds it); "copy" builds its own layer whose
        weights start as the first's and take the sum of both gradients (a SharedLayerDesc
        of another class, as Paddle ties two ranks: broadcast, then all-reduce)."""

        def __init__(self, desc: Any, group: _TieGroup, role: str) -> None:
            super().__init__(desc.layer_func, *desc.inputs, **desc.kwargs)
            self.layer_name, self.forward_func, self.shared_weight_attr = desc.layer_name, desc.forward_func, group.attrs
            self.group, self.role = group, role

        def build_layer(self, **extra: Any) -> Any:
            group = self.group
            if self.role == "same":
                layer = group.first
            elif self.role == "param":
                layer = self.layer_func(*self.inputs, **self.kwargs, **extra,
                                        **{a: getattr(group.first, a) for a in group.attrs})
            else:
                layer = self.layer_func(*self.inputs, **self.kwargs, **extra)
                if self.role == "first":
                    group.first = layer
                else:
                    group.copies.append(layer)
            return layer if self.forward_func is None else ForwardWith(layer, self.forward_func)

    return TiedDesc


class _VSegmentation:
    """What VPipelineLayer changes in Paddle's PipelineLayer (placed before it in the
    class's bases, so `super()` is Paddle's): PipelineLayer(layers, ..., seg_method) for
    the V placement; see the module docstring. `_paddle_ext_v` marks it for
    compat.pipeline_is_v (Paddle's own `_use_dualpipev` stays False: Paddle's code sees the
    interleaved layer it built)."""

    _paddle_ext_v = True

    def __init__(self, layers: Sequence[Any], num_stages: Optional[int] = None, topology: Any = None,
                 loss_fn: Any = None, seg_method: Any = "uniform", recompute_interval: int = 0,
                 recompute_ctx: Any = None) -> None:
        # before nn.Layer.__init__: a plain attribute, read by the segmentation below
        object.__setattr__(self, "_v_seg_method", seg_method)
        # Paddle's interleaved constructor wants a "layer:" method; the V segmentation
        # (_segment_network_for_interleave below) uses the caller's.
        super().__init__(layers=list(layers), num_stages=num_stages, topology=topology, loss_fn=loss_fn,
                         seg_method="layer:", recompute_interval=recompute_interval,
                         recompute_ctx=recompute_ctx, num_virtual_pipeline_stages=2)

    def _segment_network_for_interleave(self, seg_method: Any) -> None:
        from paddle.distributed.fleet.meta_parallel.parallel_layers.pp_layers import (
            SegmentLayers,
        )

        pp = self._num_stages
        if len(self._layers_desc) < 2 * pp:
            raise ValueError(f"layers: {len(self._layers_desc)} layer descriptions cannot fill the V's "
                             f"2 * pp_degree = {2 * pp} stages")
        # the caller's method (VPipelineLayer.__init__), or the one Paddle's constructor got
        # (a v_segmented class whose own __init__ calls PipelineLayer.__init__)
        method = getattr(self, "_v_seg_method", seg_method)
        self.segment_parts = SegmentLayers(self._layers_desc, num_parts=2 * pp, method=method).do_segment()
        parts, r = self.segment_parts, self._stage_id
        self._start_poss = [parts[r], parts[2 * pp - 1 - r]]
        self._end_poss = [parts[r + 1], parts[2 * pp - r]]
        self._v_ties = self._localize_ties()

    def _localize_ties(self) -> list:
        """The ties whose uses all land on one rank, as TiedDescs (on every rank, so the
        descriptions agree); a LocalSharedLayerDesc spread over ranks is refused, a
        SharedLayerDesc spread over ranks stays Paddle's."""
        _, shared = _layer_desc_classes()
        local, tied = local_shared_layer_desc_class(), _tied_desc_class()
        uses: dict = {}
        for idx, desc in enumerate(self._layers_desc):
            if isinstance(desc, (local, shared)):
                uses.setdefault(desc.layer_name, []).append(idx)
        groups = []
        for key, idxs in uses.items():
            on = sorted({self.get_stage_from_index(i) for i in idxs})
            first = self._layers_desc[idxs[0]]
            is_local = isinstance(first, local) and not isinstance(first, shared)
            if len(on) > 1:
                if is_local:
                    raise ValueError(f"LocalSharedLayerDesc {key!r}: its uses land on pipeline ranks {on}; a "
                                     "local tie must stay on one rank (use SharedLayerDesc across ranks)")
                continue
            attrs = first.shared_weight_attr
            group = _TieGroup(key, [attrs] if isinstance(attrs, str) else list(attrs))
            for n, i in enumerate(idxs):
                desc = self._layers_desc[i]
                role = ("first" if n == 0 else "param" if is_local
                        else "same" if desc.layer_func is first.layer_func else "copy")
                self._layers_desc[i] = tied(desc, group, role)
            groups.append(group)
        return groups

    def _synchronize_shared_weights(self) -> None:
        super()._synchronize_shared_weights()
        import paddle

        with paddle.no_grad():
            for group in self._v_ties:
                for copy in group.copies:
                    for attr in group.attrs:
                        getattr(copy, attr).set_value(getattr(group.first, attr))

    def allreduce_shared_weight_gradients(self) -> None:
        """Paddle's pair all-reduce, then each "copy" tie's local sum: both parameters
        get first + copy, as the all-reduce over two ranks would give them."""
        super().allreduce_shared_weight_gradients()
        import paddle

        with paddle.no_grad():
            for group in self._v_ties:
                for copy in group.copies:
                    for attr in group.attrs:
                        _sum_grads(getattr(group.first, attr), getattr(copy, attr))

    def get_stage_from_index(self, layer_idx: int) -> int:
        """The pipeline rank holding layer `layer_idx` (the V: stages r and 2*pp-1-r)."""
        parts = self.segment_parts
        for stage in range(len(parts) - 1):
            if parts[stage] <= layer_idx < parts[stage + 1]:
                return v_stage_of(stage, self._num_stages)
        raise ValueError(f"layer_idx = {layer_idx} is out of range: the layer list has {parts[-1]} layers")



@functools.cache
def v_pipeline_layer_class() -> type:
    """The plugin's V-segmented PipelineLayer class (a subclass of this Paddle's)."""
    return type("VPipelineLayer", (_VSegmentation, upstream.pipeline_layer_class()),
                {"__module__": __name__, "__doc__": _VSegmentation.__doc__})


def _sum_grads(a: Any, b: Any) -> None:
    """a.grad = b.grad = a.grad + b.grad (main_grad where the parameter has one)."""
    attr = "main_grad" if getattr(a, "main_grad", None) is not None else "grad"
    ga, gb = getattr(a, attr), getattr(b, attr)
    if ga is None and gb is None:
        return
    total = ga + gb if ga is not None and gb is not None else (ga if ga is not None else gb)
    for p in (a, b):
        g = getattr(p, attr)
        if g is None:
            setattr(p, attr, total.clone())
        else:
            g.set_value(total)


def v_segmented(cls: type) -> type:
    """`cls` (a PipelineLayer subclass that builds itself with num_virtual_pipeline_stages=2,
    such as PaddleFormers' GeneralModelForCausalLMPipe models with
    config.virtual_pipeline_model_parallel_size = 2) segmented for the V instead: a
    subclass whose PipelineLayer construction takes VPipelineLayer's segmentation and
    stage map, whatever `cls.__init__` does before and after it."""
    base = upstream.pipeline_layer_class()
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"v_segmented: cls = {cls!r} is not a PipelineLayer subclass")
    if issubclass(cls, v_pipeline_layer_class()):  # V-segmented already
        return cls
    if cls is base:
        return v_pipeline_layer_class()
    return type(f"{cls.__name__}V", (cls, v_pipeline_layer_class()), {"__module__": cls.__module__})


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
        return upstream.pipeline_layer_class()(use_dualpipev=True, **kwargs)
    return v_pipeline_layer_class()(**kwargs)
