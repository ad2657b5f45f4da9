"""The watchdog: a side channel between the ranks that does not depend on any
communicator, for hang reports and lost-rank detection.

Rank 0 serves a hub (a TCP socket, its address published once through the job's
TCPStore at init); every rank, rank 0 included, keeps one connection to it from a
daemon thread. Blocking gloo/NCCL calls release Python's GIL, so the thread runs
while the main thread is stuck. JSON lines travel both ways.

Incidents, and what the hub does with them:
- a rank's in-flight operation is older than hang_timeout (or than the limit of the
  long_wait block it began in) -> "stuck";
- a connection closes without a goodbye -> that rank is lost (SIGKILL, a crash: the
  kernel closes a dead process's sockets, so this is seen at once, not after a
  communicator's timeout); the hub itself lost -> every rank names rank 0;
- a connection stays silent for heartbeat_timeout seconds -> that rank is lost (its
  host lost power or its link, or the process is stopped: no FIN, no RST, so only
  silence tells). Both ends send a heartbeat every heartbeat_timeout / 5 seconds from
  their own thread (the hub's, and each rank's watchdog thread), so a rank that
  computes (Paddle's kernels release the GIL; Python code yields it every few ms) or
  waits in a collective (gloo releases the GIL too) keeps beating; a rank whose hub
  goes silent names rank 0 lost the same way. TCP keepalive is no substitute: by
  Linux's defaults it notices a dead peer after more than two hours;
- a rank's program raised -> "failed" (sent from its exit handler);
- all ranks finished but with different operation counts on a group.
The hub then asks every live rank for its tracer snapshot, waits up to `grace`
seconds, builds the report (comm/report.py) and sends it to every rank, which prints
it and ends with EXIT_HANG (3) or EXIT_PEER (4): a rank blocked in a collective
cannot be woken, so the process ends with os._exit from the watchdog thread. The
report names each rank's host: the address the launcher gave it (--host; one
hostname is often shared by every machine of a cluster image).

The side channel's sockets have TCP_NODELAY on: its messages are small, and a reply
written behind an unacknowledged one would otherwise wait for the peer's delayed ACK
(40 ms on Linux), across hosts as on one.

At a normal exit each rank tells the hub it finished and waits (at most
hang_timeout + grace) until every rank did, so a rank that skipped an operation
stays reachable, and its peers' communicators are not torn down under them, while
the others are stuck in it.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import socket
import sys
import threading
import time
from typing import Any, Callable, Optional

from paddle_ext.comm import report
from paddle_ext.comm.store_sockets import current_host
from paddle_ext.comm.trace import CommRecord, CommTracer

__all__ = ["EXIT_HANG", "EXIT_PEER", "Hub", "Watchdog", "running", "start"]

EXIT_HANG = 3   # a hang or a divergence
EXIT_PEER = 4   # another rank was lost or failed
_STORE_KEY = "paddle_ext/comm_watchdog/hub"
_DEBUG = os.environ.get("PADDLE_EXT_WATCHDOG_DEBUG", "") not in ("", "0")


def _nodelay(sock: socket.socket) -> socket.socket:
    """Nagle's algorithm off (see the module docstring); a no-op where not TCP."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass
    return sock


def _describe(meta: dict, peer: str = "") -> str:
    """Where a rank runs, from its hello: '10.0.0.2 (pid 42, hostname vm)'."""
    host = meta.get("host") or peer or "?"
    if host in ("127.0.0.1", "::1", "localhost") and peer and peer not in ("127.0.0.1", "::1"):
        host = peer  # the launcher gave it no address: the one its connection came from
    return f"{host} (pid {meta.get('pid')}, hostname {meta.get('hostname', '?')})"


def _debug(text: str) -> None:
    if _DEBUG:
        print(f"paddle_ext watchdog debug [{time.time():.3f}]: {text}", file=sys.stderr, flush=True)


class _Channel:
    """JSON lines over a socket; send may be called from any thread."""

    def __init__(self, sock: socket.socket, peer: str = "") -> None:
        self.sock = sock
        self.peer = peer
        self.buf = b""
        self.lock = threading.Lock()
        self.rank = -1
        self.meta: dict = {}
        self.last_heard = time.monotonic()

    def send(self, msg: dict) -> bool:
        data = (json.dumps(msg) + "\n").encode()
        try:
            with self.lock:
                self.sock.sendall(data)
            return True
        except OSError:
            return False

    def read(self) -> Optional[list[dict]]:
        """Messages now readable; None at end of stream."""
        try:
            chunk = self.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            chunk = b""
        if not chunk:
            return None
        self.last_heard = time.monotonic()
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return [json.loads(line) for line in lines if line]


class Hub(threading.Thread):
    """Rank 0's end: collects incidents, gathers states, hands out the verdict."""

    def __init__(self, world_size: int, grace: float, settle: float = 0.5, heartbeat_timeout: float = 0.0) -> None:
        super().__init__(name="paddle_ext-watchdog-hub", daemon=True)
        self.world_size = world_size
        self.grace, self.settle = grace, settle
        self.heartbeat_timeout = heartbeat_timeout  # 0: no heartbeat
        self.next_beat = 0.0
        self.where: dict[int, str] = {}  # rank -> its host, pid and hostname
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("0.0.0.0", 0))
        self.server.listen(max(16, world_size))
        self.port = self.server.getsockname()[1]
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.server, selectors.EVENT_READ)
        self.channels: dict[int, _Channel] = {}
        self.said_bye: set[int] = set()
        self.finished: dict[int, dict] = {}
        self.reasons: list[str] = []
        self.lost: dict[int, str] = {}
        self.exit_code = EXIT_HANG
        self.collect_deadline: Optional[float] = None
        self.settle_deadline: Optional[float] = None
        self.states: dict[int, dict] = {}
        self.closing = False

    # --- incidents ---------------------------------------------------------------
    def _incident(self, reason: str, code: int, lost: Optional[int] = None, note: str = "") -> None:
        if self.closing:
            return
        if lost is not None:  # the likely cause of whatever else is reported: first
            self.lost[lost] = note
            self.reasons.insert(0, reason)
        elif reason not in self.reasons:
            self.reasons.append(reason)
        if code == EXIT_PEER:
            # Say it at once: a launcher may end the survivors before the report is ready
            # (paddle.distributed.launch stops the pod within ~2 s of a rank's death).
            self.exit_code = EXIT_PEER
            for r in sorted(self.channels, key=lambda r: r == 0):
                self.channels[r].send({"t": "notice", "text": f"paddle_ext comm watchdog: {reason}"})
        if self.settle_deadline is None and self.collect_deadline is None:
            # Let closely following events (a lost rank behind a failure) arrive first.
            self.settle_deadline = time.monotonic() + self.settle

    def _collect(self) -> None:
        self.settle_deadline = None
        self.collect_deadline = time.monotonic() + self.grace
        self.states = {}
        for ch in list(self.channels.values()):
            ch.send({"t": "collect"})

    def _live(self) -> list[int]:
        return sorted(self.channels)

    def _verdict(self) -> None:
        states: dict[int, Optional[dict]] = {r: self.states.get(r) for r in range(self.world_size)}
        rep = report.analyse(states, self.world_size, "; ".join(self.reasons), self.exit_code, self.lost,
                             hosts=self.where)
        self.closing = True
        self.collect_deadline = None
        msg = {"t": "verdict", "text": rep.text, "code": self.exit_code}
        # rank 0's own channel last: its process ends as soon as it reads the verdict
        for r in sorted(self.channels, key=lambda r: r == 0):
            self.channels[r].send(msg)
        self.closing_since = time.monotonic()

    # --- messages ----------------------------------------------------------------
    def _on_message(self, ch: _Channel, msg: dict) -> None:
        t = msg.get("t")
        if t == "beat":
            return
        _debug(f"hub got {t} from rank {msg.get('rank', ch.rank)}")
        if t == "hello":
            ch.rank, ch.meta = int(msg["rank"]), msg
            self.channels[ch.rank] = ch
            self.where[ch.rank] = _describe(msg, ch.peer)
        elif t == "stuck":
            self._incident(f"rank {ch.rank} made no progress for {msg['age']:.1f} s: it waits in "
                           f"{msg['what']}", EXIT_HANG)
        elif t == "failed":
            self._incident(f"rank {ch.rank} failed: {msg['error']}", EXIT_PEER)
        elif t == "state":
            self.states[ch.rank] = msg["state"]
        elif t == "finished":
            self.finished[ch.rank] = msg["counts"]
            self._check_finished()
        elif t == "bye":
            self.said_bye.add(ch.rank)

    def _check_finished(self) -> None:
        if len(self.finished) < self.world_size:
            return
        groups: dict[str, dict[int, int]] = {}
        for r, counts in self.finished.items():
            for g, n in counts.items():
                groups.setdefault(g, {})[r] = n
        uneven = {g: c for g, c in groups.items() if len(set(c.values())) > 1}
        if uneven:
            g, c = sorted(uneven.items())[0]
            self._incident(f"the ranks finished with different numbers of operations on group {g}: "
                           + ", ".join(f"rank {r}: {n}" for r, n in sorted(c.items())), EXIT_HANG)
        else:
            for ch in self.channels.values():
                ch.send({"t": "ok"})

    def _on_closed(self, ch: _Channel) -> None:
        _debug(f"hub: connection of rank {ch.rank} closed")
        self.sel.unregister(ch.sock)
        ch.sock.close()
        if ch.rank < 0 or self.channels.get(ch.rank) is not ch:
            return
        del self.channels[ch.rank]
        if ch.rank not in self.said_bye and not self.closing:
            self._incident(f"rank {ch.rank} lost (on {self.where.get(ch.rank)}): its watchdog connection closed "
                           "without a goodbye (killed, or crashed before Python's exit handlers)", EXIT_PEER,
                           lost=ch.rank, note="lost: its watchdog connection closed without a goodbye")

    def _heartbeat(self, now: float) -> None:
        """Beats to every rank; a rank silent for heartbeat_timeout is lost."""
        if not self.heartbeat_timeout:
            return
        if now >= self.next_beat:
            self.next_beat = now + self.heartbeat_timeout / 5
            for ch in list(self.channels.values()):
                ch.send({"t": "beat"})
        if self.closing:
            return
        for ch in list(self.channels.values()):
            quiet = now - ch.last_heard
            if quiet <= self.heartbeat_timeout or ch.rank in self.said_bye:
                continue
            _debug(f"hub: rank {ch.rank} silent for {quiet:.1f} s")
            # Its connection is dropped: should the rank come back, it sees the hub gone.
            self.sel.unregister(ch.sock)
            ch.sock.close()
            del self.channels[ch.rank]
            self._incident(f"rank {ch.rank} lost (on {self.where.get(ch.rank)}): its watchdog sent nothing for "
                           f"{quiet:.1f} s (comm.heartbeat_timeout {self.heartbeat_timeout:g} s): its host or "
                           "its network link went silent, or the process is stopped", EXIT_PEER, lost=ch.rank,
                           note=f"lost: silent for {quiet:.1f} s (no heartbeat)")

    # --- the loop ----------------------------------------------------------------
    def run(self) -> None:
        try:
            self._loop()
        finally:
            for key in list(self.sel.get_map().values()):
                key.fileobj.close()
            self.sel.close()

    def _loop(self) -> None:
        while True:
            for key, _ in self.sel.select(timeout=0.1):
                if key.fileobj is self.server:
                    sock, addr = self.server.accept()
                    sock.setblocking(False)
                    self.sel.register(sock, selectors.EVENT_READ, _Channel(_nodelay(sock), str(addr[0])))
                    continue
                ch = key.data
                msgs = ch.read()
                if msgs is None:
                    self._on_closed(ch)
                    continue
                for msg in msgs:
                    self._on_message(ch, msg)
            now = time.monotonic()
            self._heartbeat(now)
            if self.settle_deadline is not None and now >= self.settle_deadline:
                self._collect()
            if self.collect_deadline is not None and (
                    now >= self.collect_deadline or set(self._live()) <= set(self.states)):
                self._verdict()
            if self.closing and (not self.channels or now - self.closing_since > 10):
                return
            if not self.closing and self.finished and len(self.said_bye) >= self.world_size:
                return


class Watchdog(threading.Thread):
    """Every rank's end of the side channel (see the module docstring)."""

    def __init__(self, rank: int, world_size: int, hub_address: tuple[str, int], tracer: CommTracer,
                 hang_timeout: float, grace: float, exit_fn: Callable[[int], None] = os._exit,
                 heartbeat_timeout: float = 0.0) -> None:
        super().__init__(name=f"paddle_ext-watchdog-rank{rank}", daemon=True)
        self.rank, self.world_size = rank, world_size
        self.hub_address = hub_address
        self.tracer = tracer
        self.hang_timeout, self.grace = hang_timeout, grace
        self.heartbeat_timeout = heartbeat_timeout  # 0: no heartbeat
        self.tick = min(1.0, max(0.05, hang_timeout / 10)) if hang_timeout else 1.0
        if heartbeat_timeout:
            self.tick = min(self.tick, heartbeat_timeout / 10)
        self.exit_fn = exit_fn
        self.status = "running"
        self.error: Optional[str] = None
        self.ok = threading.Event()
        self.connected = threading.Event()
        self.reported_stuck = False
        self.leaving = False
        self.ended = False
        self.ch: Optional[_Channel] = None

    def run(self) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                sock = socket.create_connection(self.hub_address, timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    print(f"paddle_ext comm watchdog (rank {self.rank}): cannot reach the hub at "
                          f"{self.hub_address}; running without a watchdog", file=sys.stderr, flush=True)
                    return
                time.sleep(0.2)
        # A send never blocks for good on a hub that went silent (its buffer full).
        sock.settimeout(max(5.0, self.heartbeat_timeout) if self.heartbeat_timeout else None)
        self.ch = _Channel(_nodelay(sock))
        self.ch.send(self._hello())
        self.connected.set()
        sel = selectors.DefaultSelector()
        sel.register(sock, selectors.EVENT_READ)
        next_beat = 0.0
        while True:
            if sel.select(timeout=self.tick):
                msgs = self.ch.read()
                if msgs is None:
                    if self.leaving:
                        return
                    self._hub_lost("the connection closed without a verdict", "its connection closed")
                    return
                for msg in msgs:
                    self._on_message(msg)
            if self.ended:
                return
            if self.heartbeat_timeout:
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + self.heartbeat_timeout / 5
                    self.ch.send({"t": "beat"})
                quiet = now - self.ch.last_heard
                if quiet > self.heartbeat_timeout and not self.leaving:
                    self._hub_lost(f"it sent nothing for {quiet:.1f} s (comm.heartbeat_timeout "
                                   f"{self.heartbeat_timeout:g} s): its host or its network link went silent, "
                                   "or the process is stopped", f"silent for {quiet:.1f} s (no heartbeat)")
                    return
            self._check_progress()

    def _hello(self) -> dict:
        return {"t": "hello", "rank": self.rank, "pid": os.getpid(), "host": current_host(),
                "hostname": socket.gethostname()}

    def _hub_lost(self, why: str, short: str) -> None:
        """Rank 0's hub is gone: this rank's own report (it knows only itself), then the end."""
        host = self.hub_address[0]
        reason = f"rank 0 lost (it serves the watchdog's hub) on {host}: {why}; ending rank {self.rank}"
        notes = {r: "unknown here: rank 0's hub was this rank's only line to it"
                 for r in range(self.world_size) if r != self.rank}
        notes[0] = f"lost: {short}"
        hosts = {0: host, self.rank: _describe(self._hello())}
        try:
            text = report.analyse({self.rank: self.state()}, self.world_size, reason, EXIT_PEER, notes,
                                  hosts=hosts).text
        except Exception:  # noqa: BLE001 - the report is a courtesy: the end must come
            text = f"paddle_ext comm watchdog: {reason}"
        self._end(text, EXIT_PEER)

    def _on_message(self, msg: dict) -> None:
        t = msg.get("t")
        if t == "beat":
            return
        _debug(f"rank {self.rank} got {t}")
        if t == "collect":
            self.ch.send({"t": "state", "state": self.state()})
        elif t == "verdict":
            self._end(msg["text"], int(msg["code"]))
        elif t == "ok":
            self.ok.set()
        elif t == "notice":
            print(f"[rank {self.rank}] {msg['text']}", file=sys.stderr, flush=True)

    def _end(self, text: str, code: int) -> None:
        print(f"[rank {self.rank}] " + text.replace("\n", f"\n[rank {self.rank}] "), file=sys.stderr, flush=True)
        sys.stdout.flush()
        self.ended = True
        self.exit_fn(code)  # os._exit: the process ends here (tests pass a recorder)

    def _check_progress(self) -> None:
        if not self.hang_timeout or self.reported_stuck:
            return
        rec: Optional[CommRecord] = self.tracer.overdue(self.hang_timeout)
        if rec is not None:
            self.reported_stuck = True
            self.ch.send({"t": "stuck", "age": self.tracer.clock() - rec.start,
                          "what": f"{rec.describe()} on group {rec.group}"})

    def state(self) -> dict:
        return {"status": self.status, "error": self.error, "now": self.tracer.clock(), "pid": os.getpid(),
                "snapshot": self.tracer.snapshot()}

    # --- the main thread's side ----------------------------------------------------
    def at_exit(self, error: Optional[str]) -> None:
        """The program ends: tell the hub, and (normal end) wait for the others."""
        if not self.connected.wait(5) or self.ch is None:
            return
        if error is not None:
            # Stay reachable until the verdict (which ends this process): the report then
            # shows what this rank was doing, and names a lost peer if that failed us.
            self.status, self.error = "failed", error
            self.ch.send({"t": "failed", "error": error})
            time.sleep(3 * self.grace + 2)
        else:
            self.status = "finished"
            self.ch.send({"t": "finished", "counts": {str(g): n for g, n in self.tracer.counts.items()}})
            wait = (self.hang_timeout or 60.0) + 2 * self.grace + 5
            if not self.ok.wait(wait):
                print(f"paddle_ext comm watchdog (rank {self.rank}): other ranks still running after "
                      f"{wait:.0f} s; leaving", file=sys.stderr, flush=True)
        self.leaving = True
        self.ch.send({"t": "bye"})
        # No thread of ours may still run while the interpreter finalises: close the
        # connection (the thread sees it end and returns) and wait for both threads.
        try:
            self.ch.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.join(2)
        hub = _STATE.get("hub")
        if hub is not None:
            hub.join(2)


_STATE: dict[str, Any] = {}


def running() -> Optional[Watchdog]:
    return _STATE.get("watchdog")


def start(store: Any, rank: int, world_size: int, tracer: CommTracer, hang_timeout: float,
          grace: Optional[float] = None, heartbeat_timeout: float = 15.0) -> Optional[Watchdog]:
    """Starts this rank's watchdog (collective over the job: every rank calls it, at
    init). The hub's address travels through `store` (the job's TCPStore), on this
    thread: the store's client is not shared with the watchdog thread."""
    if world_size < 2 or running() is not None:
        return running()
    grace = grace if grace is not None else min(10.0, max(2.0, hang_timeout / 4 if hang_timeout else 5.0))
    if rank == 0:
        hub = Hub(world_size, grace, heartbeat_timeout=heartbeat_timeout)
        store.set(_STORE_KEY, f"{current_host()}:{hub.port}")
        hub.start()
        _STATE["hub"] = hub
    elif hasattr(store, "wait"):
        store.wait(_STORE_KEY)
    host, port = bytes(store.get(_STORE_KEY)).decode().rsplit(":", 1)
    tracer.watch_device = bool(hang_timeout)  # NCCL ops in flight on the device count too
    dog = Watchdog(rank, world_size, (host, int(port)), tracer, hang_timeout, grace,
                   heartbeat_timeout=heartbeat_timeout)
    dog.start()
    _STATE["watchdog"] = dog
    _install_exit_hooks(dog)
    return dog


def _install_exit_hooks(dog: Watchdog) -> None:
    failure: dict[str, str] = {}
    previous = sys.excepthook

    def excepthook(kind: Any, value: Any, tb: Any) -> None:
        one_line = " ".join(str(value).split())  # Paddle's errors span lines
        failure["error"] = f"{kind.__name__}: {one_line}"[:400]
        previous(kind, value, tb)

    sys.excepthook = excepthook
    atexit.register(lambda: dog.at_exit(failure.get("error")))
