"""paddle_ext.comm.store_sockets and the store_latency unit: TCP_NODELAY on exactly a
store's connections, a client that waits for its server's listening socket, and the
job store's address read as Paddle's C++ store reads it (phi's GetMasterEndpoint)."""

import contextlib
import socket
import threading
import time

import pytest
from paddle.base import core

from paddle_ext.comm import store_sockets


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


def test_a_server_on_another_host_is_not_waited_for(monkeypatch):
    monkeypatch.setenv("PADDLE_CURRENT_ENDPOINT", "10.0.0.2:6170")
    start = time.monotonic()
    assert not store_sockets.wait_until_listening("10.0.0.1", _free_port(), timeout=30)
    assert time.monotonic() - start < 1


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
    assert wrapped.__paddle_ext_unit__ == "store_latency"
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
