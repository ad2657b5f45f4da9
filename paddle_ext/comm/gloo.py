"""Calc-stream collectives for ProcessGroupGloo.

Paddle's model-parallel layers and pipeline p2p call `*_on_calc_stream`
methods (upstream #46761's API), which ProcessGroupGloo leaves unimplemented.
On CPU there is one stream and gloo's synchronous ops complete before they
return, which is exactly what "on the calc stream" guarantees, so each method
maps onto the synchronous op of the same name.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from paddle_ext.comm.store_sockets import current_host, nodelay_meanwhile, publish_once_listening


def all_reduce_on_calc_stream(self: Any, tensor: Any, op: Any = None) -> Any:
    if op is None:
        from paddle.base import core

        op = core.ReduceOp.SUM
    return self.all_reduce(tensor, op, True)


def broadcast_on_calc_stream(self: Any, tensor: Any, src: int) -> Any:
    return self.broadcast(tensor, src, True)


def all_gather_into_tensor_on_calc_stream(self: Any, out: Any, tensor: Any) -> Any:
    return self.all_gather_into_tensor(out, tensor, True)


def send_on_calc_stream(self: Any, tensor: Any, dst: int) -> Any:
    return self.send(tensor, dst, True)


def recv_on_calc_stream(self: Any, tensor: Any, src: int) -> Any:
    return self.recv(tensor, src, True)


CALC_STREAM_METHODS: dict[str, Callable[..., Any]] = {
    "all_reduce_on_calc_stream": all_reduce_on_calc_stream,
    "broadcast_on_calc_stream": broadcast_on_calc_stream,
    "all_gather_into_tensor_on_calc_stream": all_gather_into_tensor_on_calc_stream,
    "send_on_calc_stream": send_on_calc_stream,
    "recv_on_calc_stream": recv_on_calc_stream,
}


def cpu_c_identity(original: Callable[..., Any]) -> Callable[..., Any]:
    """c_identity with a CPU path: Paddle registers no CPU kernel for it, yet
    model-parallel layers call it on the identity side of their all-reduces.
    On CPU its value semantics are a copy; other devices keep the original."""

    def c_identity(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if tensor.place.is_cpu_place():
            import paddle

            return paddle.assign(tensor)
        return original(tensor, *args, **kwargs)

    c_identity.__wrapped__ = original  # type: ignore[attr-defined]
    return c_identity


def cpu_c_concat(original: Callable[..., Any]) -> Callable[..., Any]:
    """c_concat (3.x `_C_ops.c_concat(x, rank, nranks, ring_id, use_calc_stream,
    use_model_parallel)`: the model-parallel all-gather along the last axis, e.g. a
    tensor-parallel head's logits) with a CPU path: Paddle registers no CPU kernel for
    it, nor for c_split, its gradient. On CPU: an all-gather over the ring's group and a
    concat; the backward takes this rank's slice of the output gradient, as c_split
    does. Other devices keep the original."""

    def c_concat(tensor: Any, rank: int, nranks: int, ring_id: int, *args: Any, **kwargs: Any) -> Any:
        if not tensor.place.is_cpu_place():
            return original(tensor, rank, nranks, ring_id, *args, **kwargs)
        from paddle_ext import upstream

        group = upstream.group_map().get(int(ring_id))
        if group is None:
            raise ValueError(f"c_concat: ring_id = {ring_id} names no process group")
        return _cpu_concat_class().apply(tensor, group, int(rank), int(nranks))

    c_concat.__wrapped__ = original  # type: ignore[attr-defined]
    return c_concat


@functools.cache  # built on first use: importing paddle here would make this module's import cost paddle's
def _cpu_concat_class() -> Any:
    import paddle
    from paddle.autograd import PyLayer

    class CpuConcat(PyLayer):
        @staticmethod
        def forward(ctx: Any, tensor: Any, group: Any, rank: int, nranks: int) -> Any:
            ctx.rank, ctx.nranks = rank, nranks
            parts: list = []
            paddle.distributed.all_gather(parts, tensor, group=group, sync_op=True)
            return paddle.concat(parts, axis=-1)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return paddle.split(grad, ctx.nranks, axis=-1)[ctx.rank]

    return CpuConcat


def cpu_broadcast_input_data(original: Callable[..., Any]) -> Callable[..., Any]:
    """fleet's broadcast_input_data (hybrid_parallel_util; TensorParallel's `_pre_forward`
    sends the model-parallel group's first rank's inputs to the others) with a CPU path:
    Paddle's asserts a GPU, XPU or custom device ("Only support xpu, gpu and custom_device
    now, but this is cpu"), so a tensor-parallel model without pipeline parallelism could
    not run a forward on CPU. On CPU, as Paddle does on a GPU: every tensor in the inputs
    (nested in dicts, lists, tuples) takes the first rank's shape and data, in place; any
    other object is broadcast as an object (3.x's handling; 2.6.2 walked only the top
    level). Returns (inputs, kwargs) as Paddle's does. Other devices keep the original."""

    def broadcast_input_data(hcg: Any, *inputs: Any, **kwargs: Any) -> Any:
        import paddle

        if paddle.get_device().split(":")[0] != "cpu":
            return original(hcg, *inputs, **kwargs)
        for value in (*inputs, *kwargs.values()):
            _broadcast_nested(hcg, value)
        return inputs, kwargs

    broadcast_input_data.__wrapped__ = original  # type: ignore[attr-defined]
    return broadcast_input_data


def _broadcast_nested(hcg: Any, value: Any) -> None:
    import paddle

    group, src = hcg.get_model_parallel_group(), hcg.get_model_parallel_group_src_rank()
    if isinstance(value, dict):
        for item in value.values():
            _broadcast_nested(hcg, item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _broadcast_nested(hcg, item)
    elif isinstance(value, paddle.Tensor):
        with paddle.no_grad():
            shape = paddle.to_tensor(list(value.shape), dtype="int64")
            paddle.distributed.broadcast(shape, src=src, group=group, sync_op=True)
            if hcg.get_model_parallel_rank() == 0:
                paddle.distributed.broadcast(value, src=src, group=group, sync_op=True)
            else:
                received = paddle.zeros([int(n) for n in shape.numpy()], dtype=value.dtype)
                paddle.distributed.broadcast(received, src=src, group=group, sync_op=True)
                # assign, not Paddle's _share_buffer_to: that keeps the tensor's old shape over
                # the new buffer (an element read past its end where the shapes differ)
                paddle.assign(received, output=value)
    else:
        paddle.distributed.broadcast_object_list([value], src=src, group=group)


def private_store_process_groups(original: Callable[..., Any]) -> Callable[..., Any]:
    """_new_process_group_impl that gives every gloo group its own TCPStore.

    ProcessGroupGloo's constructor rendezvous through the job's one store with
    keys that carry no group prefix ("0", "1", ...), so creating a group can
    read the address a rank published for an earlier group: with 4 or more
    ranks fleet's topology set-up then fails ("Connection refused", "136 vs 45")
    or hangs. A store per group (served by the group's first rank, its address
    passed through the job store under a key unique to the group) makes every
    rendezvous start from empty keys.

    A group store's address is published only once its server listens, so the other
    ranks, on any host, connect at once, and its connections get TCP_NODELAY
    (comm.store_sockets): each group's rendezvous had waited for delayed ACKs (a two-rank
    group took 0.46 s, 0.035 s since) and now and then for Paddle's 3 s connect retry
    (published before it listened: across two hosts 1-3 retries in most pp2 jobs).
    """

    def _new_process_group_impl(backend, store, rank, world_size, group_name, pg_options,
                                group_id=0, *args: Any, **kwargs: Any) -> Any:
        if backend == "gloo" and group_id != 0 and world_size > 1:
            store = _group_store(store, group_id, rank, world_size)
        return original(backend, store, rank, world_size, group_name, pg_options, group_id, *args, **kwargs)

    _new_process_group_impl.__wrapped__ = original  # type: ignore[attr-defined]
    return _new_process_group_impl


_GROUP_STORES: dict[int, Any] = {}  # keeps each group's store (and its server) alive


def _group_store(job_store: Any, group_id: int, rank: int, size: int) -> Any:
    import os
    import socket

    from paddle.base import core

    key = f"paddle_ext/gloo_group_store/{group_id}"
    timeout = int(os.getenv("FLAGS_stop_check_timeout", "900"))
    if rank == 0:
        host = current_host()
        # The port stays bound (SO_REUSEADDR, never listening) until the store
        # listens on it: Paddle's server binds with SO_REUSEADDR too, while any
        # other bind, a port-0 one included, is refused meanwhile. Closed first,
        # the port was free for everyone for a moment, and other processes' gloo
        # pairs bind port 0 all the time: once in CI the store's bind lost (3.3.1's
        # libuv server then aborts the process: "uv__finish_close: Assertion"); a
        # 2.6.2 run that hung in fleet.init's first two-rank group was likely the same.
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, 0))
            port = probe.getsockname()[1]
            # published once it listens (its constructor returns only once every rank
            # connected): a client that connected earlier would be refused and sleep 3 s
            # in Paddle's connect, on any host
            with nodelay_meanwhile(port), publish_once_listening(port, lambda: job_store.set(key, f"{host}:{port}")):
                store = core.TCPStore(host, port, True, size, timeout)
    else:
        job_store.wait(key)
        host, port = job_store.get(key).decode().rsplit(":", 1)
        with nodelay_meanwhile(int(port)):
            store = core.TCPStore(host, int(port), False, size, timeout)
    _GROUP_STORES[group_id] = store
    return store


def groups_made_without_private_stores() -> list[int]:
    """Ids of the gloo groups of more than one rank that this process joined
    through Paddle's own rendezvous (the unprefixed keys in the job store), i.e.
    made before the plugin was enabled. Such groups may be wired to the wrong
    peers or have failed ("Connection refused") at 4 or more ranks."""
    from paddle_ext import upstream

    cls = upstream.gloo_process_group_class()
    if cls is None:
        return []
    made = []
    for gid, group in upstream.group_map().items():
        pg = getattr(group, "process_group", None)
        if gid != 0 and gid not in _GROUP_STORES and isinstance(pg, cls) and group.nranks > 1:
            made.append(gid)
    return sorted(made)


def warn_if_groups_came_first() -> None:
    """Says, once per enable, that gloo groups exist that Paddle made alone: the
    plugin was enabled after fleet.init (README: enable it before)."""
    import warnings

    early = groups_made_without_private_stores()
    if early:
        warnings.warn(
            f"paddle_ext was enabled after gloo process groups {early} were made (fleet.init or "
            "paddle.distributed.new_group ran first): Paddle made them alone, rendezvousing through "
            "the job's store with unprefixed keys, which with 4 or more ranks fails ('Connection "
            "refused') or wires the wrong peers; call paddle_ext.enable() before fleet.init",
            RuntimeWarning, stacklevel=5)  # the line that called paddle_ext.enable()
