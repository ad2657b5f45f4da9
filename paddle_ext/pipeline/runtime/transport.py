"""Point-to-point transport of pipeline payloads between neighbouring stages.

A payload is a tensor or a tuple of tensors (hidden states plus masks or
position ids). The first transfer between a pair of chunks carries a small
int64 header describing the payload (count, dtypes, shapes, stop_gradient);
later transfers reuse it, as upstream's p2p_cache_shape does. Gradients need
no header: the producer of an activation knows the shape of its gradient.

Transfers use synchronous send/recv on a two-rank group per neighbouring pair
(the same API on gloo and NCCL, Paddle 2.6 and 3.x). On gloo a
send blocks until the peer posts its recv, which is why the schedule's lowering
orders every transfer globally (paddle_ext.pipeline.schedule.lower).

Where they run: on the compute thread (this class, in the lowered order), or with
pp_configs.overlap_p2p_comm on communication threads (async_p2p.py).
`default_overlap_p2p` picks between them when the user left that key unset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import paddle

from paddle_ext.comm import trace

_DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "bool", "uint8", "int8", "int16")


def _dtype_name(t: paddle.Tensor) -> str:
    return str(t.dtype).replace("paddle.", "")


@dataclass(frozen=True)
class TensorMeta:
    dtype: str
    shape: tuple[int, ...]
    stop_gradient: bool


@dataclass(frozen=True)
class PayloadMeta:
    tensors: tuple[TensorMeta, ...]
    is_tuple: bool

    def encode(self) -> list[int]:
        code = [int(self.is_tuple), len(self.tensors)]
        for t in self.tensors:
            code += [_DTYPES.index(t.dtype), int(t.stop_gradient), len(t.shape), *t.shape]
        return code

    @classmethod
    def decode(cls, code: Sequence[int]) -> PayloadMeta:
        is_tuple, count, pos = bool(code[0]), code[1], 2
        tensors = []
        for _ in range(count):
            dtype, stop, ndim = _DTYPES[code[pos]], bool(code[pos + 1]), code[pos + 2]
            shape = tuple(int(d) for d in code[pos + 3:pos + 3 + ndim])
            tensors.append(TensorMeta(dtype, shape, stop))
            pos += 3 + ndim
        return cls(tuple(tensors), is_tuple)

    @classmethod
    def of(cls, payload: Any) -> PayloadMeta:
        items = payload if isinstance(payload, (tuple, list)) else (payload,)
        for i, t in enumerate(items):
            if not isinstance(t, paddle.Tensor):
                raise TypeError(f"pipeline stage outputs must be Tensors or tuples of Tensors; item {i} is {type(t).__name__}")
        metas = tuple(TensorMeta(_dtype_name(t), tuple(int(d) for d in t.shape), bool(t.stop_gradient)) for t in items)
        return cls(metas, isinstance(payload, (tuple, list)))


# pp_configs.overlap_p2p_comm when the user did not set it, per backend. Gloo: the
# communication threads, measured faster than every path without threads
# (docs/zero_bubble.md, "Transfers": bench/pipeline_cpu.py --p2p blocking,threads,
# bench/p2p_exchange_cpu.py). Other backends (NCCL): off, Paddle's default.
DEFAULT_OVERLAP_P2P = {"gloo": True}


def default_overlap_p2p(neighbours: dict[int, Any], placement: str = "interleaved") -> bool:
    """overlap_p2p_comm for a pipeline whose links are `neighbours` (peer -> two-rank
    group), when pp_configs leaves it unset: DEFAULT_OVERLAP_P2P of their backend. The V
    placement (zb-v, dualpipev) keeps the compute thread's transfers: not measured there."""
    if placement == "v":
        return False
    backends = {"gloo" if "gloo" in type(g.process_group).__name__.lower() else "other"
                for g in neighbours.values()}
    return len(backends) == 1 and DEFAULT_OVERLAP_P2P.get(backends.pop(), False)


def checked_meta(channel: Any, cached: Optional[PayloadMeta], meta: PayloadMeta) -> None:
    """Refuses a payload unlike the channel's first (`cached`; None: this is the first):
    its header went once, so the receiver reads every later one by that header."""
    if cached is not None and cached != meta:
        raise ValueError(
            f"pipeline payload changed between micro-batches on {channel}: first {cached}, now {meta}; "
            "every micro-batch must give the stage outputs of the same shapes and dtypes (for shapes that "
            "change between steps set pp_configs.enable_dynamic_shape or pipeline_configs.p2p_cache_shape = False)")


def as_tuple(payload: Any) -> tuple:
    return tuple(payload) if isinstance(payload, (tuple, list)) else (payload,)


class P2P:
    """Sends and receives payloads to neighbouring pipeline stages.

    `neighbours` maps a neighbour's pipeline rank to the two-rank group shared
    with it (see groups.py for why the whole pipeline group will not do).
    """

    def __init__(self, neighbours: dict[int, Any]) -> None:
        self._links = {}
        for peer, group in neighbours.items():
            me = group.rank
            self._links[peer] = (group.process_group, 1 - me)
        self._sent_meta: dict[Any, PayloadMeta] = {}
        self._recv_meta: dict[Any, PayloadMeta] = {}

    def forget_shapes(self) -> None:
        """The next transfer on every channel carries its header again (a new step whose
        shapes may differ: the engine's dynamic_shape); both ends call it at the same point."""
        self._sent_meta.clear()
        self._recv_meta.clear()

    # raw tensors -----------------------------------------------------------------
    def _send(self, tensor: paddle.Tensor, peer: int, what: str) -> None:
        pg, peer_in_group = self._links[peer]
        trace.call(pg, "send", tensor, peer_in_group, True, tensors=(tensor,), peer=peer_in_group,
                   what=what).wait()

    def _recv(self, tensor: paddle.Tensor, peer: int, what: str) -> None:
        pg, peer_in_group = self._links[peer]
        trace.call(pg, "recv", tensor, peer_in_group, True, tensors=(tensor,), peer=peer_in_group,
                   what=what).wait()

    # activations -----------------------------------------------------------------
    # `what` labels the transfer in the communication trace (the pipeline action).
    def send_activation(self, channel: Any, payload: Any, peer: int, what: str = "") -> None:
        meta = PayloadMeta.of(payload)
        cached = self._sent_meta.get(channel)
        checked_meta(channel, cached, meta)
        if cached is None:
            code = meta.encode()
            self._send(paddle.to_tensor([len(code)], dtype="int64"), peer, f"{what} header")
            self._send(paddle.to_tensor(code, dtype="int64"), peer, f"{what} header")
            self._sent_meta[channel] = meta
        for t in as_tuple(payload):
            self._send(t.detach(), peer, what)

    def recv_activation(self, channel: Any, peer: int, what: str = "") -> Any:
        meta = self._recv_meta.get(channel)
        if meta is None:
            size = paddle.zeros([1], dtype="int64")
            self._recv(size, peer, f"{what} header")
            code = paddle.zeros([int(size.item())], dtype="int64")
            self._recv(code, peer, f"{what} header")
            meta = self._recv_meta[channel] = PayloadMeta.decode(code.numpy().tolist())
        tensors = []
        for m in meta.tensors:
            t = paddle.empty(list(m.shape), dtype=m.dtype)
            self._recv(t, peer, what)
            t.stop_gradient = m.stop_gradient
            tensors.append(t)
        return tuple(tensors) if meta.is_tuple else tensors[0]

    # gradients -------------------------------------------------------------------
    def send_grads(self, grads: Sequence[paddle.Tensor], peer: int, what: str = "") -> None:
        for g in grads:
            self._send(g, peer, what)

    def recv_grads(self, like: Sequence[TensorMeta], peer: int, what: str = "") -> list[paddle.Tensor]:
        return self.recv_grads_into(self.grad_buffers(like), peer, what)

    @staticmethod
    def grad_buffers(like: Sequence[TensorMeta]) -> list[paddle.Tensor]:
        return [paddle.empty(list(m.shape), dtype=m.dtype) for m in like]

    def recv_grads_into(self, buffers: Sequence[paddle.Tensor], peer: int, what: str = "") -> list[paddle.Tensor]:
        for g in buffers:
            self._recv(g, peer, what)
        return list(buffers)
