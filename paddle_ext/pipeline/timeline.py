"""Measured timelines: what the ranks really did, in the simulator's terms.

Each rank's interpreter records wall-clock spans of its actions; gathered on
one rank they become a SimResult ("measured" mode), so the same renderers draw
the measured run next to the simulated one, and the same fields (makespan,
bubble, busy) compare them. Costs measured this way also feed the simulator,
for a prediction on the same footing as the measurement.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from statistics import median
from typing import Any, Sequence

from paddle_ext.pipeline.schedule import Costs, Schedule
from paddle_ext.pipeline.schedule.ir import B, Comm, F, I, W, computes
from paddle_ext.pipeline.schedule.simulate import SimResult, Span, peak_in_flight

RankSpans = Sequence[tuple[int, Any, float, float]]  # (position, action, start, end)
_TINY = 1e-9  # Costs wants compute costs > 0; a timer can read 0 for a trivial stage


def measured_result(schedule: Schedule, spans_per_rank: Sequence[RankSpans]) -> SimResult:
    """A SimResult whose times are the measured seconds since the earliest start."""
    t0 = min(start for spans in spans_per_rank for _, _, start, _ in spans)
    rows, busy = [], []
    for rank, spans in enumerate(spans_per_rank):
        row = tuple(Span(rank, pos, action, start - t0, end - t0) for pos, action, start, end in spans)
        rows.append(row)
        busy.append(sum(s.end - s.start for s in row if computes(s.action)))
    makespan = max(s.end for row in rows for s in row)
    return SimResult(schedule=schedule, costs=Costs(), mode="measured", spans=tuple(rows),
                     makespan=makespan, busy=tuple(busy),
                     peak_in_flight=tuple(peak_in_flight(acts) for acts in schedule.ranks))


def measured_costs(schedule: Schedule, spans_per_rank: Sequence[RankSpans]) -> Costs:
    """Median measured seconds per stage for F and B (and I and W where a zero-bubble
    schedule ran them: per_stage then holds (F, I, W)), and per transfer, as Costs.

    Transfers are timed on the receiving side from the moment both ranks had
    posted them, i.e. the spans of receives that did not wait: the median of
    the shortest half, so waiting for a slow producer does not count as comm.
    """
    times: dict[type, dict[int, list[float]]] = {k: defaultdict(list) for k in (F, B, I, W)}
    comm: list[float] = []
    for rank, spans in enumerate(spans_per_rank):
        for _, action, start, end in spans:
            if type(action) in times:
                times[type(action)][schedule.stage(rank, action.chunk)].append(end - start)
            elif isinstance(action, Comm):
                comm.append(end - start)

    def med(ts: list[float]) -> float:
        return max(median(ts), _TINY)

    forward, backward, i_times, w_times = (times[k] for k in (F, B, I, W))
    per_stage: dict[int, tuple[float, ...]] = {}
    for s in forward:
        if s in i_times and s in w_times:
            per_stage[s] = (med(forward[s]), med(i_times[s]), med(w_times[s]))
        elif s in backward:
            per_stage[s] = (med(forward[s]), med(backward[s]))
    fastest = sorted(comm)[: max(1, len(comm) // 2)] if comm else [0.0]
    f_all = [t for ts in forward.values() for t in ts]
    b_all = [t for ts in backward.values() for t in ts]
    i_all = [t for ts in i_times.values() for t in ts]
    w_all = [t for ts in w_times.values() for t in ts]
    split = {"input_grad": med(i_all), "weight_grad": med(w_all)} if i_all and w_all else {}
    if not b_all:  # a zero-bubble run has no B: price one as I + W
        b_all = [split["input_grad"] + split["weight_grad"]] if split else [_TINY]
    return Costs(forward=med(f_all), backward=med(b_all), comm=median(fastest),
                 per_stage=per_stage, **split)


def replayed_costs(schedule: Schedule, spans_per_rank: Sequence[RankSpans]) -> Costs:
    """measured_costs with every compute priced at its own measured span (per_action).

    Medians assume an action costs the same whenever it runs. That holds while each rank
    has a core of its own; with more ranks than cores (pp=4 on two cores) an action run
    while every rank computes takes up to twice as long as one run in another rank's
    bubble, and a median prices both the same. Replaying each action's own time keeps
    that slowdown where it happened, so the simulated makespan differs from the measured
    one only by what the runtime adds beyond the schedule's dependencies (transfers,
    waits, Python between actions)."""
    costs = measured_costs(schedule, spans_per_rank)
    per_action = {(rank, action): max(end - start, _TINY) for rank, spans in enumerate(spans_per_rank)
                  for _, action, start, end in spans if computes(action)}
    return replace(costs, per_action=per_action)


def busy_share(result: SimResult, ranks_computing: int) -> float:
    """The share of `result`'s makespan during which at least `ranks_computing` ranks
    compute at once. With more ranks than cores (pp=4 on two cores), the cores are
    saturated for that share of the step whatever the schedule: a schedule that fills
    bubbles can only shorten the rest."""
    edges = sorted((t, d) for row in result.spans for s in row if computes(s.action)
                   for t, d in ((s.start, 1), (s.end, -1)))
    covered, running, last = 0.0, 0, 0.0
    for t, d in edges:
        if running >= ranks_computing:
            covered += t - last
        running, last = running + d, t
    return covered / float(result.makespan) if result.makespan else 0.0
