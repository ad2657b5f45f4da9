"""Collective workers: one per process group, each running its group's collectives in
the order they were submitted.

Gradient reduction overlapped with the pipeline's backward needs collectives that
start while the main thread keeps computing, and every rank of a group must issue
the same collectives in the same order. Three ways to run them, one interface:

- `ThreadWorker` (gloo, CPU tensors): a background thread per group. A gloo
  collective blocks until every rank of the group joined, even with
  sync_op=False (UPSTREAM.md), and a blocking call in a Python thread releases the
  GIL, so the thread waits for the peers while the main thread runs backwards.
- `StreamWorker` (CUDA/ROCm): the collective is issued at once from the calling
  thread on a communication stream of the group's own. The stream first waits on
  an event recorded on the compute stream (the gradients are complete there), and
  an event recorded after the collective is what the compute stream waits on
  before the optimizer step. Events are timing-free (paddle_ext.runtime.Event, or
  Paddle's own with enable_timing=False): a timing event serialises the device's
  queues under CUDA_DEVICE_MAX_CONNECTIONS=1 and the overlap is lost (#57574).
- `InlineWorker` ("overlap off"): keeps the submitted collectives and runs them,
  in the same order, on the calling thread when `drain()` is called. The very
  same closures run as with the other workers, so results are bitwise equal.

A submitted collective may depend on a ticket of another worker (`after`): dp's
all-reduce of a sharding-reduced shard starts once that reduce finished. Why
nothing deadlocks: each worker issues its group's collectives in submission
order, which is the same on every rank of the group; a worker waits only for the
readiness of its own next ticket, and `after` points from the dp group to the
sharding group, never back, so waits cannot form a cycle.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Optional

from paddle_ext import devices

__all__ = ["CollectiveError", "InlineWorker", "StreamWorker", "ThreadWorker", "Ticket", "make_worker"]

_POLL = 0.05  # seconds between checks for an abort while waiting on another ticket


class CollectiveError(RuntimeError):
    """A collective failed (or could not run because an earlier one failed)."""


class Ticket:
    """One submitted collective. Times are wall-clock seconds (time.time by default):
    submitted (handed to the worker), started (the collective was issued), finished
    (it completed; for StreamWorker, when it was enqueued on the device)."""

    __slots__ = ("label", "fn", "after", "done", "error", "submitted", "started", "finished",
                 "device_event", "worker")

    def __init__(self, label: str, fn: Callable[[], Any], after: Optional[Ticket], worker: str) -> None:
        self.label = label
        self.fn = fn
        self.after = after
        self.worker = worker
        self.done = threading.Event()
        self.error: Optional[BaseException] = None
        self.submitted = self.started = self.finished = 0.0
        self.device_event: Any = None

    def wait(self, timeout: Optional[float] = None) -> None:
        """Blocks until the collective completed on the host side; raises its error."""
        if not self.done.wait(timeout):
            raise CollectiveError(f"{self.worker}: {self.label} did not finish within {timeout} s")
        if self.error is not None:
            raise CollectiveError(f"{self.worker}: {self.label} failed: "
                                  f"{type(self.error).__name__}: {self.error}") from self.error

    def __repr__(self) -> str:
        state = "failed" if self.error else "done" if self.done.is_set() else "pending"
        return f"Ticket({self.worker}: {self.label}, {state})"


class _Worker:
    def __init__(self, name: str, clock: Callable[[], float] = time.time) -> None:
        self.name = name
        self.clock = clock
        self.tickets: list[Ticket] = []
        self.failed: Optional[Ticket] = None

    def submit(self, label: str, fn: Callable[[], Any], after: Optional[Ticket] = None) -> Ticket:
        ticket = Ticket(label, fn, after, self.name)
        ticket.submitted = self.clock()
        self.tickets.append(ticket)
        self._enqueue(ticket)
        return ticket

    def _enqueue(self, ticket: Ticket) -> None:
        raise NotImplementedError

    def _run(self, ticket: Ticket) -> None:
        """Runs one ticket on the current thread; never raises."""
        try:
            if self.failed is not None:
                raise CollectiveError(f"not run: the earlier {self.failed.label} on {self.name} failed")
            if ticket.after is not None:
                self._wait_after(ticket.after)
            ticket.started = self.clock()
            ticket.fn()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            ticket.error = err
            if self.failed is None:
                self.failed = ticket
        finally:
            ticket.finished = self.clock()
            ticket.done.set()

    def _wait_after(self, after: Ticket) -> None:
        after.wait()

    def drain(self) -> None:
        """Runs what is still pending on the calling thread (InlineWorker only)."""

    def wait_all(self) -> None:
        """Waits for every submitted ticket; raises the first failure."""
        self.drain()
        for ticket in self.tickets:
            ticket.wait()

    def reset(self) -> None:
        """Forgets finished tickets (between steps)."""
        self.tickets = [t for t in self.tickets if not t.done.is_set()]

    def close(self, join: bool = True) -> None:
        pass


class InlineWorker(_Worker):
    """Deferred: runs the submitted collectives, in order, when drain() is called."""

    def __init__(self, name: str, clock: Callable[[], float] = time.time) -> None:
        super().__init__(name, clock)
        self._pending: list[Ticket] = []

    def _enqueue(self, ticket: Ticket) -> None:
        self._pending.append(ticket)

    def _wait_after(self, after: Ticket) -> None:
        if not after.done.is_set():  # another inline worker: run its pending work first
            raise CollectiveError(f"{self.name}: {after.label} must be drained before the tickets "
                                  "that depend on it")
        after.wait()

    def drain(self) -> None:
        pending, self._pending = self._pending, []
        for ticket in pending:
            self._run(ticket)


class ThreadWorker(_Worker):
    """A background thread that issues this group's collectives in submission order."""

    def __init__(self, name: str, clock: Callable[[], float] = time.time) -> None:
        super().__init__(name, clock)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._aborted = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"paddle_ext-{name}", daemon=True)
        self._thread.start()

    def _enqueue(self, ticket: Ticket) -> None:
        if not self._thread.is_alive():
            raise CollectiveError(f"{self.name}: the worker thread is closed")
        self._queue.put(ticket)
        time.sleep(0)  # let the worker take the GIL and issue it now, not at the next switch interval

    def _loop(self) -> None:
        while True:
            ticket = self._queue.get()
            if ticket is None:
                return
            if self._aborted.is_set():
                ticket.error = CollectiveError(f"{self.name}: aborted")
                ticket.finished = self.clock()
                ticket.done.set()
                continue
            self._run(ticket)

    def _wait_after(self, after: Ticket) -> None:
        while not after.done.wait(_POLL):
            if self._aborted.is_set():
                raise CollectiveError(f"{self.name}: aborted while waiting for {after.label}")
        after.wait()

    def abort(self) -> None:
        """Tickets not started yet fail at once (a collective already blocked in the
        backend cannot be interrupted; the thread is a daemon)."""
        self._aborted.set()

    def close(self, join: bool = True) -> None:
        self._queue.put(None)
        if join:
            self._thread.join(timeout=1.0)


class StreamWorker(_Worker):
    """Issues each collective at once on a communication stream of its own, ordered
    against the compute stream by timing-free events (see the module docstring)."""

    def __init__(self, name: str, make_event: Callable[[], Any], clock: Callable[[], float] = time.time) -> None:
        super().__init__(name, clock)
        self._make_event = make_event
        self.stream = devices.new_stream()

    def _enqueue(self, ticket: Ticket) -> None:
        ready = self._make_event()
        ready.record(devices.current_stream())
        ready.wait(self.stream)
        if ticket.after is not None and ticket.after.device_event is not None:
            ticket.after.device_event.wait(self.stream)
        with devices.stream_guard(self.stream):
            self._run(ticket)  # the collective runs on self.stream (use_calc_stream)
        done = self._make_event()
        done.record(self.stream)
        ticket.device_event = done

    def _wait_after(self, after: Ticket) -> None:
        after.wait()  # host side: enqueued already; the device wait is the event above

    def wait_all(self) -> None:
        """The compute stream waits (on the device) for every collective issued."""
        super().wait_all()
        stream = devices.current_stream()
        for ticket in self.tickets:
            if ticket.device_event is not None:
                ticket.device_event.wait(stream)


def make_worker(name: str, place_kind: str, overlap: bool, timing_events: bool = False,
                clock: Callable[[], float] = time.time) -> _Worker:
    """The worker for a group whose tensors live on `place_kind` ("cpu" or "gpu")."""
    if not overlap:
        return InlineWorker(name, clock)
    if place_kind == "cpu":
        return ThreadWorker(name, clock)
    return StreamWorker(name, lambda: device_event(timing_events), clock)


def device_event(enable_timing: bool = False) -> Any:
    """A device event with record(stream) / wait(stream) over Paddle streams:
    paddle_ext's runtime Event (timing-free unless asked) where its native library
    has a GPU backend, else Paddle's own event created with the same enable_timing."""
    try:
        from paddle_ext.runtime.event import Event, native

        lib = native()
        backend = "cuda" if lib.has_event_backend("cuda") else "hip" if lib.has_event_backend("hip") else ""
    except Exception:  # noqa: BLE001 - the native library is optional here
        backend = ""
    if backend:
        return _RuntimeEvent(Event(backend, enable_timing=enable_timing))
    return devices.paddle_device_event(enable_timing)


class _RuntimeEvent:
    def __init__(self, event: Any) -> None:
        self.event = event

    def record(self, stream: Any) -> None:
        self.event.record(devices.raw_stream(stream))

    def wait(self, stream: Any) -> None:
        self.event.wait(devices.raw_stream(stream))
