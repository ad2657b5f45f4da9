"""Paddle's TCPStores without their waits: TCP_NODELAY on their connections, and clients
that connect only once the server listens (the job's store and each gloo group's).

Paddle's TCPStore (2.6's and 3.x's libuv one alike) leaves Nagle's algorithm on. A store
request or reply written in more than one small segment then waits for the peer's
delayed ACK (40 ms on Linux) before its last segment leaves: measured on 3.3.1, a `get`
of a key that is already set took 43-96 ms, ~0.1 ms with TCP_NODELAY on both ends. Every
gloo group's rendezvous is a few such round trips: a two-rank `new_group` took 0.46 s,
and a pp4 job's pipeline groups (12 of them) 5.5 s of its first step, all of it waiting.
PyTorch's c10d store sets TCP_NODELAY on its sockets for this reason.

Paddle gives no handle on a store's sockets, so this finds them by port: the TCP sockets
of this process whose local or peer port is the store's (its server's accepted
connections on the rank that serves it, every rank's client connection). A store's
constructor returns once every rank has connected (the server waits for all workers), so
a scan right after it finds both ends. Only those sockets are touched; no byte they carry
changes, only when the kernel sends it.

A client that connects before its server listens is refused, and Paddle's tcp_connect
then sleeps 3 s (tcputils::kDelay) before it tries again ("Retry to connect to ... while
the server is not yet listening" in the rank's log). Two stores met it: every rank creates
the job store at once in init_parallel_env, and a gloo group's store was published before
its server listened (the master's constructor blocks until every rank has connected):
measured, one fleet.init in two and one two-rank group in six paid those 3 s on one host,
and across two hosts 1-3 retries in most pp2 jobs. A gloo group's address is now published
from a thread once the server listens (publish_once_listening: the serving rank watches its
own kernel's socket table, /proc/net/tcp, which works whichever host its clients are on), so
its clients connect at once. The job store's address is the launcher's, known before the
server exists: its clients wait (wait_until_listening) for the listening socket in the
socket table where the server is on this machine (nothing is sent to it), and across hosts
by connecting to it with a plain socket, every few milliseconds, until one is accepted
(then closed at once; Paddle's server reads the end of that connection and drops it).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Callable, Iterator

_FD_DIR = "/proc/self/fd"
_TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN = "0A"  # the kernel's TCP_LISTEN, as /proc/net/tcp writes a socket's state
_LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0", ""}


def current_host() -> str:
    """This rank's host as the launcher gave it (PADDLE_CURRENT_ENDPOINT), else loopback."""
    import os

    return os.getenv("PADDLE_CURRENT_ENDPOINT", "127.0.0.1:0").rsplit(":", 1)[0] or "127.0.0.1"


def set_nodelay_on_port(port: int) -> int:
    """TCP_NODELAY on every TCP socket of this process whose local or peer port is `port`
    and which does not have it yet; returns how many it set (0 where /proc is absent)."""
    try:
        fds = os.listdir(_FD_DIR)
    except OSError:
        return 0
    changed = 0
    for name in fds:
        try:
            if not os.readlink(f"{_FD_DIR}/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=int(name))
        except (OSError, ValueError):  # closed meanwhile, or not an inet socket
            continue
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM \
                    and port in (_port(sock.getsockname), _port(sock.getpeername)) \
                    and not sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                changed += 1
        except OSError:
            pass
        finally:
            sock.detach()  # the fd stays open: it is the store's
    return changed


@contextlib.contextmanager
def nodelay_meanwhile(port: int) -> Iterator[None]:
    """TCP_NODELAY on `port`'s connections as they appear, while the body runs (a store's
    constructor: it releases the GIL while it waits), and once more after it.

    A master TCPStore's constructor polls the store through its own client until every
    rank has connected: with Nagle's algorithm on that connection each poll took ~90 ms
    (measured on 3.3.1: a two-rank group's store 0.09 s on rank 0, its other ranks waiting
    as long). A thread sets the option from the moment the connection exists."""
    def keep_setting() -> bool:
        set_nodelay_on_port(port)
        return False  # connections appear until the body ends

    try:
        with _polled(f"paddle_ext-store-nodelay-{port}", keep_setting):
            yield
    finally:
        set_nodelay_on_port(port)


@contextlib.contextmanager
def _polled(name: str, step: Callable[[], bool], cap: float = 0.01) -> Iterator[None]:
    """Runs `step` on a thread named `name` while the body runs, again and again with a
    pause growing from 0.5 ms to `cap`, until it returns True or the body ends; the
    thread is joined when the body ends."""
    done = threading.Event()

    def run() -> None:
        pause = 0.0005
        while not done.is_set():
            if step():
                return
            done.wait(pause)
            pause = min(pause * 1.5, cap)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _port(address_of: object) -> int | None:
    try:
        return address_of()[1]  # type: ignore[operator,index]
    except OSError:  # a listening or unconnected socket has no peer
        return None


def job_store_endpoint() -> tuple[str, int] | None:
    """(host, port) of the job store as core.create_or_get_global_tcp_store reads them
    (phi's store_utils, every release): PADDLE_MASTER ("host:port"), else the first of
    PADDLE_TRAINER_ENDPOINTS; None when neither is set. Not MASTER_ADDR / MASTER_PORT,
    which only init_parallel_env's Python side reads."""
    endpoint = os.getenv("PADDLE_MASTER") or os.getenv("PADDLE_TRAINER_ENDPOINTS", "").split(",")[0]
    host, _, port = endpoint.rpartition(":")
    try:
        return host, int(port)
    except ValueError:
        return None


def wait_until_listening(host: str, port: int, timeout: float) -> bool:
    """Returns True once the server at (`host`, `port`) listens, False after `timeout`
    seconds (then Paddle's own connect retries go on). Where `host` is this machine
    (loopback, or this rank's host as the launcher gave it), a socket of this machine
    listening on `port` in the kernel's table; on another host, a plain connection that it
    accepts (closed at once), tried every few milliseconds while refused."""
    local = host in _LOOPBACK or host == current_host()
    deadline = time.monotonic() + timeout
    pause = 0.001
    while not (_listening(port) if local else _accepts(host, port, deadline)):
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 1.5, 0.05)
    return True


def _accepts(host: str, port: int, deadline: float) -> bool:
    """Whether a server on (`host`, `port`) accepts a connection now (closed at once, no
    byte sent). A refusal answers at once; an unreachable host is given until `deadline`."""
    try:
        with socket.create_connection((host, port), timeout=max(0.01, min(1.0, deadline - time.monotonic()))):
            return True
    except OSError:  # refused (nothing listens yet), unreachable or timed out
        return False


@contextlib.contextmanager
def publish_once_listening(port: int, publish: Callable[[], None]) -> Iterator[None]:
    """Calls `publish` as soon as a socket of this machine listens on `port`, while the
    body runs (on a thread: the body is a master store's constructor, which listens, then
    blocks until every rank has connected, GIL released), so the clients that learn the
    store's address from `publish` never connect before it listens (Paddle's 3 s retry).
    A body that returned before the thread saw the socket (a one-rank store) publishes
    after it. An error raised by `publish` is raised here once the body ends."""
    outcome: list[BaseException | None] = []  # one entry once publish ran: its error or None

    def publish_now() -> None:
        try:
            publish()
            outcome.append(None)
        except BaseException as err:  # handed to the body's thread
            outcome.append(err)

    def publish_once_there() -> bool:
        if not _listening(port):
            return False
        publish_now()
        return True

    with _polled(f"paddle_ext-store-publish-{port}", publish_once_there):
        yield
    if not outcome:
        publish_now()
    if outcome[0] is not None:
        raise RuntimeError(f"publishing the store on port {port} failed: {outcome[0]}") from outcome[0]


def _listening(port: int) -> bool:
    suffix = f":{port:04X}"
    for table in _TCP_TABLES:
        try:
            with open(table) as f:
                next(f, None)  # the header
                for line in f:
                    fields = line.split(None, 4)
                    if len(fields) > 3 and fields[3] == _LISTEN and fields[1].endswith(suffix):
                        return True
        except OSError:
            continue
    return False
