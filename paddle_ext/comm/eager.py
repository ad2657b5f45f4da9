"""Eager communication connection (#57517): every communicator at initialisation.

NCCL creates a group's communicator at its first operation, so the first training
step pays for all of them (and, in pipeline parallelism, a first p2p can hang when
not every rank of a group takes part). With FLAGS_eager_communication_connection on,
`connect` creates them up front and records each as a "connect" trace event; gloo
needs nothing: ProcessGroupGloo connects its full mesh when the group is
constructed, which the trace records as "create_group".
"""

from __future__ import annotations

import time
from typing import Any, Iterable

from paddle_ext import compat
from paddle_ext.comm.trace import tracer

__all__ = ["connect", "connect_if_enabled", "enabled"]


def enabled() -> bool:
    return compat.eager_connection_flag()


def connect(groups: Iterable[Any], p2p: bool = False) -> int:
    """Connects the communicators of `groups` this rank belongs to; returns how many
    needed it. p2p: also the point-to-point communicators (pipeline links)."""
    done = 0
    for group in groups:
        if group is None or getattr(group, "nranks", 0) < 2 or getattr(group, "rank", -1) < 0:
            continue
        start = time.time()
        how = compat.eager_connect(group.process_group, p2p)
        if how:
            tracer().event(int(group.id), "connect", how, start, time.time())
            done += 1
    return done


def connect_if_enabled(groups: Iterable[Any], p2p: bool = False) -> int:
    return connect(groups, p2p) if enabled() else 0
