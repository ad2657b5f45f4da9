"""part-1 cherry from: Optimize the performance of tcp store initialized and connection
(#49810), extended: the job's TCPStore without Nagle's delays and without the connect retry.

Upstream #49810 made the store's waits notified instead of polled. Two waits are left in
every release: the store's connections keep Nagle's algorithm on (each request or reply
written in pieces waits for the peer's delayed ACK, 40 ms on Linux: a `get` of a set key
took 43-96 ms on 3.3.1), and a rank that reaches init_parallel_env before rank 0's server
listens is refused and sleeps 3 s before it connects again. This unit wraps
`core.create_or_get_global_tcp_store`, which init_parallel_env calls on every rank: the
other ranks wait until rank 0's server listens (on this machine: the kernel's socket
table; on another host: a plain connection it accepts, tried every few milliseconds;
paddle_ext.comm.store_sockets), and the store's connections get
TCP_NODELAY as they appear (rank 0's constructor polls the store through its own
connection until every rank has joined). Every backend's job store (gloo, NCCL, XCCL) goes through it; no value a
store holds changes. The gloo groups' own stores get the same in gloo_calc_stream (their
address is published once they listen).
"""

from __future__ import annotations

import functools
import os

from paddle_ext.comm.store_sockets import (
    job_store_endpoint,
    nodelay_meanwhile,
    wait_until_listening,
)
from paddle_ext.patches._unit import Patcher, PatchUnit

_LISTEN_WAIT_S = 60.0


def _core():
    from paddle.base import core

    return core


def _prompt_store(original):
    @functools.wraps(original)
    def create_or_get_global_tcp_store(*args, **kwargs):
        endpoint = job_store_endpoint()
        if endpoint is not None and os.getenv("PADDLE_TRAINER_ID", "0") != "0":
            # at most a minute: past it, Paddle's own connect retries go on as without the unit
            wait_until_listening(*endpoint, timeout=_LISTEN_WAIT_S)
        if endpoint is None:
            return original(*args, **kwargs)
        # rank 0's constructor waits for every rank through its own connection, polling
        with nodelay_meanwhile(endpoint[1]):
            return original(*args, **kwargs)
    return create_or_get_global_tcp_store


def _apply(patcher: Patcher) -> None:
    core = _core()
    patcher.swap(core, "create_or_get_global_tcp_store", _prompt_store(core.create_or_get_global_tcp_store))


def _unavailable() -> str | None:
    return None if hasattr(_core(), "create_or_get_global_tcp_store") else "this Paddle build has no TCPStore"


UNIT = PatchUnit(
    name="store_latency",
    upstream=(49810,),
    title="the job store without Nagle's delays or the 3 s connect retry",
    summary="fleet.init and every group creation wait neither for delayed ACKs nor for rank 0's server to listen",
    apply=_apply,
    requires=_unavailable,
)
