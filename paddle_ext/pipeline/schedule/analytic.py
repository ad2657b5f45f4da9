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

Zero bubble (zb-h1, interleaved-zb; f, i, w the costs of an F, an I, a W; c = how many
steps W trails I on the last rank: pp - 1, or min(k - 1, pp - 1) with at most k pending
W's): every rank idles

    idle = max((pp-1)*(f+i) - c*min(i, w), (pp-1)*max(f+i-w, f, i))
    makespan = vpp*M*(f+i+w) + idle,    bubble = idle / makespan

exact on the dataflow run for any uniform costs with vpp = 1, and for vpp > 1 when
w <= f; with f = i = w = 1 also on the blocking run of the lowered lists: idle = pp - 1
uncapped, 2*(pp - 1) - c capped (each allowed pending W removes one unit).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Optional, Tuple

from paddle_ext.pipeline.schedule.generate import (
    ZB_KINDS,
    check_args,
    interleaved_warmup,
    split_cap,
    w_lag,
)
from paddle_ext.pipeline.schedule.overlap import OVERLAP_SUFFIX, split_kind
from paddle_ext.pipeline.schedule.simulate import Costs, Number
from paddle_ext.pipeline.schedule.vshape import V_KINDS

__all__ = ["formula_applies", "makespan", "bubble", "zb_idle", "peak_in_flight_bound",
           "peak_pending_w_bound", "peak_held_bound", "v_peak_in_flight_bound", "v_idle"]


def formula_applies(costs: Optional[Costs]) -> bool:
    """The closed forms hold for uniform per-action costs and comm = 0."""
    costs = costs or Costs()
    return costs.uniform and costs.comm == 0


def _zero_bubble(kind: Optional[str]) -> Tuple[bool, Optional[int]]:
    """(is a zero-bubble kind, its pending-W cap)."""
    if kind is None:
        return False, None
    base, cap = split_cap(split_kind(kind)[0])
    return base in ZB_KINDS, cap


def zb_idle(pp: int, vpp: int, costs: Optional[Costs] = None,
            max_pending_w: Optional[int] = None) -> Optional[Number]:
    """Each rank's idle time in zb-h1 / interleaved-zb (module docstring), or None where
    there is no closed form (non-uniform costs, comm > 0, vpp > 1 with W > F)."""
    costs = costs or Costs()
    f, (i, w) = costs.forward, costs.i_w
    if not formula_applies(costs) or (vpp > 1 and w > f):
        return None
    c = w_lag(pp - 1, max_pending_w)
    return max((pp - 1) * (f + i) - c * min(i, w), (pp - 1) * max(f + i - w, f, i))


def makespan(pp: int, vpp: int, microbatches: int, costs: Optional[Costs] = None,
             kind: Optional[str] = None) -> Optional[Number]:
    """(vpp*M + pp - 1) * (f + b) for the plain kinds, vpp*M*(f+i+w) + zb_idle for the
    zero-bubble ones; None where there is no closed form."""
    costs = costs or Costs()
    zero, cap = _zero_bubble(kind)
    if zero:
        idle = zb_idle(pp, vpp, costs, cap)
        i, w = costs.i_w
        return None if idle is None else vpp * microbatches * (costs.forward + i + w) + idle
    if not formula_applies(costs):
        return None
    return (vpp * microbatches + pp - 1) * (costs.forward + costs.backward)


def bubble(pp: int, vpp: int, microbatches: int, costs: Optional[Costs] = None,
           kind: Optional[str] = None) -> Optional[Fraction]:
    """(pp - 1) / (vpp*M + pp - 1) for the plain kinds, zb_idle / makespan for the
    zero-bubble ones (unit costs, uncapped: (pp-1) / (3*vpp*M + pp - 1)); None where
    there is no closed form."""
    zero, cap = _zero_bubble(kind)
    if zero:
        idle = zb_idle(pp, vpp, costs, cap)
        total = makespan(pp, vpp, microbatches, costs, kind)
        return None if idle is None else Fraction(idle) / Fraction(total)  # type: ignore[arg-type]
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
    warmup = interleaved_warmup(pp, vpp, microbatches, rank)  # zero bubble: the same
    if overlapped:
        warmup = min(max(warmup + 1, 2 * (pp - rank - 1) + 1), total)
    return min(warmup + 1, total)


def peak_pending_w_bound(pp: int, vpp: int, microbatches: int, kind: str, rank: int) -> int:
    """Most I's done whose W has not, on `rank`: lag + 1 (the W trails its I by
    `generate.w_lag` steps, and an I comes before the W it lets go); 0 for kinds
    without W."""
    k = check_args(pp, vpp, microbatches, kind)
    if split_kind(k)[0] in V_KINDS:  # full pipe: zb-v 2r + 1, dualpipev r + 1
        return min(2 * rank + 1 if k == "zb-v" else rank + 1, 2 * microbatches)
    zero, cap = _zero_bubble(k)
    if not zero:
        return 0
    return min(w_lag(rank, cap) + 1, vpp * microbatches)


def peak_held_bound(pp: int, vpp: int, microbatches: int, kind: str, rank: int) -> int:
    """Most F's done whose B or W has not, on `rank` (a pending W counted as a whole
    chunk-activation): the in-flight bound plus the W lag; zb-h1: pp on every rank,
    1F1B's rank-0 peak."""
    inflight = peak_in_flight_bound(pp, vpp, microbatches, kind, rank)
    zero, cap = _zero_bubble(check_args(pp, vpp, microbatches, kind))
    if not zero:  # and the V kinds: their in-flight bound covers the pending W's too
        return inflight
    return min(inflight + w_lag(rank, cap), vpp * microbatches)


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
