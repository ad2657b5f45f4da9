"""TCP connections between neighbouring pipeline ranks, for transfers without threads.

Paddle's gloo send/recv block (a send until the peer posts its receive), so overlapping
them with compute took a Python thread per directed link plus the network thread of every
gloo group; on two cores those threads took ~10 ms of a 16-row step's compute (issue 41).
A TCP connection buffers in the kernel instead: a send is a write() that returns once the
kernel holds the bytes, and the peer's kernel keeps them until its compute thread reads
them, when a compute needs them. No thread, no hand-off, no rendezvous
(stream_exchange.py runs a step's transfers over these connections).

Each pair of neighbouring pipeline ranks shares one connection (full duplex: this rank's
sends to the peer are one byte stream, the peer's sends to it the other), made once per
engine: every rank listens on the address the launcher gave it (PADDLE_CURRENT_ENDPOINT's
host, which the other hosts reach), publishes it in the job's store, connects to the
neighbours of lower global rank and accepts the others, each connection opened by the
connecting rank's global rank (8 bytes).
"""

from __future__ import annotations

import ctypes
import itertools
import math
import socket
import struct
import time
from typing import Any, Optional

from paddle_ext.comm.store_sockets import current_host

__all__ = ["Stream", "StreamClosed", "connect_neighbours", "tensor_bytes"]

_HELLO = struct.Struct("<q")
CONNECT_TIMEOUT_S = 120.0  # for a neighbour to publish its address and connect (engine creation)
_engines = itertools.count()  # store keys per engine: every rank makes its engines in the same order


class StreamClosed(ConnectionError):
    """The peer's end of a connection closed: that rank ended (its log says why)."""


def tensor_bytes(tensor: Any) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory, without a copy (what a
    send writes from and a receive reads into)."""
    if not tensor.place.is_cpu_place():
        raise ValueError(f"pipeline streams carry CPU tensors (a gloo job's); got one on {tensor.place}")
    nbytes = math.prod(tensor.shape) * tensor.element_size()  # (numel() makes a tensor: 7 us)
    if nbytes == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")


class Stream:
    """One neighbour's connection: bytes queued to write (with what to do once written)
    and the socket, non-blocking. `peer` names the neighbour in errors."""

    __slots__ = ("sock", "peer", "rank", "out")

    def __init__(self, sock: socket.socket, peer: str, rank: int = -1) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):  # each payload goes at once
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self.sock, self.peer, self.rank = sock, peer, rank  # rank: the peer's global rank
        self.out: list[list] = []  # [view, on_written or None], in stream order

    def write(self) -> bool:
        """Writes what the kernel takes now; True if any byte went."""
        wrote = False
        while self.out:
            try:
                n = self.sock.sendmsg([v for v, _ in self.out[:64]])
            except (BlockingIOError, InterruptedError):
                return wrote
            except OSError as err:
                raise StreamClosed(f"the connection to {self.peer} failed while sending: {err}") from err
            wrote = wrote or n > 0
            while n and self.out:
                view, done = self.out[0]
                if n < len(view):
                    self.out[0][0] = view[n:]
                    break
                n -= len(view)
                self.out.pop(0)
                if done is not None:
                    done()
            while self.out and not len(self.out[0][0]):  # empty views (zero-size tensors)
                _, done = self.out.pop(0)
                if done is not None:
                    done()
        return wrote

    def read_into(self, view: memoryview) -> int:
        """Reads what has arrived into `view` (up to its length); 0 when nothing has."""
        try:
            n = self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as err:
            raise StreamClosed(f"the connection to {self.peer} failed while receiving: {err}") from err
        if n == 0:
            raise StreamClosed(f"the connection to {self.peer} closed: that rank ended (see its log)")
        return n


def _read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise StreamClosed("a pipeline neighbour closed its connection before saying who it is")
        data += chunk
    return data


def connect_neighbours(peers: dict[int, int], rank: int, store: Any, host: Optional[str] = None,
                       timeout: float = CONNECT_TIMEOUT_S) -> dict[int, Stream]:
    """pipeline-rank of a neighbour -> the Stream to it. `peers`: pipeline-rank -> global
    rank of each neighbour (one entry per distinct rank); `rank`: this rank's global rank.
    Collective over the pipeline: every rank calls it for each engine it makes."""
    host = host or current_host()
    tag = f"paddle_ext/pp_streams/{next(_engines)}"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, 0), family=family, backlog=max(8, len(peers)))
    try:
        store.set(f"{tag}/{rank}", f"{host}:{listener.getsockname()[1]}")
        streams: dict[int, Stream] = {}
        for stage, peer in peers.items():
            if peer < rank:
                peer_host, port = _published(store, f"{tag}/{peer}", timeout).rsplit(":", 1)
                sock = socket.create_connection((peer_host, int(port)), timeout=timeout)
                sock.sendall(_HELLO.pack(rank))
                streams[stage] = Stream(sock, f"pipeline rank {stage} (global rank {peer}, {peer_host})", peer)
        waiting = {peer: stage for stage, peer in peers.items() if peer > rank}
        deadline = time.monotonic() + timeout
        while waiting:
            listener.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                sock, address = listener.accept()
            except socket.timeout:
                raise TimeoutError(f"pipeline streams: global rank(s) {sorted(waiting)} did not connect to this "
                                   f"rank ({host}) within {timeout:.0f} s") from None
            sock.settimeout(timeout)
            peer = _HELLO.unpack(_read_exact(sock, _HELLO.size))[0]
            if peer in waiting:
                stage = waiting.pop(peer)
                streams[stage] = Stream(sock, f"pipeline rank {stage} (global rank {peer}, {address[0]})", peer)
            else:
                sock.close()
        return streams
    finally:
        listener.close()


def _published(store: Any, key: str, timeout: float) -> str:
    """The value another rank set under `key` (Paddle's TCPStore.get waits for it)."""
    if hasattr(store, "wait"):
        store.wait(key)
    return bytes(store.get(key)).decode()
