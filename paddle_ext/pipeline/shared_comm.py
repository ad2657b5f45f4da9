"""The tied-weight groups of a PipelineLayer, one per pipeline line of the topology.

A weight shared by several stages (SharedLayerDesc: an embedding tied to the lm head) is
kept equal by a group of the ranks that hold it, one group per combination of the other
axes. Paddle 2.6 and 3.0 build those groups by looping over dp, sharding and mp only, each
rank keeping its own sep coordinate: under `sep_degree > 1` the two sep halves create
different member lists under one group id, and the job fails while PipelineLayer is being
built (gloo: "Connection refused"; NCCL's unique-id exchange meets the same mismatch).
Paddle 3.1 builds them from the topology's pipe lines (`get_comm_list("pipe")`), which
span every other axis, sep included. This module does the same for the releases before.
"""

from __future__ import annotations

from typing import Any

__all__ = ["pipe_line_shared_comm", "needs_pipe_line_groups"]


def needs_pipe_line_groups(layers: Any) -> bool:
    """Whether the release's own construction would build mismatched groups: a pipeline
    with a sep axis of more than one rank (without one, the two constructions agree and
    Paddle's runs unchanged)."""
    topo = layers._topo
    names = getattr(topo, "_parallel_names", ())
    return topo.get_dim("pipe") > 1 and "sep" in names and topo.get_dim("sep") > 1


def pipe_line_shared_comm(layers: Any) -> dict[str, dict[str, Any]]:
    """{layer name: {"ranks", "group", "weight_attr", "layer"}} as Paddle's
    _construct_shared_comm returns it, for every pipe line of the topology.

    Every rank creates every group, in the same order (layer names in the order they
    first appear in the layer list, then the topology's pipe lines): group ids are
    handed out by creation order, so the order is part of the contract."""
    import paddle.distributed as dist
    from paddle.distributed.fleet.meta_parallel.parallel_layers.pp_layers import SharedLayerDesc

    stages: dict[str, set[int]] = {}
    for index, desc in enumerate(layers._layers_desc):
        if isinstance(desc, SharedLayerDesc):
            stages.setdefault(desc.layer_name, set()).add(layers.get_stage_from_index(index))
    shared_comm: dict[str, dict[str, Any]] = {}
    for name, on_stages in stages.items():
        for line in layers._topo.get_comm_list("pipe"):
            ranks = [line[s] for s in sorted(on_stages)]
            group = dist.new_group(ranks=ranks)
            if layers.global_rank in ranks:
                shared_comm[name] = {"ranks": ranks, "group": group,
                                     "weight_attr": layers.shared_weight_attrs[name],
                                     "layer": layers.shared_layers[name]}
    return shared_comm
