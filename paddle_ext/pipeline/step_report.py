"""Paddle's pp_configs `enable_timer` and `profiling`, answered from the engine's spans.

enable_timer: fleet's PipelineParallel prints, on every rank at the end of every
forward_backward_pipeline (so every train_batch),
`time (ms) | forward_step: 12.34 | backward_step: 20.01 | ...`: fleet.utils.timer_helper's
Timers.log over every timer the process has made, each reset once printed. Its timers
wrap _forward_step, _backward_step, the p2p calls, allreduce_shared_weight_gradients and
_broadcast_final_loss. The engine's interpreter already measures each action as a span
(pipeline/timeline.py), so the line here is those spans summed under Paddle's names;
a name once printed stays in later lines (0.00 in a step without it), as Paddle's do.
I and W (zero bubble), which Paddle's dygraph engines do not run, count as
backward_step; an overlapped F&B as forward_backward_step (Paddle's overlap scheduler's
timer).

profiling: fleet appends, every step, the begin / end stamps of each forward and
backward to `./profile_record_tmp_file_for_rank_{global rank}`, one chrome-trace event a
line (ts: wall-clock milliseconds; tid: stage + 1; with virtual stages the name carries
`_VP<chunk>`), which Paddle's `pp_utils/profiler_helper.py` merges into
pipeline_profile.json. The engine writes the same records from its spans, I and W
under their own letters.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

from paddle_ext.pipeline.schedule.ir import (
    FB,
    B,
    Comm,
    F,
    I,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
    W,
)

__all__ = ["PROFILE_FILE_PREFIX", "StepTimers", "profile_records", "timer_name", "write_profile_records"]

PROFILE_FILE_PREFIX = "profile_record_tmp_file_for_rank_"  # Paddle's, read by its profiler_helper

_COMM_TIMERS = {SendAct: "send_forward", RecvAct: "recv_forward", SendGrad: "send_backward",
                RecvGrad: "recv_backward"}
Span = tuple[int, Any, float, float]  # (position, action, start, end): the interpreter's


def timer_name(action: Any) -> str | None:
    """The name of Paddle's timer that covers `action`, None for the engine's own
    bookkeeping actions (gradient sync marks), which Paddle does not time."""
    if isinstance(action, F):
        return "forward_step"
    if isinstance(action, (B, I, W)):
        return "backward_step"
    if isinstance(action, FB):
        return "forward_backward_step"
    if isinstance(action, Comm):
        return _COMM_TIMERS[type(action)]
    return None


class StepTimers:
    """One rank's timers across steps: the names in the order first seen, and the
    seconds of the step being measured."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self._seconds[name] = self._seconds.get(name, 0.0) + seconds

    def add_spans(self, spans: Iterable[Span]) -> None:
        for _, action, start, end in spans:
            name = timer_name(action)
            if name is not None:
                self.add(name, end - start)

    def line(self) -> str:
        """Paddle's Timers.log line; every timer is reset after it."""
        text = "time (ms)" + "".join(f" | {name}: {seconds * 1000.0:.2f}" for name, seconds in self._seconds.items())
        self._seconds = dict.fromkeys(self._seconds, 0.0)
        return text


def profile_records(spans: Sequence[Span], stage_id: int, virtual: bool) -> list[str]:
    """The begin / end records of each compute span, in Paddle's format: without virtual
    stages `F<mb>` / `B<mb>` ("pipeline timeline"), with them `F<mb>_VP<chunk>` ("virtual
    pipeline timeline", colours alternating by chunk, as PipelineParallelWithInterleave)."""
    records = []
    for _, action, start, end in spans:
        if isinstance(action, FB):
            letter, chunk, mb, forward = f"F{action.f.mb}B", action.f.chunk, action.b.mb, True
        elif isinstance(action, (F, B, I, W)):
            letter, chunk, mb, forward = action.token, action.chunk, action.mb, isinstance(action, F)
        else:
            continue
        if virtual:
            colours = ("thread_state_running", "thread_state_unknown") if forward else ("rail_load", "rail_idle")
            name, category, colour = f"{letter}{mb}_VP{chunk}", "virtual pipeline timeline", colours[chunk % 2]
        else:
            name, category = f"{letter}{mb}", "pipeline timeline"
            colour = "thread_state_running" if forward else "rail_idle"
        for phase, seconds in (("B", start), ("E", end)):
            records.append(f'{{"name": "{name}", "cat": "{category}", "ph": "{phase}", "pid": 0, '
                           f'"tid": {stage_id + 1}, "ts": {int(seconds * 1000)}, "cname": "{colour}"}}')
    return records


def write_profile_records(records: Sequence[str], global_rank: int, directory: str = ".") -> str:
    """Appends records to this rank's profile file (Paddle's name, in the working
    directory as Paddle writes it); returns its path."""
    path = os.path.join(directory, f"{PROFILE_FILE_PREFIX}{global_rank}")
    with open(path, "a+") as f:
        f.writelines(record + "\n" for record in records)
    return path
