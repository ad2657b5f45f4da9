"""Validation: a schedule is complete, consistent, and finishes when run.

`validate(schedule)` checks, in this order, and raises ScheduleError (message: one
sentence, then the rank x step grid with the offending action marked `[..]!`):

1. every action names a chunk in 0..vpp-1 and a micro-batch in 0..microbatches-1;
2. every rank runs exactly one F of each (chunk, micro-batch) and either one B or (zero
   bubble) one I and one W, never both; F first, I before its W (a forward-only
   schedule, evaluation's, runs the F's alone);
3. (lowered schedules) every stage boundary has exactly one send after the producing
   compute and one receive before the consuming compute (an I's gradient traffic is a
   B's), addressed to the rank that holds the neighbouring stage; GS<c>, if used,
   follows chunk c's last B or W (every W of the chunk: its parameter gradients are
   complete only then);
4. (lowered) sends and receives pair up in order on every directed rank pair, with
   equal payloads;
5. the schedule runs to the end (simulate.py: blocking point-to-point when lowered,
   or a communication thread per rank with async_p2p; dataflow when compute-only):
   no deadlock;
6. in simulated time, F of stage s starts after F of stage s-1 ended, B (or I) of
   stage s after B (or I) of stage s+1, the last stage's B (or I) after its own F, and
   a W after its own I.

It returns the SimResult of step 5, the proof that the schedule finishes.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from paddle_ext.pipeline.schedule.flow import is_local
from paddle_ext.pipeline.schedule.ir import (
    INPUT_GRAD_KINDS,
    B,
    Comm,
    F,
    GradSync,
    I,
    RecvAct,
    RecvGrad,
    Schedule,
    SendAct,
    SendGrad,
    W,
    computes,
    locate,
    schedule_error,
)
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
    """Checks 1 and 2 (ranges; per (chunk, mb) on its rank one F and either one B or one
    I and one W; F first, I before W)."""
    v, m_count = schedule.vpp, schedule.microbatches
    forward_only = schedule.forward_only
    for r, acts in enumerate(schedule.ranks):
        at: Dict[type, Dict[Tuple[int, int], int]] = {F: {}, B: {}, I: {}, W: {}}
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
                table = at[type(p)]
                if key in table:
                    raise schedule_error(
                        schedule, f"{p} appears twice on rank {r} (steps {table[key]} and {i}): "
                        "each (chunk, micro-batch) needs exactly one", [(r, table[key]), (r, i)])
                table[key] = i
                if type(p) is F:
                    continue
                _check_split(schedule, r, i, p, at)
                if type(p) is W:
                    continue
                fi = at[F].get(key)
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
                key = (c, mb)
                if key not in at[F]:
                    raise schedule_error(
                        schedule, f"rank {r} never runs F{c}.{mb} (stage "
                        f"{schedule.stage(r, c)}, micro-batch {mb})", [])
                if key not in at[B] and key not in at[I] and not forward_only:
                    raise schedule_error(
                        schedule, f"F{c}.{mb} on rank {r} (step {at[F][key]}) has no "
                        f"backward: B{c}.{mb} is missing", [(r, at[F][key])])
                if key in at[I] and key not in at[W]:
                    raise schedule_error(
                        schedule, f"I{c}.{mb} on rank {r} (step {at[I][key]}) has no W{c}.{mb}: "
                        "its weight gradients would never be computed", [(r, at[I][key])])
        _check_grad_sync(schedule, r, {**at[B], **at[W]})
        if schedule.placement == "v" and r == schedule.pp - 1:
            _check_hand_over(schedule, r, at)


def _check_hand_over(schedule: Schedule, r: int, at) -> None:
    """V placement: the last rank's chunk 1 (stage pp) takes chunk 0's output in place,
    and chunk 0 (stage pp-1) takes chunk 1's input gradient, so on that rank F0.m comes
    before F1.m and the input gradient of chunk 1 (its B or I) before chunk 0's."""
    grad = {**at[B], **at[I]}
    for mb in range(schedule.microbatches):
        for first, then, what in ((at[F].get((0, mb)), at[F].get((1, mb)), "activation"),
                                  (grad.get((1, mb)), grad.get((0, mb)), "input gradient")):
            if first is not None and then is not None and then <= first:
                acts = schedule.ranks[r]
                raise schedule_error(
                    schedule, f"{acts[then]} on rank {r} (step {then}) needs the {what} that "
                    f"{acts[first]} (step {first}) hands over locally (placement v: stages "
                    f"{schedule.pp - 1} and {schedule.pp} share rank {r})", [(r, then), (r, first)])


def _check_split(schedule: Schedule, r: int, i: int, p, at) -> None:
    """A (chunk, mb) runs one B or one I and one W (never both), its W after its I."""
    key = (p.chunk, p.mb)
    c, mb = key
    other = [(k, at[k][key]) for k in ((I, W) if type(p) is B else (B,)) if key in at[k]]
    if other:
        k, j = other[0]
        raise schedule_error(
            schedule, f"{p} on rank {r} (step {i}) and {k.__name__}{c}.{mb} (step {j}) both "
            f"compute gradients of micro-batch {mb}: a (chunk, micro-batch) runs one B, or one "
            "I and one W", [(r, j), (r, i)])
    if type(p) is W and key not in at[I]:
        later = [j for j, x in enumerate(schedule.ranks[r]) if I(c, mb) in computes(x)]
        where = (f"I{c}.{mb} comes later (step {later[0]})" if later
                 else f"rank {r} has no I{c}.{mb}")
        raise schedule_error(
            schedule, f"{p} on rank {r} (step {i}) runs before its input gradient: {where} "
            "(W needs the output gradient I received)", [(r, i)] + [(r, j) for j in later[:1]])

def _out_of_range(schedule: Schedule, r: int, i: int) -> Exception:
    return schedule_error(
        schedule, f"{schedule.ranks[r][i]} on rank {r} is out of range: chunks are "
        f"0..{schedule.vpp - 1} and micro-batches 0..{schedule.microbatches - 1}", [(r, i)])


def _check_grad_sync(schedule: Schedule, r: int, b_at: Dict[Tuple[int, int], int]) -> None:
    """GS<c> after chunk c's last B or W (`b_at`: where each (chunk, mb)'s parameter
    gradients are finished)."""
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
                f"{'weight-gradient' if type(acts[last]) is W else 'backward'} {acts[last]} (step "
                f"{last}): its gradients are not complete yet",
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
    forward_only = schedule.forward_only  # a walk over every action: once
    for r, acts in enumerate(schedule.ranks):
        compute_at: Dict[Tuple[type, int, int], int] = {}
        for i, a in enumerate(acts):
            for p in computes(a):  # an I sends and receives what a B would
                kind = B if isinstance(p, INPUT_GRAD_KINDS) else type(p)
                compute_at[(kind, p.chunk, p.mb)] = i
        at: Dict[Tuple[type, int, int], int] = {}
        for i, a in enumerate(acts):
            if isinstance(a, Comm):
                _check_one_comm(schedule, r, i, at, compute_at, forward_only)
        _check_no_comm_missing(schedule, r, at, compute_at, forward_only)


def _comm_needed(schedule: Schedule, r: int, typ: type, s: int, forward_only: bool) -> bool:
    """Whether stage s (on rank r) has a transfer of type `typ` per micro-batch."""
    other = s + 1 if typ.is_send != typ.is_grad else s - 1
    return (_NEEDS[typ][0](s, schedule.num_stages)
            and not is_local(schedule.pp, r, other, schedule.placement)
            and not (forward_only and typ.is_grad))


def _check_one_comm(schedule: Schedule, r: int, i: int, at: Dict[Tuple[type, int, int], int],
                    compute_at: Dict[Tuple[type, int, int], int], forward_only: bool) -> None:
    """Communication action i of rank r: needed, facing the right peer, once, on the
    right side of its compute; recorded in `at`."""
    pp, n, pl = schedule.pp, schedule.num_stages, schedule.placement
    acts = schedule.ranks[r]
    a = acts[i]
    s = schedule.stage(r, a.chunk)
    _needed, kind, side = _NEEDS[type(a)]
    if forward_only and a.is_grad:
        raise schedule_error(
            schedule, f"{a} on rank {r} is not needed: a forward-only schedule has no "
            "backward, so no gradient moves", [(r, i)])
    # Activation sends and gradient receives face the next stage, the others the
    # previous one.
    other = s + 1 if a.is_send != a.is_grad else s - 1
    if not 0 <= other < n:
        raise schedule_error(
            schedule, f"{a} on rank {r} is not needed: stage {s} is the "
            f"{'last' if other == n else 'first'} stage", [(r, i)])
    if is_local(pp, r, other, pl):
        raise schedule_error(
            schedule, f"{a} on rank {r} is not needed: stages {s} and {other} both live "
            "on this rank (placement v hands the tensor over locally)", [(r, i)])
    if a.peer != locate(pp, other, pl)[0]:
        raise schedule_error(
            schedule, f"{a} on rank {r} talks to rank {a.peer}, but the tensor "
            f"{'goes to' if a.is_send else 'comes from'} stage {other}, which lives on "
            f"rank {locate(pp, other, pl)[0]}", [(r, i)])
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


def _check_no_comm_missing(schedule: Schedule, r: int, at: Dict[Tuple[type, int, int], int],
                           compute_at: Dict[Tuple[type, int, int], int], forward_only: bool) -> None:
    """Every transfer rank r needs is there (`at`: those found, each checked)."""
    acts = schedule.ranks[r]
    expected = sum(1 for c in range(schedule.vpp) for typ in _NEEDS
                   if _comm_needed(schedule, r, typ, schedule.stage(r, c), forward_only)) * schedule.microbatches
    if len(at) == expected:  # no duplicates and all in range, so none is missing
        return
    for c in range(schedule.vpp):
        s = schedule.stage(r, c)
        for typ, (_needed, kind, _side) in _NEEDS.items():
            if not _comm_needed(schedule, r, typ, s, forward_only):
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
    n = schedule.num_stages
    start: Dict[Tuple[str, int, int], Tuple[object, int, int]] = {}
    end: Dict[Tuple[str, int, int], object] = {}
    for r, row in enumerate(result.spans):
        for sp in row:
            for p in computes(sp.action):
                kind = "F" if type(p) is F else ("W" if type(p) is W else "B")  # B or I: "B"
                key = (kind, schedule.stage(r, p.chunk), p.mb)
                start[key] = (sp.start, r, sp.index)
                end[key] = sp.end
    for (k, s, mb), (t, r, i) in start.items():
        if k == "W":
            dep = ("B", s, mb)  # its own I
        elif k == "F":
            dep = ("F", s - 1, mb)
        else:
            dep = ("B", s + 1, mb) if s < n - 1 else ("F", s, mb)
        if dep in end and t < end[dep]:  # type: ignore[operator]
            raise schedule_error(
                schedule, f"{schedule.ranks[r][i]} on rank {r} starts at time {t} but needs "
                f"{dep[0]} of stage {dep[1]} micro-batch {mb}, which ends at {end[dep]}",
                [(r, i)])
