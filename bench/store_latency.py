"""A TCPStore round trip with and without TCP_NODELAY (the store_latency unit's cause).

One process, Paddle's own TCPStore (server and client over loopback, one worker): the
median time of a `get` of a key that is set, first as Paddle leaves the connection
(Nagle's algorithm on at the client; 3.3.1's libuv server sets TCP_NODELAY on its own
end), then after paddle_ext.comm.store_sockets.set_nodelay_on_port on the store's port.
A gloo group's rendezvous is a few such round trips on every rank, fleet.init many.
Printed: both medians and their ratio (Nagle / nodelay).

    python bench/store_latency.py [--gets 40]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench._timing import median_seconds  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gets", type=int, default=40, help="gets timed per setting (the median is printed)")
    a = p.parse_args()
    from paddle.base import core

    from paddle_ext.comm.store_sockets import set_nodelay_on_port

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = core.TCPStore("127.0.0.1", port, True, 1, 60)
    store.set("key", "value")
    nagle = median_seconds(lambda: store.get("key"), repeats=a.gets)
    changed = set_nodelay_on_port(port)
    nodelay = median_seconds(lambda: store.get("key"), repeats=a.gets)
    print(f"TCPStore get, median of {a.gets}: as Paddle leaves it {nagle * 1e3:.2f} ms; with TCP_NODELAY "
          f"({changed} socket(s) changed) {nodelay * 1e3:.3f} ms; ratio {nagle / nodelay:.0f}x")


if __name__ == "__main__":
    main()
