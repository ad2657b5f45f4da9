"""How an engine reaches its pipeline neighbours, chosen once when it is made.

Three ways, one row each of PATHS (what they need is made only for the way chosen, so
no process group or connection exists that the schedule does not use):

- "blocking" (overlap_p2p_comm off): send/recv on the compute thread in the list's order,
  over a two-rank group per neighbouring pair (groups.neighbour_groups);
- "streams" (overlap_p2p_comm on a gloo job, the default there): TCP connections to the
  neighbours, driven by the compute thread without threads (streams.py, stream_exchange.py);
- "threads" (overlap_p2p_comm on other backends, or PADDLE_EXT_PP_TRANSFERS=threads on
  gloo): a communication thread per directed link over one-way groups (async_p2p.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from paddle_ext import host_heap, upstream
from paddle_ext.comm import eager
from paddle_ext.pipeline.runtime.groups import link_groups, neighbour_groups
from paddle_ext.pipeline.runtime.links import BlockingLinks, EagerLinks, Links
from paddle_ext.pipeline.runtime.stream_exchange import StreamP2P
from paddle_ext.pipeline.runtime.streams import connect_neighbours
from paddle_ext.pipeline.runtime.transport import P2P, default_overlap_p2p

__all__ = ["TransferPath", "transfer_path", "PATH_ENV"]

PATH_ENV = "PADDLE_EXT_PP_TRANSFERS"  # "streams" | "threads": overlap_p2p_comm's way on gloo
_GLOO_WAYS = ("streams", "threads")


@dataclass(frozen=True)
class TransferPath:
    name: str                          # "blocking", "streams" or "threads"
    links: Callable[[str], Links]      # a run's links, on a channel ("act", "eval")
    caches: tuple                      # what keeps payload headers across steps (forget_shapes)

    @property
    def overlapped(self) -> bool:      # Paddle's _overlap_p2p_comm
        return self.name != "blocking"

    def forget_shapes(self) -> None:
        for cache in self.caches:
            cache.forget_shapes()


def _blocking(hcg: Any) -> TransferPath:
    neighbours = neighbour_groups(hcg)
    eager.connect_if_enabled(neighbours.values(), p2p=True)  # FLAGS_eager_communication_connection (#57517)
    p2p = P2P(neighbours)
    return TransferPath("blocking", lambda channel: BlockingLinks(p2p, channel=channel), (p2p,))


def _threads(hcg: Any) -> TransferPath:
    to, frm = link_groups(hcg)
    eager.connect_if_enabled([*to.values(), *frm.values()], p2p=True)
    send, recv = P2P(to), P2P(frm)
    return TransferPath("threads", lambda channel: EagerLinks.on_threads(send, recv, channel), (send, recv))


def _streams(hcg: Any) -> TransferPath:
    group = hcg.get_pipe_parallel_group()
    me = group.ranks.index(upstream.global_rank())
    pp = len(group.ranks)
    peers = {stage: group.ranks[stage] for stage in {(me - 1) % pp, (me + 1) % pp} - {me}}
    p2p = StreamP2P(connect_neighbours(peers, upstream.global_rank(), upstream.job_store()))
    host_heap.keep_freed_memory()  # a CPU job: warm steps stop page-faulting (host_heap.py)
    return TransferPath("streams", lambda channel: EagerLinks.on_streams(p2p, channel), (p2p,))


PATHS: dict[str, Callable[[Any], TransferPath]] = {"blocking": _blocking, "threads": _threads, "streams": _streams}


def gloo_way() -> str:
    """overlap_p2p_comm's way on gloo: PADDLE_EXT_PP_TRANSFERS, default streams."""
    way = os.environ.get(PATH_ENV, "streams").strip().lower() or "streams"
    if way not in _GLOO_WAYS:
        raise ValueError(f"{PATH_ENV} = {os.environ.get(PATH_ENV)!r} is not allowed: one of {list(_GLOO_WAYS)}")
    return way


def transfer_path(hcg: Any, overlap: Optional[bool], placement: str) -> TransferPath:
    """The engine's way to its neighbours: `overlap` is pp_configs.overlap_p2p_comm (None:
    unset, the backend's default, transport.default_overlap_p2p). Collective over the
    job (every rank makes the same groups or connections in the same order)."""
    group = hcg.get_pipe_parallel_group()
    if overlap is None:
        overlap = default_overlap_p2p({0: group}, placement)
    if not overlap:
        return PATHS["blocking"](hcg)
    gloo = "gloo" in type(group.process_group).__name__.lower()
    way = gloo_way() if gloo and upstream.job_store() is not None else "threads"
    return PATHS[way](hcg)
