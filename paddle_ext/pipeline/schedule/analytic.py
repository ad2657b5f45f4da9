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
from paddle_ext.pipeline.schedule.overlap import OVERLAP_SUFFIX, split_kind
from paddle_ext.pipeline.schedule.simulate import Costs, Number
from paddle_ext.pipeline.schedule.vshape import V_KINDS

__all__ = ["formula_applies", "makespan", "bubble", "peak_in_flight_bound",
           "v_peak_in_flight_bound", "v_idle"]


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
    if k in V_KINDS:
        return v_peak_in_flight_bound(pp, microbatches, k + (OVERLAP_SUFFIX if overlapped else ""),
                                      rank)
    warmup = interleaved_warmup(pp, vpp, microbatches, rank)
    if overlapped:
        warmup = min(max(warmup + 1, 2 * (pp - rank - 1) + 1), total)
    return min(warmup + 1, total)


def v_peak_in_flight_bound(pp: int, microbatches: int, kind: str, rank: int) -> int:
    """Most chunk-activations (half a stage each) `rank` holds in a V kind, with a
    full pipe: zb-v 2*pp (1F1B's pp whole-stage activations of rank 0, on every rank),
    dualpipev 2*pp + 1 (DualPipe's PP + 1 with PP = 2*pp stages). Fewer micro-batches
    hold at most 2*M."""
    full = 2 * pp if kind == "zb-v" else 2 * pp + 1
    return min(full, 2 * microbatches)


def v_idle(pp: int, kind: str, costs: Optional[Costs] = None) -> Optional[Number]:
    """Idle time of the busiest-waiting rank in a V kind with a full pipe
    (microbatches >= 2*pp), dataflow run, unit costs F = I = W (Costs(1, 2)) or, for
    dualpipev-overlap, those with any F&B cost: zb-v (pp-1)*F, the lower bound (the last
    rank cannot start before pp-1 forwards); dualpipev (pp-1)*F; dualpipev-overlap
    DualPipe's (PP/2 - 1)(F&B + B - 3W) with PP/2 = pp. None off those costs."""
    costs = costs or Costs()
    i_w = (costs.input_grad, costs.weight_grad)
    unit = (costs.forward == 1 and costs.backward == 2 and i_w in ((None, None), (1, 1))
            and not costs.per_stage and not costs.per_action and costs.comm == 0)
    if not unit:
        return None
    if kind == "dualpipev-overlap":
        fb = costs.overlap if costs.overlap is not None else (
            3 if costs.overlap_ratio is None else costs.overlap_ratio * 3)
        return (pp - 1) * (fb + 2 - 3)
    if costs.overlap is not None or costs.overlap_ratio not in (None, 1):
        return None
    return (pp - 1) * costs.forward
