"""Measured timelines: what the ranks really did, in the simulator's terms.

Each rank's interpreter records wall-clock spans of its actions; gathered on
one rank they become a SimResult ("measured" mode), so the same renderers draw
the measured run next to the simulated one, and the same fields (makespan,
bubble, busy) compare them. Costs measured this way also feed the simulator,
for a prediction on the same footing as the measurement.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import median
from typing import Any, Sequence

from paddle_ext.pipeline.schedule import Costs, Schedule
from paddle_ext.pipeline.schedule.ir import FB, B, Comm, F, I, W
from paddle_ext.pipeline.schedule.simulate import SimResult, Span, peak_in_flight

RankSpans = Sequence[tuple[int, Any, float, float]]  # (position, action, start, end)


def measured_result(schedule: Schedule, spans_per_rank: Sequence[RankSpans]) -> SimResult:
    """A SimResult whose times are the measured seconds since the earliest start."""
    t0 = min(start for spans in spans_per_rank for _, _, start, _ in spans)
    rows, busy = [], []
    for rank, spans in enumerate(spans_per_rank):
        row = tuple(Span(rank, pos, action, start - t0, end - t0) for pos, action, start, end in spans)
        rows.append(row)
        busy.append(sum(s.end - s.start for s in row if isinstance(s.action, (F, B, FB, I, W))))
    makespan = max(s.end for row in rows for s in row)
    return SimResult(schedule=schedule, costs=Costs(), mode="measured", spans=tuple(rows),
                     makespan=makespan, busy=tuple(busy),
                     peak_in_flight=tuple(peak_in_flight(acts) for acts in schedule.ranks))


def measured_costs(schedule: Schedule, spans_per_rank: Sequence[RankSpans]) -> Costs:
    """Median measured seconds per stage for F and B (F, I and W for zero-bubble
    schedules), and per transfer, as Costs.

    Transfers are timed on the receiving side from the moment both ranks had
    posted them, i.e. the spans of receives that did not wait: the median of
    the shortest half, so waiting for a slow producer does not count as comm.
    """
    forward: dict[int, list[float]] = defaultdict(list)
    backward: dict[int, list[float]] = defaultdict(list)
    input_grad: dict[int, list[float]] = defaultdict(list)
    weight_grad: dict[int, list[float]] = defaultdict(list)
    comm: list[float] = []
    kinds = {F: forward, B: backward, I: input_grad, W: weight_grad}
    for rank, spans in enumerate(spans_per_rank):
        for _, action, start, end in spans:
            if type(action) in kinds:
                kinds[type(action)][schedule.stage(rank, action.chunk)].append(end - start)
            elif isinstance(action, Comm):
                comm.append(end - start)
    tiny = 1e-9  # Costs wants compute costs > 0; a timer can read 0 for a trivial stage
    per_stage = {s: (max(median(forward[s]), tiny), max(median(backward[s]), tiny))
                 for s in forward if s in backward}
    per_stage.update({s: (max(median(forward[s]), tiny), max(median(input_grad[s]), tiny),
                          max(median(weight_grad[s]), tiny))
                      for s in forward if s in input_grad and s in weight_grad and s not in per_stage})
    for s in input_grad:  # the aggregate backward of a zero-bubble schedule: I + W
        backward.setdefault(s, []).extend(i + w for i, w in zip(input_grad[s], weight_grad[s]))
    fastest = sorted(comm)[: max(1, len(comm) // 2)] if comm else [0.0]
    f_all = [t for ts in forward.values() for t in ts]
    b_all = [t for ts in backward.values() for t in ts]
    return Costs(forward=max(median(f_all), tiny), backward=max(median(b_all), tiny), comm=median(fastest),
                 per_stage=per_stage)
