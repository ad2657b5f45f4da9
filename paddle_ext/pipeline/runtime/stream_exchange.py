"""One step's transfers over the neighbours' TCP streams (streams.py), on the compute thread.

The same questions as async_p2p.CommThread answers for EagerLinks (publish an output or
input gradients, take a forward's input or a backward's output gradients), without threads:

- a send goes when its tensor exists and every earlier send of its link (in the lowered
  list's order) went: its bytes are queued on the stream and written at once, as far as the
  kernel takes them;
- a receive is read when a compute needs it: its bytes normally arrived while this rank
  computed, and the read is one copy out of the kernel;
- only a wait for bytes not there yet blocks, in poll(); it writes queued bytes and reads
  arrived ones into the receives expected next on every stream meanwhile.

Why nothing can deadlock: every stream carries its link's transfers in one order on both
ends (the lowered list's, async_p2p.py's argument), sends never block, and a rank that
waits keeps draining every incoming stream, so a sender's queued bytes always find room
eventually; what is left is the schedule's own dependencies (a compute after its
receives, a send after its compute), which the run `lower` recorded satisfied.

Headers: the first activation of a channel carries its PayloadMeta, as transport.P2P
does on gloo (the caches live in StreamP2P, across steps; forget_shapes clears them).
Receive buffers come from Paddle's allocator (a receive's tensor is the forward's input,
which autograd keeps until its backward: it cannot be a reused buffer).
"""

from __future__ import annotations

import select
import time
from collections import deque
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import paddle

from paddle_ext.comm import trace
from paddle_ext.pipeline.runtime.async_p2p import CommThreadError
from paddle_ext.pipeline.runtime.streams import Stream, StreamClosed, tensor_bytes
from paddle_ext.pipeline.runtime.transport import PayloadMeta, TensorMeta, as_tuple, checked_meta
from paddle_ext.pipeline.schedule.ir import Comm, RecvAct, RecvGrad, SendAct, SendGrad

__all__ = ["StreamExchange", "StreamP2P"]

_POLL_MS = 1000  # a wait's poll() slice; the comm watchdog reports a wait that never ends


class StreamP2P:
    """An engine's streams to its neighbours (pipeline-rank -> Stream) and the payload
    headers sent and received on each channel, across steps."""

    def __init__(self, streams: dict[int, Stream]) -> None:
        self.streams = streams
        self.broken = ""  # why a step left the streams mid-payload: later steps refuse to run
        self.sent_meta: dict[Any, PayloadMeta] = {}
        self.recv_meta: dict[Any, PayloadMeta] = {}

    def forget_shapes(self) -> None:
        """As transport.P2P.forget_shapes: the next activation of each channel carries its header."""
        self.sent_meta.clear()
        self.recv_meta.clear()


class _Ticket:
    __slots__ = ("action", "position", "ready", "done", "payload", "meta", "buffers", "parts", "posted",
                 "finished")

    def __init__(self, position: int, action: Comm) -> None:
        self.action, self.position = action, position
        self.ready = self.done = False
        self.payload: Any = None
        self.meta: Optional[PayloadMeta] = None  # activation sends: what the gradient will look like
        self.buffers: Optional[list] = None      # gradient receives: where the bytes land
        self.parts: Optional[Iterator[memoryview]] = None  # receives: the views to fill, in order
        self.posted = self.finished = 0.0


class _Incoming:
    """The receives expected on one stream, in order, and the view being filled."""

    __slots__ = ("tickets", "view", "filled")

    def __init__(self) -> None:
        self.tickets: deque[_Ticket] = deque()
        self.view: Optional[memoryview] = None
        self.filled = 0


def _key(action: Comm) -> tuple:
    return (type(action), action.chunk, action.mb)


class StreamExchange:
    """Performs one rank's transfers of one step over `p2p`'s streams (module docstring);
    CommThread's interface, so EagerLinks drives either."""

    def __init__(self, p2p: StreamP2P, actions: Sequence[Any], rank: int, release: Callable[[Any], None],
                 clock: Callable[[], float] = time.time, channel: str = "act") -> None:
        if p2p.broken:
            raise CommThreadError(f"pipeline rank {rank}: the pipeline streams are unusable after an earlier "
                                  f"step failed ({p2p.broken}); make a new engine")
        self.p2p, self.channel, self.rank = p2p, channel, rank
        self._release, self._clock = release, clock
        self._tickets: dict[tuple, _Ticket] = {}
        self._sends: dict[int, deque[_Ticket]] = {peer: deque() for peer in p2p.streams}
        self._incoming: dict[int, _Incoming] = {peer: _Incoming() for peer in p2p.streams}
        for position, action in enumerate(actions):
            if isinstance(action, Comm):
                ticket = self._tickets[_key(action)] = _Ticket(position, action)
                if action.is_send:
                    self._sends[action.peer].append(ticket)
                else:
                    self._incoming[action.peer].tickets.append(ticket)
        self.total = len(actions)
        self.events: list[tuple[int, Any, float, float]] = []
        self.waited = 0.0
        self.error: Optional[BaseException] = None

    # --- CommThread's interface ---------------------------------------------------
    def start(self) -> StreamExchange:
        return self

    def has(self, kind: type, chunk: int, mb: int) -> bool:
        return (kind, chunk, mb) in self._tickets

    def publish_activation(self, chunk: int, mb: int, outputs: Any) -> PayloadMeta:
        ticket = self._tickets[(SendAct, chunk, mb)]
        if not ticket.ready:
            ticket.meta, ticket.payload, ticket.ready = PayloadMeta.of(outputs), outputs, True
            self._send_ready(ticket.action.peer)
        return ticket.meta

    def publish_grads(self, chunk: int, mb: int, grads: Sequence[Any]) -> None:
        ticket = self._tickets[(SendGrad, chunk, mb)]
        if not ticket.ready:
            ticket.payload, ticket.ready = list(grads), True
            self._send_ready(ticket.action.peer)

    def activation(self, chunk: int, mb: int) -> Any:
        return self._wait(self._tickets[(RecvAct, chunk, mb)]).payload

    def grads(self, chunk: int, mb: int) -> list:
        return self._wait(self._tickets[(RecvGrad, chunk, mb)]).payload

    def grads_done(self, chunk: int, mb: int) -> bool:
        ticket = self._tickets[(RecvGrad, chunk, mb)]
        if not ticket.done:
            self._progress()
        return ticket.done

    def grad_buffers(self, chunk: int, mb: int) -> list:
        """The tensors B(chunk, mb)'s output gradients are (being) read into."""
        ticket = self._tickets[(RecvGrad, chunk, mb)]
        if ticket.buffers is None:
            ticket.buffers = [paddle.empty(list(m.shape), dtype=m.dtype) for m in self._grad_like(ticket)]
        return ticket.buffers

    def finish(self) -> None:
        """Writes what is queued and reads what is expected: every transfer of the step done."""
        pending = [t for t in self._tickets.values() if not t.done]
        for ticket in pending:
            if not ticket.action.is_send:
                self._wait(ticket)
        self._block_until(lambda: all(not s.out for s in self.p2p.streams.values()), pending[0] if pending else None)
        unsent = [t.action for q in self._sends.values() for t in q]
        if unsent:
            self._fail(RuntimeError(f"the step ended with sends whose tensors were never made: {unsent}"), None)

    def abort(self) -> None:
        """The compute thread failed: nothing more is sent (the peer's receives end with the
        connection or the watchdog), and the streams, left mid-step, serve no later step."""
        self.p2p.broken = f"pipeline rank {self.rank}'s step was aborted"

    # --- sends --------------------------------------------------------------------
    def _send_ready(self, peer: int) -> None:
        """Queues the link's leading sends whose tensors exist, in list order; writes."""
        queue, stream = self._sends[peer], self.p2p.streams[peer]
        while queue and queue[0].ready:
            ticket = queue.popleft()
            ticket.posted = self._clock()
            views = self._send_views(ticket)
            for view in views[:-1]:
                stream.out.append([view, None])
            stream.out.append([views[-1], lambda t=ticket: self._sent(t)])
        self._guarded(stream.write, None)

    def _send_views(self, ticket: _Ticket) -> list[memoryview]:
        a = ticket.action
        if isinstance(a, SendGrad):
            ticket.payload = [_contiguous(g) for g in ticket.payload]
            return [tensor_bytes(g) for g in ticket.payload] or [memoryview(b"")]
        channel = (self.channel, a.chunk)
        views = []
        cached = self.p2p.sent_meta.get(channel)
        checked_meta(channel, cached, ticket.meta)
        if cached is None:
            code = np.asarray(ticket.meta.encode(), dtype=np.int64)
            views += [memoryview(np.asarray([len(code)], dtype=np.int64)).cast("B"), memoryview(code).cast("B")]
            self.p2p.sent_meta[channel] = ticket.meta
        tensors = [_contiguous(t) for t in as_tuple(ticket.payload)]
        ticket.buffers = tensors  # kept alive until written
        return views + [tensor_bytes(t) for t in tensors]

    def _sent(self, ticket: _Ticket) -> None:
        ticket.finished, ticket.done, ticket.buffers = self._clock(), True, None
        if isinstance(ticket.action, SendAct):
            self._release(ticket.payload)
        ticket.payload = None
        self.events.append((ticket.position, ticket.action, ticket.posted, ticket.finished))

    # --- receives -----------------------------------------------------------------
    def _parts(self, ticket: _Ticket) -> Iterator[memoryview]:
        """The views a receive fills, in stream order (a first activation: its header first)."""
        a = ticket.action
        if isinstance(a, RecvGrad):
            ticket.payload = self.grad_buffers(a.chunk, a.mb)
            yield from (tensor_bytes(g) for g in ticket.payload)
            return
        channel = (self.channel, a.chunk)
        meta = self.p2p.recv_meta.get(channel)
        if meta is None:
            size = np.zeros(1, dtype=np.int64)
            yield memoryview(size).cast("B")
            code = np.zeros(int(size[0]), dtype=np.int64)
            yield memoryview(code).cast("B")
            meta = self.p2p.recv_meta[channel] = PayloadMeta.decode(code.tolist())
        tensors = []
        for m in meta.tensors:
            t = paddle.empty(list(m.shape), dtype=m.dtype)
            t.stop_gradient = m.stop_gradient
            tensors.append(t)
        ticket.payload = tuple(tensors) if meta.is_tuple else tensors[0]
        yield from (tensor_bytes(t) for t in tensors)

    def _activation_sent(self, ticket: _Ticket) -> bool:
        return self._tickets[(SendAct, ticket.action.chunk, ticket.action.mb)].meta is not None

    def _grad_like(self, ticket: _Ticket) -> list[TensorMeta]:
        sent = self._tickets[(SendAct, ticket.action.chunk, ticket.action.mb)]
        if sent.meta is None:
            raise RuntimeError(f"{ticket.action}: the shape of the gradient is unknown before its activation "
                               "was made")
        return [m for m in sent.meta.tensors if not m.stop_gradient]

    def _read(self, peer: int) -> bool:
        """Reads what arrived on `peer`'s stream into the receives expected; True if any byte came."""
        incoming, stream, got = self._incoming[peer], self.p2p.streams[peer], False
        while incoming.tickets:
            ticket = incoming.tickets[0]
            if incoming.view is None:
                if ticket.parts is None:
                    if isinstance(ticket.action, RecvGrad) and not self._activation_sent(ticket):
                        return got  # nothing can come before the activation it answers went
                    ticket.posted, ticket.parts = self._clock(), self._parts(ticket)
                incoming.view, incoming.filled = next(ticket.parts, None), 0
                if incoming.view is None:  # every part filled
                    incoming.tickets.popleft()
                    ticket.finished, ticket.done = self._clock(), True
                    self.events.append((ticket.position, ticket.action, ticket.posted, ticket.finished))
                    continue
            view = incoming.view
            while incoming.filled < len(view):
                n = stream.read_into(view[incoming.filled:])
                if n == 0:
                    return got
                incoming.filled += n
                got = True
            incoming.view = None
        return got

    # --- progress -----------------------------------------------------------------
    def _progress(self) -> bool:
        moved = False
        for peer, stream in self.p2p.streams.items():
            moved = self._guarded(stream.write, None) or moved
            moved = self._guarded(lambda p=peer: self._read(p), self._incoming[peer].tickets) or moved
        return moved

    def _wait(self, ticket: _Ticket) -> _Ticket:
        if not ticket.done:
            start = self._clock()
            self._block_until(lambda: ticket.done, ticket)
            self.waited += self._clock() - start
        return ticket

    def _block_until(self, satisfied: Callable[[], bool], ticket: Optional[_Ticket]) -> None:
        record = None
        while True:
            self._progress()
            if satisfied():
                break
            if record is None and ticket is not None:
                record = self._in_flight(ticket)
            self._poll()
        if record is not None:
            trace.tracer().end(record)

    def _poll(self) -> None:
        poller = select.poll()
        for peer, stream in self.p2p.streams.items():
            events = (select.POLLIN if self._incoming[peer].tickets else 0) | (select.POLLOUT if stream.out else 0)
            if events:
                poller.register(stream.sock, events)
        poller.poll(_POLL_MS)

    def _in_flight(self, ticket: _Ticket) -> Any:
        """A record the comm watchdog sees while this rank waits (the hang report names it)."""
        t = trace.tracer()
        if not t.enabled:
            return None
        a = ticket.action
        stream = self.p2p.streams[a.peer]
        return t.waiting(trace_group(self.rank, a.peer), "send" if a.is_send else "recv",
                         f"{a} on the pipeline stream to {stream.peer}", stream.rank)

    def _guarded(self, step: Callable[[], bool], tickets: Any) -> bool:
        try:
            return step()
        except StreamClosed as err:
            self._fail(err, tickets[0] if tickets else None)
        return False

    def _fail(self, err: BaseException, ticket: Optional[_Ticket]) -> None:
        self.p2p.broken = f"{type(err).__name__}: {err}"
        where = (f"action {ticket.action} (position {ticket.position} of {self.total} in this rank's schedule)"
                 if ticket is not None else "a transfer")
        raise CommThreadError(f"pipeline rank {self.rank}: {where} failed: {type(err).__name__}: {err}") from err


def trace_group(rank: int, peer: int) -> int:
    """The comm trace's group number for this rank's stream to pipeline rank `peer`
    (negative: not one of Paddle's groups)."""
    return -(1_000_000 + 1000 * min(rank, peer) + max(rank, peer))


def _contiguous(t: Any) -> Any:
    return t if t.is_contiguous() else t.detach().contiguous()
