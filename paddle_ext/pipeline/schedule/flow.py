"""Who sends what to whom: the data dependencies of actions, and channel matching.

A *payload* names one tensor crossing a stage boundary:
``(is_grad, src_stage, dst_stage, mb)``; activations flow stage s -> s+1, gradients
s+1 -> s. A compute action consumes and produces payloads; a communication action
moves exactly one.

Transports match point-to-point messages in order on each directed rank pair (gloo and
NCCL do not look at what a tensor *is*), so the k-th send from rank a to rank b meets
the k-th receive on b from a; `match_channels` pairs them that way.

Stages follow the schedule's placement (ir.py). A boundary whose two stages sit on one
rank (the V placement's last rank: stages pp-1 and pp) is a *local hand-over*: the
tensor stays on the rank, no action moves it, and `consumes` / `produces` leave it out
(the rank's own list order carries the dependency; validate checks it).
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from paddle_ext.pipeline.schedule.ir import (
    FB,
    INPUT_GRAD_KINDS,
    Action,
    Comm,
    F,
    Schedule,
    locate,
    schedule_error,
    stage_of,
)

Payload = Tuple[bool, int, int, int]

__all__ = ["Payload", "payload", "expected_peer", "is_local", "consumes", "produces",
           "match_channels"]


def payload(pp: int, rank: int, comm: Comm, placement: str = "interleaved") -> Payload:
    """The tensor a communication action moves, seen from `rank`."""
    s = stage_of(pp, rank, comm.chunk, placement)
    if comm.is_grad:
        return (True, s, s - 1, comm.mb) if comm.is_send else (True, s + 1, s, comm.mb)
    return (False, s, s + 1, comm.mb) if comm.is_send else (False, s - 1, s, comm.mb)


def expected_peer(pp: int, rank: int, comm: Comm, num_stages: int,
                  placement: str = "interleaved") -> int | None:
    """The rank `comm` must talk to, or None when its stage has no such neighbour."""
    _, src, dst, _ = payload(pp, rank, comm, placement)
    other = dst if comm.is_send else src
    if not 0 <= other < num_stages:
        return None
    return locate(pp, other, placement)[0]


def is_local(pp: int, rank: int, stage: int, placement: str = "interleaved") -> bool:
    """True when neighbouring `stage` also lives on `rank` (a local hand-over)."""
    return placement == "v" and locate(pp, stage, placement)[0] == rank


def consumes(pp: int, num_stages: int, rank: int, action: Action,
             placement: str = "interleaved") -> List[Payload]:
    """Payloads from other stages that `action` reads (not counting its own F for a B or
    an I; a W reads only what its own I left)."""
    out: List[Payload] = []
    parts = (action.f, action.b) if isinstance(action, FB) else (action,)
    for a in parts:
        if isinstance(a, F):
            s = stage_of(pp, rank, a.chunk, placement)
            if s > 0 and not is_local(pp, rank, s - 1, placement):
                out.append((False, s - 1, s, a.mb))
        elif isinstance(a, INPUT_GRAD_KINDS):  # B or I; a W moves nothing
            s = stage_of(pp, rank, a.chunk, placement)
            if s < num_stages - 1 and not is_local(pp, rank, s + 1, placement):
                out.append((True, s + 1, s, a.mb))
    return out


def produces(pp: int, num_stages: int, rank: int, action: Action,
             placement: str = "interleaved") -> List[Payload]:
    """Payloads `action` makes for other stages."""
    out: List[Payload] = []
    parts = (action.f, action.b) if isinstance(action, FB) else (action,)
    for a in parts:
        if isinstance(a, F):
            s = stage_of(pp, rank, a.chunk, placement)
            if s < num_stages - 1 and not is_local(pp, rank, s + 1, placement):
                out.append((False, s, s + 1, a.mb))
        elif isinstance(a, INPUT_GRAD_KINDS):  # B or I; a W moves nothing
            s = stage_of(pp, rank, a.chunk, placement)
            if s > 0 and not is_local(pp, rank, s - 1, placement):
                out.append((True, s, s - 1, a.mb))
    return out


def match_channels(schedule: Schedule) -> Dict[Tuple[int, int], Tuple[int, int]]:
    """Pairs every comm action with its peer's: (rank, index) -> (peer, peer's index).

    Raises ScheduleError for a send or receive left without a partner or a pair whose
    payloads differ; the error carries the position of the first offending action.
    """
    pp = schedule.pp
    sends: Dict[Tuple[int, int], List[int]] = {}
    recvs: Dict[Tuple[int, int], List[int]] = {}
    for r, acts in enumerate(schedule.ranks):
        for i, a in enumerate(acts):
            if isinstance(a, Comm):
                if not 0 <= a.peer < pp or a.peer == r:
                    raise schedule_error(schedule, f"{a} on rank {r} names peer {a.peer}, which "
                                         f"is not another rank of 0..{pp - 1}", [(r, i)])
                key = (r, a.peer) if a.is_send else (a.peer, r)
                (sends if a.is_send else recvs).setdefault(key, []).append(i)
    partner: Dict[Tuple[int, int], Tuple[int, int]] = {}
    for key in sorted(set(sends) | set(recvs)):
        src, dst = key
        s_list, r_list = sends.get(key, []), recvs.get(key, [])
        for k, (i, j) in enumerate(zip(s_list, r_list)):
            sa, ra = schedule.ranks[src][i], schedule.ranks[dst][j]
            if payload(pp, src, sa, schedule.placement) != payload(pp, dst, ra, schedule.placement):
                raise schedule_error(
                    schedule, f"send #{k} from rank {src} to rank {dst} is {sa} but rank {dst}'s receive "
                    f"#{k} from rank {src} is {ra}: transports match messages in order, so "
                    "the receiver would get the wrong tensor", [(src, i), (dst, j)])
            partner[(src, i)] = (dst, j)
            partner[(dst, j)] = (src, i)
        if len(s_list) > len(r_list):
            i = s_list[len(r_list)]
            raise schedule_error(schedule, f"{schedule.ranks[src][i]} on rank {src} has no "
                                 f"matching receive on rank {dst}", [(src, i)])
        if len(r_list) > len(s_list):
            j = r_list[len(s_list)]
            raise schedule_error(schedule, f"{schedule.ranks[dst][j]} on rank {dst} has no "
                                 f"matching send on rank {src}", [(dst, j)])
    return partner
