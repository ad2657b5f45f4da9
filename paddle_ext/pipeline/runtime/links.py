"""How a rank's transfers run: the interpreter's links to its neighbours, one class per way.

- BlockingLinks: on the compute thread, in the lowered list's order (a send or a receive
  blocks until its peer's matching one: on gloo a send waits for the receive).
- EagerLinks (pp_configs.overlap_p2p_comm): a send goes once its tensor is made, a receive
  is taken when a compute needs it, each link's transfers still in the list's order. Two
  ways to move the bytes, one class each with CommThread's interface: over TCP streams on
  the compute thread itself (stream_exchange.py, gloo jobs: nothing blocks but a wait for
  bytes not there yet) or on communication threads over one-way groups (async_p2p.py,
  other backends).

Both answer the same questions for the interpreter (the Links protocol below): does this
thread run a transfer action, where is a forward's input, where are a backward's output
gradients, and what happens once an output or an input gradient is made. The interpreter
asks them and never which way it is.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Optional, Protocol, Sequence

from paddle_ext.pipeline.runtime.async_p2p import CommThread
from paddle_ext.pipeline.runtime.slots import Slots, StageLayout, input_grads_of, release
from paddle_ext.pipeline.runtime.stream_exchange import StreamExchange, StreamP2P
from paddle_ext.pipeline.runtime.transport import P2P, PayloadMeta
from paddle_ext.pipeline.schedule.ir import FB, Comm, RecvAct, RecvGrad, SendAct, SendGrad

__all__ = ["Links", "BlockingLinks", "EagerLinks", "P2PAsyncHandle"]

Span = tuple[int, Any, float, float]  # (position, action, start, end), wall clock


class P2PAsyncHandle:
    """What `overlapped_forward_backward` gets as `p2p_async_handle` with
    overlap_p2p_comm (upstream's P2PAsyncHandle interface):

    - forward_handle_wait(): the forward's input is there (already, here: it is an
      argument of the call);
    - forward_async_comm(output_tensor): the forward's output may be sent now, while
      the backward half computes;
    - backward_handle_wait(): wait until the backward's output gradients
      (`backward_input_grads`, received into while the forward ran) are complete;
      call it before the first backward node reads them;
    - backward_async_comm(input_tensor_grad): the backward's input gradients may be
      sent now.
    """

    def __init__(self, forward_wait: Callable[[], None], forward_send: Callable[[Any], None],
                 backward_wait: Callable[[], None], backward_send: Callable[[Any], None]) -> None:
        self._forward_wait, self._forward_send = forward_wait, forward_send
        self._backward_wait, self._backward_send = backward_wait, backward_send
        self.forward_waited = self.forward_sent = False
        self.backward_waited = self.backward_sent = False

    def forward_handle_wait(self) -> None:
        self._forward_wait()
        self.forward_waited = True

    def forward_async_comm(self, output_tensor: Any) -> None:
        self._forward_send(output_tensor)
        self.forward_sent = True

    def backward_handle_wait(self) -> None:
        self._backward_wait()
        self.backward_waited = True

    def backward_async_comm(self, input_tensor_grad: Any) -> None:
        self._backward_send(input_tensor_grad)
        self.backward_sent = True

    # The spelling in #71995's description of the feature.
    backwatd_async_comm = backward_async_comm


class Links(Protocol):
    """The interpreter's side of a rank's transfers (one step)."""

    waited: float  # seconds the compute thread spent waiting for receives

    def start(self, actions: Sequence[Any], layout: StageLayout, slots: Slots) -> None: ...
    def runs_here(self, action: Any) -> bool: ...   # the compute thread runs this action
    def transfer(self, action: Comm) -> None: ...  # a transfer action the compute thread runs
    def forward_input(self, chunk: int, mb: int) -> Any: ...
    def output_grads(self, chunk: int, mb: int) -> list: ...
    def output_made(self, chunk: int, mb: int, outputs: Any) -> bool: ...  # True: on its way
    def input_grads_made(self, chunk: int, mb: int, grads: list) -> bool: ...  # True: on its way
    def pending_output_grads(self, chunk: int, mb: int) -> tuple[list, bool]: ...
    def pair_handle(self, pair: FB) -> Optional[P2PAsyncHandle]: ...
    def finish(self, spans: list[Span]) -> list[Span]: ...
    def abort(self) -> None: ...


class BlockingLinks:
    """Transfers as actions of the list, on the compute thread: a receive stores its
    payload in the slot the compute then reads; a send reads the slot."""

    waited = 0.0

    def __init__(self, p2p: Optional[P2P], channel: str = "act") -> None:
        self.p2p = p2p
        self.channel = channel  # the activation channels' name (their headers are cached per name)
        self.slots: Slots = Slots()
        self._transfers = {RecvAct: self._recv_activation, SendAct: self._send_activation,
                           RecvGrad: self._recv_grads, SendGrad: self._send_grads}

    def start(self, actions: Sequence[Any], layout: StageLayout, slots: Slots) -> None:
        self.slots = slots

    def runs_here(self, action: Any) -> bool:
        return True

    def transfer(self, action: Comm) -> None:
        self._transfers[type(action)](action)

    def _recv_activation(self, a: RecvAct) -> None:
        self.slots.at(a.chunk, a.mb).inputs = self.p2p.recv_activation((self.channel, a.chunk), a.peer, str(a))

    def _send_activation(self, a: SendAct) -> None:
        slot = self.slots[(a.chunk, a.mb)]
        self.p2p.send_activation((self.channel, a.chunk), slot.outputs, a.peer, str(a))
        slot.describe_outputs(PayloadMeta.of(slot.outputs))
        release(slot.outputs)
        if self.slots.forward_only:  # nothing else reads it
            self.slots.pop((a.chunk, a.mb))

    def _recv_grads(self, a: RecvGrad) -> None:
        slot = self.slots[(a.chunk, a.mb)]
        slot.output_grads = self.p2p.recv_grads(slot.output_grad_meta, a.peer, str(a))

    def _send_grads(self, a: SendGrad) -> None:
        slot = self.slots.pop((a.chunk, a.mb))
        self.p2p.send_grads(slot.input_grads, a.peer, str(a))

    def forward_input(self, chunk: int, mb: int) -> Any:
        inputs = self.slots.at(chunk, mb).inputs
        if inputs is None:
            raise RuntimeError(f"F{chunk}.{mb} has no input: its receive did not run before it")
        return inputs

    def output_grads(self, chunk: int, mb: int) -> list:
        grads = self.slots[(chunk, mb)].output_grads
        if grads is None:
            raise RuntimeError(f"B{chunk}.{mb} has no output gradient: its receive did not run before it")
        return grads

    def output_made(self, chunk: int, mb: int, outputs: Any) -> bool:
        return False  # its SA action sends it

    def input_grads_made(self, chunk: int, mb: int, grads: list) -> bool:
        return False  # its SG action sends them

    def pending_output_grads(self, chunk: int, mb: int) -> tuple[list, bool]:
        return self.output_grads(chunk, mb), False

    def pair_handle(self, pair: FB) -> Optional[P2PAsyncHandle]:
        return None  # upstream passes none without overlap_p2p_comm

    def finish(self, spans: list[Span]) -> list[Span]:
        return spans

    def abort(self) -> None:
        pass


class EagerLinks:
    """Transfers off the compute thread's list order: the compute thread publishes what it
    made and takes what arrived; `make_comm(actions, rank, release, clock, channel)` moves
    the bytes (a StreamExchange or a CommThread: the module docstring), each link in the
    list's order."""

    def __init__(self, make_comm: Callable[..., Any], channel: str = "act",
                 clock: Callable[[], float] = time.time) -> None:
        self.make_comm = make_comm
        self.channel = channel
        self.clock = clock
        self.comm: Any = None
        self.layout: Optional[StageLayout] = None
        self.slots: Slots = Slots()

    @classmethod
    def on_streams(cls, p2p: StreamP2P, channel: str = "act") -> EagerLinks:
        """Over the neighbours' TCP streams, on the compute thread (stream_exchange.py)."""
        return cls(functools.partial(StreamExchange, p2p), channel)

    @classmethod
    def on_threads(cls, send_p2p: P2P, recv_p2p: P2P, channel: str = "act") -> EagerLinks:
        """On a communication thread per directed link, over one-way groups (async_p2p.py)."""
        return cls(functools.partial(CommThread, send_p2p, recv_p2p), channel)

    @property
    def waited(self) -> float:
        return self.comm.waited if self.comm is not None else 0.0

    def start(self, actions: Sequence[Any], layout: StageLayout, slots: Slots) -> None:
        self.layout, self.slots = layout, slots
        self.comm = self.make_comm(actions, layout.rank, release, self.clock, channel=self.channel).start()

    def runs_here(self, action: Any) -> bool:
        return not isinstance(action, Comm)  # the communication threads do those

    def transfer(self, action: Comm) -> None:
        raise AssertionError(f"{action} runs on the communication thread")

    def forward_input(self, chunk: int, mb: int) -> Any:
        return self.comm.activation(chunk, mb)

    def output_grads(self, chunk: int, mb: int) -> list:
        return self.comm.grads(chunk, mb)

    def output_made(self, chunk: int, mb: int, outputs: Any) -> bool:
        if not self.comm.has(SendAct, chunk, mb):
            return False
        self.slots[(chunk, mb)].describe_outputs(self.comm.publish_activation(chunk, mb, outputs))
        return True

    def input_grads_made(self, chunk: int, mb: int, grads: list) -> bool:
        self.comm.publish_grads(chunk, mb, grads)
        return True

    def pending_output_grads(self, chunk: int, mb: int) -> tuple[list, bool]:
        """The output gradients, or the buffers they are being received into (True): filled
        once the pair's backward_handle_wait() returns (upstream's contract)."""
        if self.comm.grads_done(chunk, mb):
            return self.comm.grads(chunk, mb), False
        return self.comm.grad_buffers(chunk, mb), True

    def pair_handle(self, pair: FB) -> P2PAsyncHandle:
        comm, layout, f, b = self.comm, self.layout, pair.f, pair.b

        def forward_send(output_tensor: Any) -> None:
            if not layout.is_last(f.chunk) and comm.has(SendAct, f.chunk, f.mb):
                comm.publish_activation(f.chunk, f.mb, output_tensor)

        def backward_wait() -> None:
            if not layout.is_last(b.chunk) and not layout.hands_over(b.chunk + 1):  # a hand-over has them
                comm.grads(b.chunk, b.mb)

        def backward_send(input_tensor_grad: Any) -> None:
            if not layout.is_first(b.chunk) and not layout.hands_over(b.chunk):
                comm.publish_grads(b.chunk, b.mb, input_grads_of(self.slots[(b.chunk, b.mb)].inputs,
                                                                 input_tensor_grad))

        return P2PAsyncHandle(lambda: None, forward_send, backward_wait, backward_send)

    def finish(self, spans: list[Span]) -> list[Span]:
        """Waits for every transfer; the transfers' spans joined to the computes'."""
        self.comm.finish()
        return sorted(spans + self.comm.events, key=lambda s: s[0])

    def abort(self) -> None:
        if self.comm is not None:
            self.comm.abort()
