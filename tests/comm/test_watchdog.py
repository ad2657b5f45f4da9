"""The watchdog's side channel in one process: a hub and per-rank clients over real
sockets, each client with its own tracer, process exits captured."""

import socket
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
