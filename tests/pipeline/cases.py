"""The configuration grid of the property tests, and one case of it built end to end."""

from __future__ import annotations

from typing import List, Tuple

from paddle_ext.pipeline.schedule import (
    INPUT_GRAD_KINDS,
    Schedule,
    SimResult,
    computes,
    generate,
    lower,
    stage_of,
    validate,
)

PPS = range(2, 9)
VPPS = range(1, 5)
LARGE_M = (64, 100)


def microbatch_counts(pp: int, kind: str) -> List[int]:
    """M from pp to 4*pp plus a few large ones; fthenb is cheap to reason about, so it
    gets the small end and one large M (its peak memory is vpp*M by design)."""
    if kind == "fthenb":
        return list(range(pp, 2 * pp + 2)) + [64]
    return list(range(pp, 4 * pp + 1)) + list(LARGE_M)


def case(pp: int, vpp: int, m: int, kind: str) -> Tuple[Schedule, Schedule, SimResult]:
    """(compute-only schedule, lowered schedule, validate()'s simulation). Not cached:
    holding thousands of schedules makes the garbage collector the slowest test."""
    s = generate(pp, vpp, m, kind)
    lowered = lower(s)
    return s, lowered, validate(lowered)


def assert_dependency_order(result: SimResult, where: str = "") -> None:
    """In simulated time: F of stage s after F of s-1; B or I of s after B or I of s+1
    (the last stage: after its own F); W after its own I. Independent of validate()."""
    pp, n = result.schedule.pp, result.schedule.num_stages
    start, end = {}, {}
    for r, row in enumerate(result.spans):
        for sp in row:
            for p in computes(sp.action):
                kind = "G" if isinstance(p, INPUT_GRAD_KINDS) else type(p).__name__
                key = (kind, stage_of(pp, r, p.chunk), p.mb)
                start[key], end[key] = sp.start, sp.end
    for (kind, st, mb), t in start.items():
        if kind == "F" and st > 0:
            assert t >= end[("F", st - 1, mb)], where
        if kind == "G":
            assert t >= (end[("G", st + 1, mb)] if st < n - 1 else end[("F", st, mb)]), where
        if kind == "W":
            assert t >= end[("G", st, mb)], where
