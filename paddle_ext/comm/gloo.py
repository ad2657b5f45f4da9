"""Calc-stream collectives for ProcessGroupGloo.

Paddle's model-parallel layers and pipeline p2p call `*_on_calc_stream`
methods (upstream #46761's API), which ProcessGroupGloo leaves unimplemented.
On CPU there is one stream and gloo's synchronous ops complete before they
return, which is exactly what "on the calc stream" guarantees, so each method
maps onto the synchronous op of the same name.
"""

from __future__ import annotations

from typing import Any, Callable


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
