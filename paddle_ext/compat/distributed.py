"""Version differences in paddle.distributed and fleet: which op modules fleet's model-parallel
code calls (c_identity, c_concat, c_softmax_with_cross_entropy), the sep axis, eager
communicator connection, sharding's tensor fusion and recompute's CPU refusals."""

from __future__ import annotations

from typing import Any

from paddle_ext import upstream
from paddle_ext.compat.version import paddle_before


def c_identity_owners() -> list:
    """Modules whose `c_identity` fleet's model-parallel code calls: 3.x uses
    _C_ops (and _legacy_C_ops in places), 2.6 only _legacy_C_ops."""
    import paddle

    return [m for m in (getattr(paddle, "_C_ops", None), getattr(paddle, "_legacy_C_ops", None))
            if m is not None and hasattr(m, "c_identity")]


def c_concat_owners() -> list:
    """Modules whose `c_concat` (3.x signature: x, rank, nranks, ring_id, use_calc_stream,
    use_model_parallel) fleet's mp_ops._c_concat calls in dygraph: 3.x's _C_ops; 2.6
    calls _legacy_C_ops with attribute pairs, left alone."""
    import paddle

    ops = getattr(paddle, "_C_ops", None)
    return [ops] if not paddle_before(3, 0) and ops is not None and hasattr(ops, "c_concat") else []


def c_softmax_with_cross_entropy_owners() -> list[tuple[Any, str]]:
    """(module, calling convention) for each op module with c_softmax_with_cross_entropy,
    the op of fleet's ParallelCrossEntropy: 3.x's mp_ops calls _C_ops positionally
    (logits, label, ignore_index, ring_id, rank, nranks); 2.6's calls _legacy_C_ops with
    attribute pairs (logits, label, 'ring_id', r, 'rank', k, 'nranks', n, 'ignore_index', i),
    which 3.x still exports."""
    import paddle

    found = []
    for name, convention in (("_C_ops", "positional"), ("_legacy_C_ops", "attributes")):
        ops = getattr(paddle, name, None)
        if ops is not None and hasattr(ops, "c_softmax_with_cross_entropy"):
            found.append((ops, convention))
    return found


def sep_degree(hcg: Any) -> int:
    """The sep (sequence) parallel degree: 3.x's HybridCommunicateGroup has the axis, 2.6's not."""
    getter = getattr(hcg, "get_sep_parallel_world_size", None)
    return int(getter()) if getter is not None else 1


def eager_connection_flag() -> bool:
    """FLAGS_eager_communication_connection (#57517): a Paddle flag on 3.x; 2.6 has no
    such flag, there the environment variable of the same name is read."""
    import os

    name = "FLAGS_eager_communication_connection"
    try:
        import paddle

        return bool(paddle.get_flags([name])[name])
    except (ValueError, KeyError, RuntimeError):
        return os.environ.get(name, "").strip().lower() in ("1", "true", "on", "yes")


def eager_connect(process_group: Any, p2p: bool) -> str:
    """Creates a group's communicators now instead of at its first operation; returns
    how ('' when there is nothing to do). Gloo connects its full mesh when the group is
    constructed. NCCL: 3.x has eager_connect / eager_connect_ring_exchange (p2p
    communicators); 2.6 has neither, and a first all-reduce creates the communicator."""
    if "Gloo" in type(process_group).__name__:
        return ""
    if hasattr(process_group, "eager_connect"):
        process_group.eager_connect()
        if p2p:
            process_group.eager_connect_ring_exchange()
        return "eager_connect" + ("+ring_exchange" if p2p else "")
    import paddle
    from paddle.base import core

    process_group.all_reduce(paddle.zeros([1], dtype="float32"), core.ReduceOp.SUM, True).wait()
    return "first all_reduce"


def tensor_fusion_device_aware() -> bool:
    """Whether fleet's tensor_fusion_helper picks its alignment by device type
    (get_current_device_type, 3.x: it knows gpu, npu and xpu only); 2.6's aligns every
    buffer as for "gpu", whatever the device."""
    import importlib

    module = importlib.import_module("paddle.distributed.fleet.utils.tensor_fusion_helper")
    return hasattr(module, "get_current_device_type")


def optimizer_fusion_module() -> Any:
    """paddle.optimizer.fusion_utils (3.x: the optimizer's fused state storage, used by
    sharding's enable_fuse_optimizer_states), which keeps its own copy of the device-type
    lookup and alignment table; None where Paddle has none (2.6)."""
    import importlib

    try:
        return importlib.import_module("paddle.optimizer.fusion_utils")
    except ImportError:
        return None


def _refuses_cpu(function: Any) -> bool:
    """Whether Paddle's function has an RNG device check ("... not support current device")
    with no branch for the CPU (a 'cpu' string beside it, as 3.x's non-reentrant recompute)."""
    consts = [c for c in function.__code__.co_consts if isinstance(c, str)]
    return any("not support current device" in c for c in consts) and "cpu" not in consts


def recompute_cpu_refusals() -> list[tuple[Any, str, Any]]:
    """(owner, attribute, function) of Paddle's recompute functions whose RNG device check
    refuses the CPU: recompute_hybrid's _HPRecomputeFunction.forward (a staticmethod;
    2.6 to 3.3 all assert) and 2.6's _recompute_without_reentrant (3.x's saves the CPU
    generator's state itself)."""
    recompute, hybrid = upstream.recompute_modules()
    layer = hybrid._HPRecomputeFunction
    candidates = [(layer, "forward", vars(layer)["forward"].__func__),
                  (recompute, "_recompute_without_reentrant", recompute._recompute_without_reentrant)]
    return [(owner, name, f) for owner, name, f in candidates if _refuses_cpu(f)]
