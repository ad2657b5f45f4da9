"""The private TCPStore that paddle_ext.comm.gloo gives each gloo group: its port is
held from the moment it is chosen until Paddle's store listens on it, so no other
socket can take it in between (that race once aborted a CI rank inside Paddle's
libuv server), and a rank of the group reaches the store at the published address."""

import errno
import socket

import pytest
from paddle.base import core

from paddle_ext.comm import gloo


@pytest.fixture
def job_store():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return core.TCPStore("127.0.0.1", port, True, 1, 60)


def test_the_chosen_port_cannot_be_taken_before_the_store_listens(job_store, monkeypatch):
    real_store = core.TCPStore
    seen = []

    def store_after_an_intruder(host, port, is_master, size, timeout):
        """Paddle's own TCPStore, after another socket tried to bind its port first."""
        with socket.socket() as intruder:
            with pytest.raises(OSError) as refused:
                intruder.bind(("127.0.0.1", port))
            seen.append(refused.value.errno)
        return real_store(host, port, is_master, size, timeout)

    monkeypatch.setattr(core, "TCPStore", store_after_an_intruder)
    monkeypatch.setenv("PADDLE_CURRENT_ENDPOINT", "127.0.0.1:6170")
    store = gloo._group_store(job_store, 987, 0, 1)
    assert seen == [errno.EADDRINUSE]
    store.set("answer", "42")
    monkeypatch.setattr(core, "TCPStore", real_store)
    host, port = job_store.get("paddle_ext/gloo_group_store/987").decode().rsplit(":", 1)
    assert host == "127.0.0.1"
    assert real_store(host, int(port), False, 1, 30).get("answer") == b"42"
    # once the store listens, the port is its own: a plain bind is still refused
    with socket.socket() as late, pytest.raises(OSError) as refused:
        late.bind(("127.0.0.1", int(port)))
    assert refused.value.errno == errno.EADDRINUSE
    gloo._GROUP_STORES.pop(987, None)
