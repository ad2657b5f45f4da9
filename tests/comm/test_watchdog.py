"""The watchdog's side channel in one process: a hub and per-rank clients over real
sockets, each client with its own tracer, process exits captured."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from paddle_ext.comm import trace
from paddle_ext.comm.trace import CommTracer
from paddle_ext.comm.watchdog import EXIT_HANG, EXIT_PEER, Hub, Watchdog


class Exits:
    def __init__(self):
        self.codes = {}
        self.done = threading.Event()
        self.expected = 0

    def for_rank(self, rank):
        def exit_fn(code):
            self.codes[rank] = code
            if len(self.codes) >= self.expected:
                self.done.set()
        return exit_fn


_JOBS = []


@pytest.fixture(autouse=True)
def stop_jobs():
    """Ends every hub and watchdog a test started, so none prints into a later test."""
    yield
    while _JOBS:
        hub, dogs = _JOBS.pop()
        for dog in dogs:
            dog.leaving = dog.ended = True
            if dog.ch is not None:
                try:
                    dog.ch.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            dog.join(2)
        if hub is not None:  # None: the hub ran in a process of its own
            hub.closing, hub.closing_since = True, 0.0
            hub.join(2)


def start_job(world, hang_timeout=0.3, grace=1.0):
    hub = Hub(world, grace, settle=0.1)
    hub.start()
    exits = Exits()
    exits.expected = world
    dogs = []
    for r in range(world):
        t = CommTracer()
        t.groups[0] = tuple(range(world))  # the job's global group, as Paddle's group map gives it
        dog = Watchdog(r, world, ("127.0.0.1", hub.port), t, hang_timeout, grace, exit_fn=exits.for_rank(r))
        dog.start()
        assert dog.connected.wait(5)
        dogs.append(dog)
    _JOBS.append((hub, dogs))
    deadline = time.monotonic() + 5
    while len(hub.channels) < world and time.monotonic() < deadline:
        time.sleep(0.01)
    return hub, dogs, exits


def test_a_stuck_rank_ends_every_rank_with_the_report(capfd):
    hub, dogs, exits = start_job(3)
    for dog in dogs:
        for _ in range(3):
            dog.tracer.end(dog.tracer.begin(0, "all_reduce", [], None, "train.py:10"))
    dogs[0].tracer.begin(0, "all_reduce", [], None, "train.py:10")  # rank 0 waits; 1, 2 moved on
    dogs[1].tracer.begin(0, "all_reduce", [], None, "train.py:10")
    assert exits.done.wait(10), exits.codes
    assert exits.codes == {0: EXIT_HANG, 1: EXIT_HANG, 2: EXIT_HANG}
    err = capfd.readouterr().err
    assert "[rank 2] paddle_ext comm watchdog: rank" in err and "made no progress" in err
    assert "ranks diverge at sequence number 3: rank 2 never issued it" in err


def test_a_wait_inside_long_wait_is_not_a_hang_until_its_own_limit(capfd, monkeypatch):
    hub, dogs, exits = start_job(2, hang_timeout=0.3)
    monkeypatch.setattr(trace, "_TRACER", dogs[0].tracer)  # long_wait acts on the process's tracer
    with trace.long_wait(30):
        dogs[0].tracer.begin(0, "barrier", [], None, "save.py:20")  # rank 0 waits while rank 1 saves
    time.sleep(1.5)  # five times hang_timeout
    assert not exits.codes
    monkeypatch.setattr(trace, "_TRACER", dogs[1].tracer)
    with trace.long_wait(0.5):
        dogs[1].tracer.begin(0, "barrier", [], None, "save.py:21")  # this one outlives its limit
    assert exits.done.wait(10), exits.codes
    assert exits.codes == {0: EXIT_HANG, 1: EXIT_HANG}
    assert "barrier #0 (save.py:21, long_wait 0.5 s)" in capfd.readouterr().err


def test_a_lost_connection_names_the_lost_rank(capfd):
    hub, dogs, exits = start_job(3, hang_timeout=0)
    exits.expected = 2
    dogs[1].leaving = True  # a killed process says nothing itself
    dogs[1].ch.sock.shutdown(socket.SHUT_RDWR)  # as the kernel does for a killed process
    assert exits.done.wait(10), exits.codes
    assert exits.codes == {0: EXIT_PEER, 2: EXIT_PEER}
    assert "rank 1 lost" in capfd.readouterr().err


def test_a_failed_rank_ends_the_others_naming_its_error(capfd):
    hub, dogs, exits = start_job(2, hang_timeout=0)
    threading.Thread(target=dogs[1].at_exit, args=("RuntimeError: injected",), daemon=True).start()
    assert exits.done.wait(10), exits.codes
    assert exits.codes == {0: EXIT_PEER, 1: EXIT_PEER}
    err = capfd.readouterr().err
    assert "rank 1 failed: RuntimeError: injected" in err and "rank 1: failed: RuntimeError: injected" in err


def test_ranks_that_finish_alike_leave_without_a_report():
    hub, dogs, exits = start_job(2, hang_timeout=0)
    for dog in dogs:
        dog.tracer.end(dog.tracer.begin(0, "barrier", [], None, "x.py:1"))
    threads = [threading.Thread(target=dog.at_exit, args=(None,)) for dog in dogs]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert time.monotonic() - start < 3
    assert all(dog.ok.is_set() for dog in dogs) and not exits.codes
    hub.join(5)
    assert not hub.is_alive()


def test_ranks_that_finish_with_different_counts_are_reported(capfd):
    hub, dogs, exits = start_job(2, hang_timeout=0)
    for n, dog in zip((3, 2), dogs):
        for _ in range(n):
            dog.tracer.end(dog.tracer.begin(0, "all_reduce", [], None, "x.py:1"))
    for dog in dogs:
        threading.Thread(target=dog.at_exit, args=(None,), daemon=True).start()
    assert exits.done.wait(10), exits.codes
    assert set(exits.codes.values()) == {EXIT_HANG}
    err = capfd.readouterr().err
    assert "different numbers of operations on group 0: rank 0: 3, rank 1: 2" in err


@pytest.mark.parametrize("world", [2])
def test_hub_loss_is_named_as_rank_0(capfd, world):
    hub, dogs, exits = start_job(world, hang_timeout=0)
    for ch in list(hub.channels.values()):
        ch.sock.shutdown(socket.SHUT_RDWR)
    # every rank's exit awaited: one still printing while capfd reads its file rewinds
    # the shared offset under it (CI once read back only the other rank's newline)
    assert exits.done.wait(10), exits.codes
    assert exits.codes == {r: EXIT_PEER for r in range(world)}
    assert "rank 0 lost (it serves the watchdog's hub)" in capfd.readouterr().err


# --- the heartbeat ---------------------------------------------------------------------------------
# A rank (or its host) that goes silent without closing its connection: SIGSTOP on a peer process
# (the kernel keeps its sockets open and answers nothing, as for a host whose link went down).

BOUND = 1.0  # comm.heartbeat_timeout in these tests
SLACK = 2.0  # settle, the state collection, one select tick, a loaded machine

_PEER = r"""
import os, sys, time
from paddle_ext.comm.trace import CommTracer
from paddle_ext.comm.watchdog import Hub, Watchdog
role, port, world, rank, bound = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
if role == "hub":
    hub = Hub(world, 1.0, settle=0.1, heartbeat_timeout=bound)
    hub.start()
    port = hub.port
def exit_fn(code):
    print(f"exit {code}", flush=True)
    os._exit(code)
t = CommTracer()
t.groups[0] = tuple(range(world))
dog = Watchdog(rank, world, ("127.0.0.1", port), t, 0, 1.0, exit_fn=exit_fn, heartbeat_timeout=bound)
dog.start()
assert dog.connected.wait(10)
print(f"connected {port}", flush=True)
time.sleep(120)
"""


def start_peer(role, port, world, rank):
    proc = subprocess.Popen([sys.executable, "-c", _PEER, role, str(port), str(world), str(rank), str(BOUND)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    _PEERS.append(proc)
    line = proc.stdout.readline()
    assert line.startswith("connected"), line
    return proc, int(line.split()[1])


_PEERS = []
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def kill_peers():
    yield
    while _PEERS:
        proc = _PEERS.pop()
        proc.kill()  # a stopped process dies of SIGKILL too
        proc.wait()


def start_heartbeat_job(world, peers=(), hub_in_peer=False):
    """Ranks in `peers` run in processes of their own; with hub_in_peer, rank 0 (and its hub)."""
    exits = Exits()
    hub, port, procs = None, None, {}
    if hub_in_peer:
        procs[0], port = start_peer("hub", 0, world, 0)
    else:
        hub = Hub(world, 1.0, settle=0.1, heartbeat_timeout=BOUND)
        hub.start()
        port = hub.port
    dogs = []
    for r in range(world):
        if r in procs:
            continue
        if r in peers:
            procs[r], _ = start_peer("client", port, world, r)
            continue
        t = CommTracer()
        t.groups[0] = tuple(range(world))
        dog = Watchdog(r, world, ("127.0.0.1", port), t, 0, 1.0, exit_fn=exits.for_rank(r), heartbeat_timeout=BOUND)
        dog.start()
        assert dog.connected.wait(5)
        dogs.append(dog)
    exits.expected = len(dogs)
    _JOBS.append((hub, dogs))
    if hub is not None:
        deadline = time.monotonic() + 5
        while len(hub.channels) < world and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(hub.channels) == world
    return hub, dogs, exits, procs


def test_a_stopped_rank_is_named_lost_with_its_host_within_the_bound(capfd):
    hub, dogs, exits, procs = start_heartbeat_job(3, peers=(1,))
    time.sleep(BOUND)  # a few heartbeats went through: nobody is lost while all beat
    assert not exits.codes
    stopped = time.monotonic()
    os.kill(procs[1].pid, signal.SIGSTOP)  # its sockets stay open: no FIN, no RST
    assert exits.done.wait(BOUND + SLACK), exits.codes
    took = time.monotonic() - stopped
    assert exits.codes == {0: EXIT_PEER, 2: EXIT_PEER}
    assert took >= BOUND / 2, took  # not long before the bound: the last beat was ~bound/5 old (+ a tick)
    err = capfd.readouterr().err
    pid = procs[1].pid
    assert re.search(rf"\[rank 0\] paddle_ext comm watchdog: rank 1 lost \(on 127\.0\.0\.1 \(pid {pid}, hostname "
                     rf"[^)]+\)\): its watchdog sent nothing for [\d.]+ s \(comm.heartbeat_timeout 1 s\)", err), err
    assert "[rank 2]   rank 1: lost: silent for" in err
    assert re.search(rf"\[rank 2\] where the ranks run: rank 0 on 127\.0\.0\.1 \(pid {os.getpid()}, .*; rank 1 on "
                     rf"127\.0\.0\.1 \(pid {pid}, ", err), err


def test_a_stopped_hub_is_named_as_rank_0_by_every_other_rank_within_the_bound(capfd):
    hub, dogs, exits, procs = start_heartbeat_job(3, hub_in_peer=True)
    time.sleep(BOUND)
    assert not exits.codes
    stopped = time.monotonic()
    os.kill(procs[0].pid, signal.SIGSTOP)  # rank 0 and the hub it serves go silent together
    assert exits.done.wait(BOUND + SLACK), exits.codes
    assert time.monotonic() - stopped >= BOUND / 2
    assert exits.codes == {1: EXIT_PEER, 2: EXIT_PEER}
    err = capfd.readouterr().err
    for r in (1, 2):
        assert (f"[rank {r}] paddle_ext comm watchdog: rank 0 lost (it serves the watchdog's hub) on 127.0.0.1: "
                "it sent nothing for") in err, err
        assert f"[rank {r}]   rank {r}: is not in any communication" in err  # its own state, in its own report
        assert f"[rank {r}] where the ranks run: rank 0 on 127.0.0.1; rank {r} on 127.0.0.1 (pid {os.getpid()}, " in err
        assert f"[rank {r}] ending every rank with exit code 4" in err


def test_ranks_busy_for_three_bounds_are_not_lost():
    """The heartbeat comes from the watchdog's thread: a main thread in a Paddle kernel
    (which releases the GIL) or in pure Python (which yields it every few ms) does not
    silence it. The hub here runs in this busy process too, as on rank 0."""
    import paddle

    hub, dogs, exits, procs = start_heartbeat_job(2)
    a = paddle.randn([512, 512])
    start = time.monotonic()
    while time.monotonic() - start < 3 * BOUND:
        a = paddle.tanh(paddle.matmul(a, a))
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < 3 * BOUND:
        n += sum(i * i for i in range(1000))
    time.sleep(0.2)
    assert not exits.codes and len(hub.channels) == 2 and not hub.lost


def test_heartbeat_timeout_setting(monkeypatch):
    from paddle_ext.comm.settings import CommSettings, from_source

    assert CommSettings().heartbeat_timeout == 15.0
    assert from_source({"paddle_ext": {"comm": {"heartbeat_timeout": 4}}}).heartbeat_timeout == 4
    monkeypatch.setenv("PADDLE_EXT_HEARTBEAT_TIMEOUT", "2.5")
    assert from_source({"paddle_ext": {"comm": {"heartbeat_timeout": 4}}}).heartbeat_timeout == 2.5
    monkeypatch.setenv("PADDLE_EXT_HEARTBEAT_TIMEOUT", "soon")
    with pytest.raises(ValueError, match=r"PADDLE_EXT_HEARTBEAT_TIMEOUT = 'soon' is not allowed: seconds"):
        from_source()
    monkeypatch.delenv("PADDLE_EXT_HEARTBEAT_TIMEOUT")
    with pytest.raises(ValueError, match=r"comm.heartbeat_timeout = 0.01 is not allowed: seconds in \[0.1, 1e7\], "
                                         "0 switches the heartbeat off"):
        from_source({"paddle_ext": {"comm": {"heartbeat_timeout": 0.01}}})
    assert from_source({"paddle_ext": {"comm": {"heartbeat_timeout": 0}}}).heartbeat_timeout == 0


def test_the_side_channel_has_tcp_nodelay_on_both_ends():
    hub, dogs, exits, procs = start_heartbeat_job(2)
    socks = [dog.ch.sock for dog in dogs] + [ch.sock for ch in hub.channels.values()]
    assert len(socks) == 4
    assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in socks)
