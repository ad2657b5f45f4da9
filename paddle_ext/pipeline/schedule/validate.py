"""Validation: a schedule is complete, consistent, and finishes when run.

`validate(schedule)` checks, in this order, and raises ScheduleError (message: one
sentence, then the rank x step grid with the offending action marked `[..]!`):

1. every action names a chunk in 0..vpp-1 and a micro-batch in 0..microbatches-1;
2. every rank runs exactly one F and one B of each (chunk, micro-batch), F first;
3. (lowered schedules) every stage boundary has exactly one send after the producing
   compute and one receive before the consuming compute, addressed to the rank that
   holds the neighbouring stage; GS<c>, if used, follows chunk c's last B;
4. (lowered) sends and receives pair up in order on every directed rank pair, with
   equal payloads;
5. the schedule runs to the end (simulate.py: blocking point-to-point when lowered,
   or a communication thread per rank with async_p2p; dataflow when compute-only):
   no deadlock;
6. in simulated time, F of stage s starts after F of stage s-1 ended, B of stage s
   after B of stage s+1, and the last stage's B after its own F.

It returns the SimResult of step 5, the proof that the schedule finishes.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from paddle_ext.pipeline.schedule.ir import (
    B,
    Comm,
    F,
    GradSync,
    RecvAct,
    RecvGrad,
    Schedule,
    SendAct,
    SendGrad,
    computes,
    locate,
    stage_of,
)
from paddle_ext.pipeline.schedule.render import schedule_error
from paddle_ext.pipeline.schedule.simulate import Costs, SimResult, simulate

__all__ = ["validate", "check_compute", "check_comm"]


def validate(schedule: Schedule, costs: Optional[Costs] = None,
             async_p2p: bool = False) -> SimResult:
    """Runs every check in the module docstring; returns the simulation that finished.
    async_p2p: step 5 runs the lowered lists with a communication thread per rank
    (the semantics `lower(..., async_p2p=True)` orders the transfers for)."""
    check_compute(schedule)
    if schedule.lowered:
        check_comm(schedule)
    result = simulate(schedule, costs, async_p2p)  # channel matching and deadlock detection
    _check_times(schedule, result)
    return result


def check_compute(schedule: Schedule) -> None:
    """Checks 1 and 2 (ranges, one F and one B per (chunk, mb) on its rank, F first)."""
    v, m_count = schedule.vpp, schedule.microbatches
    for r, acts in enumerate(schedule.ranks):
        f_at: Dict[Tuple[int, int], int] = {}
        b_at: Dict[Tuple[int, int], int] = {}
        for i, a in enumerate(acts):
            parts = computes(a)
            if not parts:  # communication or GS: only its range matters here
                if not 0 <= a.chunk < v or not 0 <= getattr(a, "mb", 0) < m_count:
                    raise _out_of_range(schedule, r, i)
                continue
            for p in parts:
                key = (p.chunk, p.mb)
                if not 0 <= key[0] < v or not 0 <= key[1] < m_count:
                    raise _out_of_range(schedule, r, i)
                table = f_at if type(p) is F else b_at
                if key in table:
                    raise schedule_error(
                        schedule, f"{p} appears twice on rank {r} (steps {table[key]} and {i}): "
                        "each (chunk, micro-batch) needs exactly one", [(r, table[key]), (r, i)])
                table[key] = i
                if table is f_at:
                    continue
                fi = f_at.get(key)
                if fi is None:
                    later = [j for j, x in enumerate(acts) if F(*key) in computes(x)]
                    where = (f"its forward F{key[0]}.{key[1]} comes later (step {later[0]})"
                             if later else f"rank {r} has no forward F{key[0]}.{key[1]}")
                    raise schedule_error(
                        schedule, f"{p} on rank {r} (step {i}) runs before its forward: {where}",
                        [(r, i)] + [(r, j) for j in later[:1]])
                if fi == i:
                    raise schedule_error(
                        schedule, f"{a} on rank {r} pairs the forward and the backward of the "
                        "same micro-batch", [(r, i)])
        for c in range(v):
            for mb in range(m_count):
                if (c, mb) not in f_at:
                    raise schedule_error(
                        schedule, f"rank {r} never runs F{c}.{mb} (stage "
                        f"{stage_of(schedule.pp, r, c)}, micro-batch {mb})", [])
                if (c, mb) not in b_at:
                    raise schedule_error(
                        schedule, f"F{c}.{mb} on rank {r} (step {f_at[(c, mb)]}) has no "
                        f"backward: B{c}.{mb} is missing", [(r, f_at[(c, mb)])])
        _check_grad_sync(schedule, r, b_at)


def _out_of_range(schedule: Schedule, r: int, i: int) -> Exception:
    return schedule_error(
        schedule, f"{schedule.ranks[r][i]} on rank {r} is out of range: chunks are "
        f"0..{schedule.vpp - 1} and micro-batches 0..{schedule.microbatches - 1}", [(r, i)])


def _check_grad_sync(schedule: Schedule, r: int, b_at: Dict[Tuple[int, int], int]) -> None:
    acts = schedule.ranks[r]
    gs = [(i, a) for i, a in enumerate(acts) if isinstance(a, GradSync)]
    if not gs:
        return
    seen: Dict[int, int] = {}
    for i, a in gs:
        if a.chunk in seen:
            raise schedule_error(schedule, f"{a} appears twice on rank {r}",
                                 [(r, seen[a.chunk]), (r, i)])
        seen[a.chunk] = i
        last = max(b_at[(a.chunk, mb)] for mb in range(schedule.microbatches))
        if i < last:
            raise schedule_error(
                schedule, f"{a} on rank {r} (step {i}) comes before chunk {a.chunk}'s last "
                f"backward {acts[last]} (step {last}): its gradients are not complete yet",
                [(r, i), (r, last)])
    for c in range(schedule.vpp):
        if c not in seen:
            raise schedule_error(schedule, f"rank {r} syncs gradients of some chunks but has no "
                                 f"GS{c}", [])


# For each comm type: does its stage need it, and must it come before the consumer
# (recv) or after the producer (send) of the same (chunk, mb)?
_NEEDS = {
    SendAct: (lambda s, n: s < n - 1, F, "after"),
    RecvAct: (lambda s, n: s > 0, F, "before"),
    SendGrad: (lambda s, n: s > 0, B, "after"),
    RecvGrad: (lambda s, n: s < n - 1, B, "before"),
}


def check_comm(schedule: Schedule) -> None:
    """Check 3: the communication of a lowered schedule is complete and well placed."""
    pp, n = schedule.pp, schedule.num_stages
    for r, acts in enumerate(schedule.ranks):
        at: Dict[Tuple[type, int, int], int] = {}
        compute_at: Dict[Tuple[type, int, int], int] = {}
        for i, a in enumerate(acts):
            for p in computes(a):
                compute_at[(type(p), p.chunk, p.mb)] = i
        for i, a in enumerate(acts):
            if not isinstance(a, Comm):
                continue
            s = a.chunk * pp + r
            _needed, kind, side = _NEEDS[type(a)]
            # Activation sends and gradient receives face the next stage, the others the
            # previous one.
            other = s + 1 if a.is_send != a.is_grad else s - 1
            if not 0 <= other < n:
                raise schedule_error(
                    schedule, f"{a} on rank {r} is not needed: stage {s} is the "
                    f"{'last' if other == n else 'first'} stage", [(r, i)])
            if a.peer != other % pp:
                raise schedule_error(
                    schedule, f"{a} on rank {r} talks to rank {a.peer}, but the tensor "
                    f"{'goes to' if a.is_send else 'comes from'} stage {other}, which lives on "
                    f"rank {locate(pp, other)[0]}", [(r, i)])
            key = (type(a), a.chunk, a.mb)
            if key in at:
                raise schedule_error(schedule, f"{a} appears twice on rank {r}",
                                     [(r, at[key]), (r, i)])
            at[key] = i
            ci = compute_at[(kind, a.chunk, a.mb)]
            if (side == "after" and i < ci) or (side == "before" and i > ci):
                raise schedule_error(
                    schedule, f"{a} on rank {r} (step {i}) must come {side} "
                    f"{acts[ci]} (step {ci}), which {'produces' if side == 'after' else 'needs'} "
                    "its tensor", [(r, i), (r, ci)])
        expected = sum(1 for c in range(schedule.vpp) for need, _, _ in _NEEDS.values()
                       if need(stage_of(pp, r, c), n)) * schedule.microbatches
        if len(at) == expected:  # no duplicates and all in range, so none is missing
            continue
        for c in range(schedule.vpp):
            s = stage_of(pp, r, c)
            for typ, (needed, kind, _side) in _NEEDS.items():
                if not needed(s, n):
                    continue
                for mb in range(schedule.microbatches):
                    if (typ, c, mb) not in at:
                        ci = compute_at[(kind, c, mb)]
                        raise schedule_error(
                            schedule, f"{acts[ci]} on rank {r} (step {ci}) has no {typ.token}"
                            f"{c}.{mb}: stage {s} {'sends' if typ.is_send else 'receives'} "
                            f"{'gradients' if typ.is_grad else 'activations'} "
                            f"{'to' if typ.is_send else 'from'} the "
                            f"{'next' if typ.is_send != typ.is_grad else 'previous'} stage",
                            [(r, ci)])


def _check_times(schedule: Schedule, result: SimResult) -> None:
    """Check 6, on the simulated spans."""
    pp, n = schedule.pp, schedule.num_stages
    start: Dict[Tuple[str, int, int], Tuple[object, int, int]] = {}
    end: Dict[Tuple[str, int, int], object] = {}
    for r, row in enumerate(result.spans):
        for sp in row:
            for p in computes(sp.action):
                key = ("F" if isinstance(p, F) else "B", stage_of(pp, r, p.chunk), p.mb)
                start[key] = (sp.start, r, sp.index)
                end[key] = sp.end
    for (k, s, mb), (t, r, i) in start.items():
        dep = ("F", s - 1, mb) if k == "F" else (("B", s + 1, mb) if s < n - 1 else ("F", s, mb))
        if dep in end and t < end[dep]:  # type: ignore[operator]
            raise schedule_error(
                schedule, f"{schedule.ranks[r][i]} on rank {r} starts at time {t} but needs "
                f"{dep[0]} of stage {dep[1]} micro-batch {mb}, which ends at {end[dep]}",
                [(r, i)])
