"""Closed forms for the generators' schedules, to check the simulator against.

With uniform costs (every F costs f, every B costs b, per chunk and micro-batch) and
free communication, every generator here (fthenb, 1f1b, interleaved; balanced or not)
reaches

    makespan = (vpp * M + pp - 1) * (f + b)
    bubble   = (pp - 1) / (vpp * M + pp - 1)      on every rank and overall

Lower bound: rank pp-1 cannot start before its first input crossed pp-1 forwards,
(pp-1)*f; it then has vpp*M*(f+b) of work; its last action is B of stage pp-1 (chunk
0) for the last micro-batch, whose gradient still crosses pp-1 backwards, (pp-1)*b.
The schedules meet the bound exactly (the tests check it by simulation). Every rank
does the same work, so each idles (pp-1)*(f+b). See docs/pipeline_schedules.md.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Optional

from paddle_ext.pipeline.schedule.generate import check_args, interleaved_warmup
from paddle_ext.pipeline.schedule.overlap import split_kind
from paddle_ext.pipeline.schedule.simulate import Costs, Number

__all__ = ["formula_applies", "makespan", "bubble", "peak_in_flight_bound"]


def formula_applies(costs: Optional[Costs]) -> bool:
    """The closed forms hold for uniform per-action costs and comm = 0."""
    costs = costs or Costs()
    return costs.uniform and costs.comm == 0


def makespan(pp: int, vpp: int, microbatches: int, costs: Optional[Costs] = None
             ) -> Optional[Number]:
    """(vpp*M + pp - 1) * (f + b), or None when `formula_applies` is false."""
    costs = costs or Costs()
    if not formula_applies(costs):
        return None
    return (vpp * microbatches + pp - 1) * (costs.forward + costs.backward)


def bubble(pp: int, vpp: int, microbatches: int, costs: Optional[Costs] = None
           ) -> Optional[Fraction]:
    """(pp - 1) / (vpp*M + pp - 1), or None when `formula_applies` is false."""
    if not formula_applies(costs):
        return None
    return Fraction(pp - 1, vpp * microbatches + pp - 1)


def peak_in_flight_bound(pp: int, vpp: int, microbatches: int, kind: str, rank: int) -> int:
    """Most chunk-activations `rank` holds at once (F done, B not yet) in `kind`.

    fthenb: vpp*M. 1f1b: pp - rank. interleaved (vpp > 1):
    min(2*(pp - rank - 1) + (vpp - 1)*(pp + M % pp) + 1, vpp*M).
    With the overlap transformation ("<kind>-overlap", see overlap.py) the warm-up w
    becomes w' = min(max(w + 1, 2*(pp - rank - 1) + 1), vpp*M) and the bound
    min(w' + 1, vpp*M): an F&B makes its forward's activation before it frees its
    backward's.
    """
    base, overlapped = split_kind(kind)
    k = check_args(pp, vpp, microbatches, base)
    total = vpp * microbatches
    if k == "fthenb":
        return total
    warmup = interleaved_warmup(pp, vpp, microbatches, rank)
    if overlapped:
        warmup = min(max(warmup + 1, 2 * (pp - rank - 1) + 1), total)
    return min(warmup + 1, total)
