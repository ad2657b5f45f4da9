"""The configuration grid of the property tests, and one case of it built end to end."""

from __future__ import annotations

from typing import List, Tuple

from paddle_ext.pipeline.schedule import Schedule, SimResult, generate, lower, validate

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
