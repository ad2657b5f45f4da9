"""Communication tracing: every collective and p2p transfer, numbered per group.

Each rank keeps a bounded ring of CommRecords. A record's `seq` counts this rank's
operations on one process group (0, 1, 2, ...); ranks of a group that run the same
program give the same op the same seq, which is what lets the hang report
(comm/report.py) line up the ranks' histories and find where they diverge.

Two ways in, one record each:

- `call(pg, op, *args, ...)`: the plugin's own communication (pipeline transfers,
  gradient buckets, the loss broadcast) goes through it, with a label naming the
  pipeline action or bucket;
- the comm_debug patch unit (#56441) wraps the methods of Paddle's ProcessGroup
  classes (`traced_method`), so paddle.distributed's collectives, fleet's included,
  are recorded too, labelled with the caller's file:line. A call already inside
  `call` is not recorded twice.

Times are wall-clock seconds (time.time), as the pipeline interpreter's spans, so
`chrome_trace` draws both in one picture. On CPU/gloo an op's span is the time the
call blocked; on GPU it is the host's enqueue time (see docs/comm_debugging.md).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

__all__ = ["CommRecord", "CommTracer", "call", "chrome_trace", "long_wait", "tracer", "traced_method",
           "write_chrome_trace"]

DEFAULT_RING = 4096


class CommRecord:
    """One operation on one group, as this rank issued it."""

    __slots__ = ("seq", "group", "op", "shapes", "dtype", "peer", "what", "start", "end", "thread", "error",
                 "on_device", "limit")

    def __init__(self, seq: int, group: int, op: str, shapes: tuple, dtype: str, peer: Optional[int],
                 what: str, start: float, thread: str) -> None:
        self.seq, self.group, self.op = seq, group, op
        self.shapes, self.dtype, self.peer, self.what = shapes, dtype, peer, what
        self.start, self.end, self.thread = start, None, thread
        self.error: Optional[str] = None
        self.on_device = False  # the host call returned; the device has not finished it yet
        self.limit: Optional[float] = None  # seconds it may wait (long_wait); None: hang_timeout

    @property
    def done(self) -> bool:
        return self.end is not None

    def signature(self) -> tuple:
        """What two ranks' records of the same seq must agree on (p2p: see report.py)."""
        return (self.op, self.dtype, self.shapes, self.what)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}

    @classmethod
    def from_dict(cls, d: dict) -> CommRecord:
        rec = cls(d["seq"], d["group"], d["op"], tuple(tuple(s) for s in d["shapes"]), d["dtype"],
                  d["peer"], d["what"], d["start"], d["thread"])
        rec.end, rec.error, rec.on_device = d["end"], d["error"], d.get("on_device", False)
        rec.limit = d.get("limit")
        return rec

    def describe(self) -> str:
        shapes = ", ".join("x".join(map(str, s)) or "scalar" for s in self.shapes)
        peer = f" {'to' if self.op.startswith('send') else 'from'} rank {self.peer}" if self.peer is not None else ""
        data = f" [{self.dtype} {shapes}]" if self.shapes else ""
        device = ", enqueued, not finished on the device" if self.on_device else ""
        limit = "" if self.limit is None else \
            f", long_wait {'without limit' if self.limit == float('inf') else f'{self.limit:g} s'}"
        number = f" #{self.seq}" if self.seq >= 0 else ""
        return f"{self.op}{number}{peer}{data} ({self.what}{device}{limit})"

    def __repr__(self) -> str:
        return f"CommRecord(group {self.group}, {self.describe()}, {'done' if self.done else 'in flight'})"


class _GroupInfo:
    __slots__ = ("gid", "ranks")

    def __init__(self, gid: int, ranks: tuple[int, ...]) -> None:
        self.gid, self.ranks = gid, ranks


class CommTracer:
    """A rank's ring of CommRecords, its in-flight operations and per-group counters."""

    def __init__(self, ring: int = DEFAULT_RING, clock: Callable[[], float] = time.time) -> None:
        if ring < 1:
            raise ValueError(f"ring = {ring} is not allowed: the trace ring must hold at least 1 record")
        self.enabled = True
        self.clock = clock
        self.records: collections.deque[CommRecord] = collections.deque(maxlen=ring)
        self.in_flight: dict[int, CommRecord] = {}
        # Device backends (NCCL, ...) return from the call once the op is enqueued: with
        # watch_device (the watchdog sets it), the op's task stays here until the device
        # finished it, and counts as in flight meanwhile.
        self.watch_device = False
        self.device_pending: dict[int, tuple[CommRecord, Any]] = {}
        self.counts: dict[int, int] = {}
        # Seconds an operation begun now may wait before it counts as hung (long_wait);
        # None: the watchdog's hang_timeout.
        self.wait_limit: Optional[float] = None
        self.groups: dict[int, tuple[int, ...]] = {}  # gid -> global ranks
        self._by_pg: dict[int, _GroupInfo] = {}
        self._unknown = 0
        self._lock = threading.Lock()

    # --- groups ---------------------------------------------------------------------
    def group_of(self, pg: Any) -> _GroupInfo:
        info = self._by_pg.get(id(pg))
        if info is None:
            self._refresh_groups()
            info = self._by_pg.get(id(pg))
            if info is None:  # a process group Paddle's group map does not know
                with self._lock:
                    self._unknown -= 1
                    info = _GroupInfo(self._unknown, ())
                self._by_pg[id(pg)] = info
        return info

    def _refresh_groups(self) -> None:
        if "paddle.distributed.collective" not in sys.modules:
            return  # no group exists yet, and importing it here would take seconds
        from paddle_ext import upstream

        for gid, group in upstream.group_map().items():
            pg = getattr(group, "process_group", None)
            if pg is not None:
                ranks = tuple(int(r) for r in group.ranks)
                self._by_pg[id(pg)] = _GroupInfo(int(gid), ranks)
                self.groups[int(gid)] = ranks

    # --- records --------------------------------------------------------------------
    def begin(self, group: int, op: str, tensors: Iterable[Any], peer: Optional[int], what: str) -> CommRecord:
        shapes, dtype = _describe(tensors)
        with self._lock:
            seq = self.counts.get(group, 0)
            self.counts[group] = seq + 1
        rec = CommRecord(seq, group, op, shapes, dtype, peer, what, self.clock(),
                         threading.current_thread().name)
        rec.limit = self.wait_limit
        self.records.append(rec)
        self.in_flight[id(rec)] = rec
        return rec

    def waiting(self, group: int, op: str, what: str, peer: Optional[int] = None) -> CommRecord:
        """An un-numbered operation in flight until `end` (seq -1): a wait outside Paddle's
        groups (the pipeline's streams), which the watchdog reports if it never ends."""
        rec = CommRecord(-1, group, op, (), "", peer, what, self.clock(), threading.current_thread().name)
        rec.limit = self.wait_limit
        self.records.append(rec)
        self.in_flight[id(rec)] = rec
        return rec

    def end(self, rec: CommRecord, error: Optional[BaseException] = None) -> None:
        rec.end = self.clock()
        if error is not None:
            rec.error = f"{type(error).__name__}: {error}"[:300]
        self.in_flight.pop(id(rec), None)

    def event(self, group: int, op: str, what: str, start: float, end: float) -> CommRecord:
        """A non-numbered record (group creation, eager connection): seq -1."""
        rec = CommRecord(-1, group, op, (), "", None, what, start, threading.current_thread().name)
        rec.end = end
        self.records.append(rec)
        return rec

    def watch(self, rec: CommRecord, task: Any) -> None:
        """Keeps a device op's task until the device finished it (poll_device)."""
        rec.on_device = True
        self.device_pending[id(rec)] = (rec, task)

    def poll_device(self) -> None:
        """Drops the device ops that finished (task.is_completed(), a CUDA event query)."""
        for key, (rec, task) in list(self.device_pending.items()):
            try:
                finished = task.is_completed()
            except Exception:  # noqa: BLE001 - a task that cannot say: stop watching it
                finished = True
            if finished:
                rec.on_device = False
                self.device_pending.pop(key, None)

    def _flying(self) -> list[CommRecord]:
        return list(self.in_flight.values()) + [rec for rec, _ in list(self.device_pending.values())]

    def oldest_in_flight(self) -> Optional[CommRecord]:
        self.poll_device()
        flying = self._flying()
        return min(flying, key=lambda r: r.start) if flying else None

    def overdue(self, hang_timeout: float) -> Optional[CommRecord]:
        """The oldest in-flight operation waiting longer than it may: its long_wait
        limit if it began inside one, else hang_timeout. None when none is."""
        self.poll_device()
        now = self.clock()
        late = [r for r in self._flying()
                if now - r.start > (r.limit if r.limit is not None else hang_timeout)]
        return min(late, key=lambda r: r.start) if late else None

    def snapshot(self, last: int = 256) -> dict:
        """JSON-ready state for the hang report: groups, counters, the newest records."""
        self._refresh_groups()
        records = list(self.records)[-last:]
        return {"groups": {str(g): list(r) for g, r in self.groups.items()},
                "counts": {str(g): n for g, n in self.counts.items()},
                "records": [r.to_dict() for r in records],
                "in_flight": [r.to_dict() for r in self._flying()]}

    def clear(self) -> None:
        self.records.clear()


def _describe(tensors: Iterable[Any]) -> tuple[tuple, str]:
    shapes, dtype = [], ""
    for t in tensors:
        shape = getattr(t, "shape", None)
        if shape is None:
            continue
        shapes.append(tuple(int(d) for d in shape))
        if not dtype:
            dtype = str(t.dtype).replace("paddle.", "")
    return tuple(shapes), dtype


_TRACER = CommTracer()
_local = threading.local()


def tracer() -> CommTracer:
    """This process's tracer."""
    return _TRACER


@contextlib.contextmanager
def long_wait(seconds: Optional[float] = None) -> Iterator[None]:
    """Operations this process begins inside the block may wait `seconds` (None: as
    long as they must) before the watchdog calls them hung, instead of
    comm.hang_timeout. For waits that are long by design: every rank wraps the
    barrier that waits while rank 0 writes a checkpoint, say

        with paddle_ext.comm.long_wait(3600):
            if rank == 0:
                save(state, path)
            dist.barrier()

    The limit belongs to the operations begun inside (a hang report still names
    one that outlives it); blocks nest, the innermost limit applying."""
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                or not seconds > 0):
        raise ValueError(f"long_wait: seconds = {seconds!r} is not allowed: a number > 0 "
                         "(float('inf') or None: no limit)")
    before = _TRACER.wait_limit
    _TRACER.wait_limit = float("inf") if seconds is None else float(seconds)
    try:
        yield
    finally:
        _TRACER.wait_limit = before


def call(pg: Any, op: str, *args: Any, tensors: Sequence[Any] = (), peer: Optional[int] = None,
         what: str = "") -> Any:
    """Runs `pg.<op>(*args)` recorded as one operation of pg's group. `peer` is the
    peer's rank within pg (send/recv); it is recorded as a global rank."""
    t = _TRACER
    if not t.enabled:
        return getattr(pg, op)(*args)
    return _recorded(t, pg, op, tensors, peer, what, getattr(pg, op), args, {})


def _recorded(t: CommTracer, pg: Any, op: str, tensors: Sequence[Any], peer: Optional[int], what: str,
              fn: Callable[..., Any], args: Sequence[Any], kwargs: dict) -> Any:
    """fn(*args, **kwargs) recorded as one operation of pg's group; while it runs, the
    class-level wrappers below pass through (one record per operation)."""
    info = t.group_of(pg)
    global_peer = info.ranks[peer] if peer is not None and 0 <= peer < len(info.ranks) else peer
    rec = t.begin(info.gid, op.removesuffix("_on_calc_stream"), tensors, global_peer, what)
    _local.active = True
    try:
        out = fn(*args, **kwargs)
    except BaseException as err:
        t.end(rec, err)
        raise
    finally:
        _local.active = False
    t.end(rec)
    if t.watch_device and "Gloo" not in type(pg).__name__ and hasattr(out, "is_completed"):
        t.watch(rec, out)  # gloo's ops are done when the call returns
    return out


# --- Paddle's own collectives (the comm_debug patch unit) -----------------------------
_P2P_OPS = ("send", "recv", "send_partial", "recv_partial")


def traced_method(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """A ProcessGroup method that records each call (unless `call` is recording it)."""
    op = name.removesuffix("_on_calc_stream")
    p2p = op in _P2P_OPS

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        t = _TRACER
        if not t.enabled or getattr(_local, "active", False):
            return original(self, *args, **kwargs)
        peer = args[1] if p2p and len(args) > 1 and isinstance(args[1], int) else None
        return _recorded(t, self, op, _tensors_in(args), peer, _caller(), original, (self, *args), kwargs)

    method.__wrapped__ = original  # type: ignore[attr-defined]
    method.__paddle_ext_traced__ = True  # type: ignore[attr-defined]
    method.__name__ = name
    return method


def _tensors_in(args: Sequence[Any]) -> list:
    out = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(x for x in a if hasattr(x, "shape") and hasattr(x, "dtype"))
        elif hasattr(a, "shape") and hasattr(a, "dtype"):
            out.append(a)
    return out


_SKIP_DIRS: Optional[tuple[str, ...]] = None


def _caller() -> str:
    """file:line of the first frame outside Paddle and paddle_ext.comm: where the
    user's program asked for this collective."""
    global _SKIP_DIRS
    if _SKIP_DIRS is None:
        import paddle

        _SKIP_DIRS = (os.path.dirname(paddle.__file__) + os.sep, os.path.dirname(__file__) + os.sep)
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP_DIRS):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


# --- export ---------------------------------------------------------------------------
def chrome_trace(records: Iterable[CommRecord], compute_spans: Iterable[tuple] = (), rank: int = 0,
                 groups: Optional[dict] = None) -> list[dict]:
    """Chrome trace events (chrome://tracing, Perfetto) of one rank: its pipeline
    actions on a "compute" row, each group's communication on a row of its own.
    `compute_spans`: (position, action, start, end) as PipelineEngine.last_step.spans."""
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}]
    for _pos, action, start, end in compute_spans:
        row = "pipeline p2p" if getattr(action, "peer", None) is not None else "compute"
        events.append({"name": str(action), "ph": "X", "pid": rank, "tid": row,
                       "ts": start * 1e6, "dur": max(end - start, 0.0) * 1e6, "cat": "pipeline"})
    groups = groups or {}
    for rec in records:
        end = rec.end if rec.end is not None else rec.start
        ranks = groups.get(rec.group) or groups.get(str(rec.group))
        row = f"group {rec.group}" + (f" {list(ranks)}" if ranks else "")
        events.append({"name": f"{rec.op} #{rec.seq}" if rec.seq >= 0 else rec.op, "ph": "X", "pid": rank,
                       "tid": row, "ts": rec.start * 1e6, "dur": max(end - rec.start, 0.0) * 1e6,
                       "cat": "comm", "args": {"what": rec.what, "shapes": [list(s) for s in rec.shapes],
                                               "dtype": rec.dtype, "peer": rec.peer,
                                               "in_flight": rec.end is None, "error": rec.error}})
    return events


def write_chrome_trace(path: str, compute_spans: Iterable[tuple] = (), rank: Optional[int] = None) -> str:
    """Writes this rank's trace (its ring and `compute_spans`) as a chrome trace file."""
    if rank is None:
        from paddle_ext import upstream

        rank = upstream.global_rank()
    t = _TRACER
    t._refresh_groups()
    events = chrome_trace(list(t.records), compute_spans, rank, t.groups)
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return path


def merge_chrome_traces(paths: Sequence[str], out: str) -> str:
    """One file with every rank's events (each rank is a process row)."""
    events: list = []
    for p in paths:
        with open(p) as f:
            events.extend(json.load(f)["traceEvents"])
    with open(out, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return out
