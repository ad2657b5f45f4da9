"""One two-rank process group per pair of neighbouring pipeline stages.

Paddle's process groups number every operation with a per-group tag, and gloo
matches a send with the recv of the same tag. Over the whole pipeline group,
rank 1's first send to rank 2 would carry the tag after its receives from rank
0 while rank 2 waits on tag 0: with more than two stages the tags never line
up. A group per neighbouring pair counts only the transfers between those two
ranks, which the lowered schedule orders identically on both sides (NCCL's p2p
communicators are per pair for the same reason).
"""

from __future__ import annotations

from typing import Any

import paddle.distributed as dist

_PAIR_GROUPS: dict[tuple[int, int], Any] = {}
_LINK_GROUPS: dict[tuple[int, int], Any] = {}  # (sender, receiver) -> group used one way


def neighbour_groups(hcg: Any) -> dict[int, Any]:
    """pipeline-rank of a neighbour -> the group shared with it (created once).

    Group creation is collective over the job: every rank creates the pair
    groups of every pipeline group, in the same order.
    """
    for ranks in hcg.topology().get_comm_list("pipe"):
        pp = len(ranks)
        for i in range(pp):
            pair = tuple(sorted((ranks[i], ranks[(i + 1) % pp])))
            if pair not in _PAIR_GROUPS and pair[0] != pair[1]:
                _PAIR_GROUPS[pair] = dist.new_group(list(pair))
    me = dist.get_rank()
    pipe_ranks = hcg.get_pipe_parallel_group().ranks
    stage = pipe_ranks.index(me)
    pp = len(pipe_ranks)
    neighbours = {}
    for peer_stage in {(stage - 1) % pp, (stage + 1) % pp} - {stage}:
        pair = tuple(sorted((me, pipe_ranks[peer_stage])))
        neighbours[peer_stage] = _PAIR_GROUPS[pair]
    return neighbours


def link_groups(hcg: Any) -> tuple[dict[int, Any], dict[int, Any]]:
    """(to, from): pipeline-rank of a neighbour -> a two-rank group used only for this
    rank's sends to it / only for its sends to this rank (created once, collectively,
    in the same order on every rank).

    With overlap_p2p_comm each directed link gets its own communication thread
    (async_p2p.py), and gloo numbers the operations of a group per rank: two threads
    sharing a group would number them in whatever order the threads run. One group per
    direction keeps every group's operations in one thread's order.
    """
    for ranks in hcg.topology().get_comm_list("pipe"):
        pp = len(ranks)
        for i in range(pp):
            a, b = ranks[i], ranks[(i + 1) % pp]
            for link in ((a, b), (b, a)):
                if link not in _LINK_GROUPS and a != b:
                    _LINK_GROUPS[link] = dist.new_group(sorted(link))
    me = dist.get_rank()
    pipe_ranks = hcg.get_pipe_parallel_group().ranks
    stage = pipe_ranks.index(me)
    pp = len(pipe_ranks)
    to, frm = {}, {}
    for peer_stage in {(stage - 1) % pp, (stage + 1) % pp} - {stage}:
        peer = pipe_ranks[peer_stage]
        to[peer_stage] = _LINK_GROUPS[(me, peer)]
        frm[peer_stage] = _LINK_GROUPS[(peer, me)]
    return to, frm
