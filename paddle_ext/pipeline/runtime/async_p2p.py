"""Asynchronous p2p (pp_configs.overlap_p2p_comm): communication threads per rank.

On gloo a send blocks until the peer posts its receive and a receive blocks until the
data is there (UPSTREAM.md), so "isend now, wait later" needs threads. Each directed
link of this rank (sends to a neighbour, receives from a neighbour) gets one thread
and one two-rank group of its own (groups.link_groups); the thread performs that
link's transfers in the order of the lowered schedule (schedule/lower.py, with
async_p2p=True) while the main thread computes:

- a receive is posted as soon as its thread reaches it: the next micro-batch's input
  arrives while the current compute runs;
- a send waits until the main thread has produced its tensor (`publish_*`);
- the main thread waits for a receive only when a compute needs its tensor.

Why nothing can deadlock: the transfers of every link happen in the order of one
global sequence, the same on both of its ranks, and every dependency left (a link's
own order, a send after its producing compute, a compute after its receives, a
gradient receive after the activation it belongs to was made) is also a dependency
of the run `lower` recorded that sequence from, which finished; a subset of the
dependencies of a run that finishes cannot form a cycle. (With pp = 2 both
neighbours are one rank: two threads, one per direction.)

Events: `events` holds (position, action, posted, finished) per transfer, wall-clock
seconds like the interpreter's spans, so a test can check that a receive was posted
before the compute ahead of its consumer had finished (`received_before`).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional, Sequence

from paddle_ext.pipeline.runtime.transport import P2P, PayloadMeta
from paddle_ext.pipeline.schedule.ir import Comm, F, RecvAct, RecvGrad, SendAct, SendGrad, computes

__all__ = ["CommThread", "CommThreadError", "received_before"]

_POLL = 0.05  # seconds between checks for the other side's failure while waiting


class CommThreadError(RuntimeError):
    """A transfer failed on the communication thread; names the action and position."""


class _Ticket:
    """One transfer: what the main thread hands over (sends) or gets back (receives)."""

    __slots__ = ("action", "position", "ready", "done", "lock", "payload", "meta", "buffers",
                 "started", "posted", "finished")

    def __init__(self, position: int, action: Comm) -> None:
        self.action = action
        self.position = position
        self.ready = threading.Event()  # sends: the tensor exists
        self.done = threading.Event()   # the transfer has finished
        self.lock = threading.Lock()
        self.payload: Any = None        # sends: what to send; receives: what arrived
        self.meta: Optional[PayloadMeta] = None  # activation sends: its meta (for RG)
        self.buffers: Optional[list] = None  # gradient receives: where the data lands
        self.started = False
        self.posted = self.finished = 0.0


def _key(action: Comm) -> tuple:
    return (type(action), action.chunk, action.mb)


class CommThread:
    """Performs one rank's transfers of one step on background threads (see above).

    `send_p2p` / `recv_p2p`: transports over the groups of this rank's outgoing /
    incoming links (groups.link_groups)."""

    def __init__(self, send_p2p: P2P, recv_p2p: P2P, actions: Sequence[Any], rank: int,
                 release: Callable[[Any], None], clock: Callable[[], float] = time.time,
                 channel: str = "act") -> None:
        self.send_p2p, self.recv_p2p = send_p2p, recv_p2p
        self.channel = channel  # the activation channels' name (Interpreter's `channel`)
        self.rank = rank
        self._release = release
        self._clock = clock
        self._tickets: dict[tuple, _Ticket] = {}
        links: dict[tuple[int, bool], list[_Ticket]] = {}
        for position, action in enumerate(actions):
            if isinstance(action, Comm):
                ticket = _Ticket(position, action)
                self._tickets[_key(action)] = ticket
                links.setdefault((action.peer, action.is_send), []).append(ticket)
        self.total = len(actions)
        self.events: list[tuple[int, Any, float, float]] = []
        self.waited = 0.0  # seconds the main thread spent waiting for receives (activation / grads)
        self.error: Optional[BaseException] = None
        self._aborted = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(tickets,), daemon=True,
                             name=f"paddle_ext-p2p-rank{rank}-{'to' if send else 'from'}{peer}")
            for (peer, send), tickets in sorted(links.items())]

    # --- the main thread's side ---------------------------------------------------
    def start(self) -> CommThread:
        for t in self._threads:
            t.start()
        return self

    def has(self, kind: type, chunk: int, mb: int) -> bool:
        return (kind, chunk, mb) in self._tickets

    def publish_activation(self, chunk: int, mb: int, outputs: Any) -> PayloadMeta:
        """F(chunk, mb) produced `outputs`: its SA may go. Returns their meta (the first
        call's, when published twice)."""
        ticket = self._tickets[(SendAct, chunk, mb)]
        if not ticket.ready.is_set():
            ticket.meta = PayloadMeta.of(outputs)
            ticket.payload = outputs
            ticket.ready.set()
        assert ticket.meta is not None
        return ticket.meta

    def publish_grads(self, chunk: int, mb: int, grads: Sequence[Any]) -> None:
        """B(chunk, mb) produced its input gradients: its SG may go."""
        ticket = self._tickets[(SendGrad, chunk, mb)]
        if not ticket.ready.is_set():
            ticket.payload = list(grads)
            ticket.ready.set()

    def activation(self, chunk: int, mb: int) -> Any:
        """F(chunk, mb)'s input, waiting for its receive if needed."""
        ticket = self._tickets[(RecvAct, chunk, mb)]
        self._wait(ticket.done)
        return ticket.payload

    def grads(self, chunk: int, mb: int) -> list:
        """B(chunk, mb)'s output gradients, waiting for their receive if needed."""
        ticket = self._tickets[(RecvGrad, chunk, mb)]
        self._wait(ticket.done)
        return ticket.payload

    def grads_done(self, chunk: int, mb: int) -> bool:
        return self._tickets[(RecvGrad, chunk, mb)].done.is_set()

    def grad_buffers(self, chunk: int, mb: int) -> list:
        """The tensors B(chunk, mb)'s output gradients are (being) received into, without
        waiting: filled once `grads(chunk, mb)` returns (upstream's irecv buffers). Call
        after F(chunk, mb)."""
        return self._claim_buffers(self._tickets[(RecvGrad, chunk, mb)])

    def finish(self) -> None:
        """Waits until every transfer of the step is done; raises a thread's error."""
        for t in self._threads:
            while t.is_alive():
                t.join(_POLL)
                self._check()
        self._check()

    def abort(self) -> None:
        """The main thread failed: stop handing out work (a transfer in progress stays
        blocked until its peer goes away; the threads are daemons)."""
        self._aborted.set()

    # --- the threads --------------------------------------------------------------
    def _wait(self, event: threading.Event) -> None:
        if not event.is_set():  # the main thread waits for a receive still in flight
            start = self._clock()
            while not event.wait(_POLL):
                self._check()
            self.waited += self._clock() - start
        self._check()

    def _check(self) -> None:
        if self.error is not None:
            t = getattr(self.error, "ticket", None)
            where = (f"action {t.action} (position {t.position} of {self.total} in this rank's "
                     "schedule)" if t is not None else "a transfer")
            raise CommThreadError(
                f"pipeline rank {self.rank}: {where} failed on the communication thread: "
                f"{type(self.error).__name__}: {self.error}") from self.error

    def _claim_buffers(self, ticket: _Ticket) -> list:
        with ticket.lock:
            if ticket.buffers is None:
                sent = self._tickets[(SendAct, ticket.action.chunk, ticket.action.mb)]
                if sent.meta is None:
                    raise RuntimeError(f"{ticket.action}: the shape of the gradient is unknown "
                                       "before its activation was made")
                ticket.buffers = self.recv_p2p.grad_buffers(
                    [m for m in sent.meta.tensors if not m.stop_gradient])
            return ticket.buffers

    def _ready(self, event: threading.Event) -> bool:
        """Waits for `event`; False when the step was aborted or another thread failed."""
        while not event.wait(_POLL):
            if self._aborted.is_set() or self.error is not None:
                return False
        return True

    def _run(self, tickets: list[_Ticket]) -> None:
        ticket = None
        try:
            for ticket in tickets:
                a = ticket.action
                if a.is_send and not self._ready(ticket.ready):
                    return
                if isinstance(a, RecvGrad):
                    # The gradient's shape is its activation's: wait until that was made.
                    if not self._ready(self._tickets[(SendAct, a.chunk, a.mb)].ready):
                        return
                if self._aborted.is_set():
                    return
                ticket.posted = self._clock()
                if isinstance(a, SendAct):
                    self.send_p2p.send_activation((self.channel, a.chunk), ticket.payload, a.peer, str(a))
                    self._release(ticket.payload)
                    ticket.payload = None
                elif isinstance(a, SendGrad):
                    self.send_p2p.send_grads(ticket.payload, a.peer, str(a))
                    ticket.payload = None
                elif isinstance(a, RecvAct):
                    ticket.payload = self.recv_p2p.recv_activation((self.channel, a.chunk), a.peer, str(a))
                else:
                    ticket.payload = self.recv_p2p.recv_grads_into(self._claim_buffers(ticket), a.peer, str(a))
                ticket.finished = self._clock()
                self.events.append((ticket.position, a, ticket.posted, ticket.finished))
                ticket.done.set()
        except BaseException as err:  # handed to the main thread, which raises it
            err.ticket = ticket  # type: ignore[attr-defined]
            if self.error is None:
                self.error = err


def received_before(spans: Sequence[tuple]) -> list:
    """Overlap evidence from one rank's step: for each activation receive (RA) whose
    consumer F is not the rank's first compute, (RA action, when it was posted, when the
    compute before that F ended). Posted before that end = the receive overlapped that
    compute. `spans` are the interpreter's (position, action, start, end), whose
    transfer spans start when the communication thread posted them."""
    ordered = sorted(spans, key=lambda s: s[0])
    computes_in_order = [s for s in ordered if computes(s[1])]
    out = []
    for _pos, action, posted, _end in ordered:
        if not isinstance(action, RecvAct):
            continue
        for k, (_p, comp, _s, _e) in enumerate(computes_in_order):
            if F(action.chunk, action.mb) in computes(comp):
                if k > 0:
                    out.append((action, posted, computes_in_order[k - 1][3]))
                break
    return out
