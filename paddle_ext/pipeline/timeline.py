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
from paddle_ext.pipeline.schedule.ir import FB, B, Comm, F, stage_of
from paddle_ext.pipeline.schedule.simulate import SimResult, Span, peak_in_flight

RankSpans = Sequence[tuple[int, Any, float, float]]  # (position, action, start, end)


def measured_result(schedule: Schedule, spans_per_rank: Sequence[RankSpans]) -> SimResult:
    """A SimResult whose times are the measured seconds since the earliest start."""
    t0 = min(start for spans in spans_per_rank for _, _, start, _ in spans)
    rows, busy = [], []
    for rank, spans in enumerate(spans_per_rank):
        row = tuple(Span(rank, pos, action, start - t0, end - t0) for pos, action, start, end in spans)
        rows.append(row)
        busy.append(sum(s.end - s.start for s in row if isinstance(s.action, (F, B, FB))))
    makespan = max(s.end for row in rows for s in row)
    return SimResult(schedule=schedule, costs=Costs(), mode="measured", spans=tuple(rows),
                     makespan=makespan, busy=tuple(busy),
                     peak_in_flight=tuple(peak_in_flight(acts) for acts in schedule.ranks))


def measured_costs(schedule: Schedule, spans_per_rank: Sequence[RankSpans]) -> Costs:
    """Median measured seconds per stage for F and B, and per transfer, as Costs.

    Transfers are timed on the receiving side from the moment both ranks had
    posted them, i.e. the spans of receives that did not wait: the median of
    the shortest half, so waiting for a slow producer does not count as comm.
    """
    forward: dict[int, list[float]] = defaultdict(list)
    backward: dict[int, list[float]] = defaultdict(list)
    comm: list[float] = []
    for rank, spans in enumerate(spans_per_rank):
        for _, action, start, end in spans:
            if isinstance(action, F):
                forward[stage_of(schedule.pp, rank, action.chunk)].append(end - start)
            elif isinstance(action, B):
                backward[stage_of(schedule.pp, rank, action.chunk)].append(end - start)
            elif isinstance(action, Comm):
                comm.append(end - start)
    tiny = 1e-9  # Costs wants compute costs > 0; a timer can read 0 for a trivial stage
    per_stage = {s: (max(median(forward[s]), tiny), max(median(backward[s]), tiny))
                 for s in forward if s in backward}
    fastest = sorted(comm)[: max(1, len(comm) // 2)] if comm else [0.0]
    f_all = [t for ts in forward.values() for t in ts]
    b_all = [t for ts in backward.values() for t in ts]
    return Costs(forward=max(median(f_all), tiny), backward=max(median(b_all), tiny), comm=median(fastest),
                 per_stage=per_stage)
