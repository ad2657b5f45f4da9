"""paddle_ext.comm.store_sockets and the store_latency unit: TCP_NODELAY on exactly a
store's connections, a client that waits for its server's listening socket (this host's
socket table, or a connection across hosts), a store published only once it listens, and
the job store's address read as Paddle's C++ store reads it (phi's GetMasterEndpoint)."""

import contextlib
import socket
import threading
import time

import pytest
from paddle.base import core

from paddle_ext.comm import store_sockets
from paddle_ext.patches import series


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _nodelay(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


@contextlib.contextmanager
def _connection():
    """(listener, client, accepted) on a fresh loopback port."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()) as client:
            accepted, _ = listener.accept()
            with accepted:
                yield listener, client, accepted


def test_nodelay_reaches_both_ends_of_the_ports_connections_and_nothing_else():
    with _connection() as (listener, client, accepted), _connection() as (_, other_client, other_accepted):
        assert not _nodelay(client) and not _nodelay(accepted)  # Linux's default: Nagle on
        port = listener.getsockname()[1]
        assert store_sockets.set_nodelay_on_port(port) == 3  # the listener, the client, the accepted end
        assert _nodelay(client) and _nodelay(accepted)
        assert not _nodelay(other_client) and not _nodelay(other_accepted)
        assert store_sockets.set_nodelay_on_port(port) == 0  # nothing left to set
        client.sendall(b"still open")  # the scan detached, never closed, the fds
        assert accepted.recv(16) == b"still open"


def test_a_paddle_tcpstores_own_connections_get_nodelay():
    port = _free_port()
    store = core.TCPStore("127.0.0.1", port, True, 1, 30)
    # the client's connection at least (3.3.1's libuv server sets it on its own end; 2.6's
    # server does not)
    assert store_sockets.set_nodelay_on_port(port) >= 1
    store.set("key", "value")
    assert store.get("key") == b"value"
    assert store_sockets.set_nodelay_on_port(port) == 0


def test_waits_for_the_listening_socket_not_for_a_bound_one(monkeypatch):
    monkeypatch.setenv("PADDLE_CURRENT_ENDPOINT", "127.0.0.1:6170")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))  # bound, not listening: what a refused connect meets
        port = server.getsockname()[1]
        start = time.monotonic()
        assert not store_sockets.wait_until_listening("127.0.0.1", port, timeout=0.2)
        assert time.monotonic() - start >= 0.2
        timer = threading.Timer(0.3, server.listen)
        timer.start()
        start = time.monotonic()
        assert store_sockets.wait_until_listening("127.0.0.1", port, timeout=30)
        assert 0.3 <= time.monotonic() - start < 10
        timer.join()


def test_a_server_on_another_host_is_waited_for_by_connecting_to_it(monkeypatch):
    """127.0.0.2 is not this rank's host (PADDLE_CURRENT_ENDPOINT says 10.0.0.2), as a
    server across hosts is not: the socket table is not read (it is another machine's),
    the client connects until the server accepts."""
    monkeypatch.setenv("PADDLE_CURRENT_ENDPOINT", "10.0.0.2:6170")
    monkeypatch.setattr(store_sockets, "_listening", lambda port: pytest.fail("read this machine's table"))
    with socket.socket() as server:
        server.bind(("127.0.0.2", 0))  # bound, not listening: a connection is refused
        port = server.getsockname()[1]
        start = time.monotonic()
        assert not store_sockets.wait_until_listening("127.0.0.2", port, timeout=0.2)
        assert 0.2 <= time.monotonic() - start < 2
        timer = threading.Timer(0.3, server.listen)
        start = time.monotonic()  # before the timer starts: its 0.3 s count from there
        timer.start()
        assert store_sockets.wait_until_listening("127.0.0.2", port, timeout=30)
        assert 0.3 <= time.monotonic() - start < 10
        timer.join()


def test_a_store_is_published_once_it_listens_and_its_client_never_retries(capfd):
    """The master's constructor (two ranks) blocks until the client joined; the client
    learns the address only from `publish`, which must find the server listening: no
    'not yet listening' retry (Paddle's 3 s sleep) in either's log."""
    port = _free_port()
    published, clients = threading.Event(), []
    seen_listening = []

    def publish() -> None:
        with socket.socket() as probe:  # the server accepts at once: it already listens
            probe.settimeout(1)
            seen_listening.append(probe.connect_ex(("127.0.0.1", port)) == 0)
        published.set()

    def client() -> None:
        published.wait(30)
        clients.append(core.TCPStore("127.0.0.1", port, False, 2, 30))

    worker = threading.Thread(target=client)
    worker.start()
    start = time.monotonic()
    with store_sockets.publish_once_listening(port, publish):
        master = core.TCPStore("127.0.0.1", port, True, 2, 30)
    worker.join()
    assert seen_listening == [True]
    assert time.monotonic() - start < 2.5  # no 3 s retry
    master.set("key", "value")
    assert clients[0].get("key") == b"value"
    assert "not yet listening" not in capfd.readouterr().err
    assert not [t for t in threading.enumerate() if t.name.startswith("paddle_ext-store-publish")]


def test_a_store_that_listens_and_returns_before_the_watcher_saw_it_is_still_published():
    calls = []
    with store_sockets.publish_once_listening(_free_port(), lambda: calls.append("published")):
        pass  # nothing ever listens: the body "returned" (as a one-rank store's constructor)
    assert calls == ["published"]


def test_a_failed_publish_is_raised_once_the_store_is_made():
    def publish() -> None:
        raise ConnectionError("job store gone")

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with pytest.raises(RuntimeError, match=rf"publishing the store on port {port} failed: job store gone"):
            with store_sockets.publish_once_listening(port, publish):
                time.sleep(0.2)


@pytest.mark.parametrize("env, expected", [
    # phi's GetMasterEndpoint: PADDLE_MASTER, else the first trainer endpoint; MASTER_ADDR /
    # MASTER_PORT are not the store's
    ({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "6170", "PADDLE_MASTER": "10.0.0.9:7000"}, ("10.0.0.9", 7000)),
    ({"PADDLE_MASTER": "10.0.0.9:7000", "PADDLE_TRAINER_ENDPOINTS": "10.0.0.3:6170"}, ("10.0.0.9", 7000)),
    ({"PADDLE_TRAINER_ENDPOINTS": "10.0.0.3:6170,10.0.0.4:6171"}, ("10.0.0.3", 6170)),
    ({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "6170"}, None),
    ({"PADDLE_MASTER": "no-port"}, None),
    ({}, None),
])
def test_the_job_stores_address_is_read_as_paddle_reads_it(monkeypatch, env, expected):
    for name in ("MASTER_ADDR", "MASTER_PORT", "PADDLE_MASTER", "PADDLE_TRAINER_ENDPOINTS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert store_sockets.job_store_endpoint() == expected


def test_the_unit_wraps_the_job_stores_constructor_and_gives_paddles_back(clean_series):
    original = core.create_or_get_global_tcp_store
    clean_series.enable()
    wrapped = core.create_or_get_global_tcp_store
    assert wrapped is not original and wrapped.__wrapped__ is original
    assert series().installed_by(wrapped) == "store_latency"
    clean_series.disable()
    assert core.create_or_get_global_tcp_store is original


def test_nodelay_meanwhile_covers_a_master_store_that_waits_for_its_workers():
    """The master's constructor waits (GIL released) until a second rank joins, here a
    thread 0.3 s later; the connections made meanwhile get the option, and the watcher
    thread ends with the block."""
    port = _free_port()
    joined = []
    worker = threading.Timer(0.3, lambda: joined.append(core.TCPStore("127.0.0.1", port, False, 2, 30)))
    worker.start()
    with store_sockets.nodelay_meanwhile(port):
        master = core.TCPStore("127.0.0.1", port, True, 2, 30)
    worker.join()
    assert store_sockets.set_nodelay_on_port(port) == 0  # every end of both connections has it
    assert not [t for t in threading.enumerate() if t.name.startswith("paddle_ext-store-nodelay")]
    master.set("key", "value")
    assert joined[0].get("key") == b"value"
