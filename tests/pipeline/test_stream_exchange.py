"""The stream exchange alone (runtime/stream_exchange.py): two ranks as threads of this
process over a real TCP connection on loopback.

- A flood both ways through buffers far smaller than what is in flight: every write the
  kernel cannot take whole stays queued and goes while the writer waits for its own
  receives, so nothing deadlocks and every byte arrives in order (the module's argument).
- Payloads: tuples with an integer tensor beside float ones, a zero-size tensor, and a
  later micro-batch whose shape differs (refused, naming the channel).
- A peer that goes away: the wait ends at once with an error naming the action, its
  position and the peer, and the streams refuse later steps.
"""

from __future__ import annotations

import socket
import threading
from typing import Any, Callable

import numpy as np
import paddle
import pytest

from paddle_ext.pipeline.runtime.async_p2p import CommThreadError
from paddle_ext.pipeline.runtime.stream_exchange import StreamExchange, StreamP2P
from paddle_ext.pipeline.runtime.streams import Stream
from paddle_ext.pipeline.schedule.ir import parse_action

BUFFER = 65536  # bytes: SO_SNDBUF / SO_RCVBUF asked for (the kernel doubles it); at least a loopback
# segment (64 KiB): smaller windows stall in TCP's zero-window probes, not in the exchange


def tcp_pair(buffer: int = 0) -> tuple[socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(listener.getsockname())
    b, _ = listener.accept()
    listener.close()
    for s in (a, b):
        if buffer:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    return a, b


def run_ranks(fns: list[Callable[[], Any]], timeout: float = 60) -> list:
    results: list = [None] * len(fns)

    def run(i: int) -> None:
        try:
            results[i] = fns[i]()
        except BaseException as err:  # the test raises it
            results[i] = err

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank did not finish: deadlock"
    return results


def exchange(sock: socket.socket, actions: list[str], rank: int) -> StreamExchange:
    p2p = StreamP2P({1 - rank: Stream(sock, f"rank {1 - rank}", 1 - rank)})
    return StreamExchange(p2p, [parse_action(a) for a in actions], rank, release=lambda payload: None).start()


def test_a_flood_both_ways_through_small_buffers_arrives_whole_and_in_order() -> None:
    m, rows, width = 6, 256, 512  # 512 KiB per activation against 128 KiB of socket buffers each way
    rng = np.random.default_rng(3)
    acts = [rng.standard_normal((rows, width)).astype("float32") for _ in range(m)]
    grads = [rng.standard_normal((rows, width)).astype("float32") for _ in range(m)]
    ids = [np.arange(rows, dtype="int64") + mb for mb in range(m)]
    a, b = tcp_pair(BUFFER)
    # rank 0 sends every activation before it waits for any gradient; rank 1 sends every
    # gradient of the micro-batches it has before it reads the next activation
    sends = [f"SA0.{mb}>1" for mb in range(m)]
    rank0 = sends + [f"RG0.{mb}<1" for mb in range(m)]
    rank1 = [x for mb in range(m) for x in (f"RA0.{mb}<0", f"SG0.{mb}>0")]

    def first() -> list:
        ex = exchange(a, rank0, 0)
        for mb in range(m):
            out = (paddle.to_tensor(acts[mb], stop_gradient=False), paddle.to_tensor(ids[mb]),
                   paddle.zeros([0, 3]))
            ex.publish_activation(0, mb, out)
        got = [ex.grads(0, mb)[0].numpy() for mb in range(m)]
        ex.finish()
        return got

    def second() -> list:
        ex = exchange(b, rank1, 1)
        got = []
        for mb in range(m):
            x, i, empty = ex.activation(0, mb)
            assert not x.stop_gradient and i.stop_gradient and empty.shape == [0, 3]
            got.append((x.numpy(), i.numpy()))
            ex.publish_grads(0, mb, [paddle.to_tensor(grads[mb])])
        ex.finish()
        return got

    got0, got1 = run_ranks([first, second])
    for r in (got0, got1):
        if isinstance(r, BaseException):
            raise r
    for mb in range(m):
        np.testing.assert_array_equal(got1[mb][0], acts[mb])
        np.testing.assert_array_equal(got1[mb][1], ids[mb])
        np.testing.assert_array_equal(got0[mb], grads[mb])


def test_a_payload_whose_shape_changes_is_refused_naming_the_channel() -> None:
    a, b = tcp_pair()
    ex = exchange(a, ["SA0.0>1", "SA0.1>1"], 0)
    ex.publish_activation(0, 0, paddle.ones([2, 3]))
    with pytest.raises(ValueError, match=r"payload changed between micro-batches on \('act', 0\)"):
        ex.publish_activation(0, 1, paddle.ones([4, 3]))
    b.close()


def test_a_peer_that_goes_away_ends_the_wait_naming_action_position_and_peer() -> None:
    a, b = tcp_pair()
    p2p = StreamP2P({1: Stream(a, "rank 1", 1)})
    ex = StreamExchange(p2p, [parse_action("F0.0"), parse_action("RA0.1<1")], 0, release=lambda payload: None)
    b.close()
    with pytest.raises(CommThreadError, match=r"pipeline rank 0: action RA0\.1<1 \(position 1 of 2 in this rank's "
                                              r"schedule\) failed: StreamClosed: the connection to rank 1 closed"):
        ex.activation(0, 1)
    with pytest.raises(CommThreadError, match="unusable after an earlier step failed"):
        StreamExchange(p2p, [parse_action("RA0.1<1")], 0, release=lambda payload: None)


def test_a_step_whose_send_never_got_its_tensor_is_named_at_finish() -> None:
    a, b = tcp_pair()
    ex = exchange(a, ["SA0.0>1"], 0)
    with pytest.raises(CommThreadError, match=r"sends whose tensors were never made: \[SendAct\(chunk=0, mb=0"):
        ex.finish()
    b.close()


def test_the_way_on_gloo_is_streams_unless_the_variable_says_threads_and_a_bad_value_is_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from paddle_ext.pipeline.runtime import transfer_paths

    monkeypatch.delenv(transfer_paths.PATH_ENV, raising=False)
    assert transfer_paths.gloo_way() == "streams"
    monkeypatch.setenv(transfer_paths.PATH_ENV, " Threads ")
    assert transfer_paths.gloo_way() == "threads"
    monkeypatch.setenv(transfer_paths.PATH_ENV, "sockets")
    with pytest.raises(ValueError, match=r"PADDLE_EXT_PP_TRANSFERS = 'sockets' is not allowed: one of "
                                         r"\['streams', 'threads'\]"):
        transfer_paths.gloo_way()
