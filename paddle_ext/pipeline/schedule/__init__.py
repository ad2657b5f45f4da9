"""The pipeline schedule layer, pure Python (no Paddle import anywhere below here).

    from paddle_ext.pipeline.schedule import generate, lower, validate, simulate
    s = generate(pp=4, vpp=2, microbatches=10)       # compute-only: F/B order per rank
    lowered = lower(s)                               # + sends/recvs, deadlock-free
    result = validate(lowered)                       # raises ScheduleError, else SimResult
    print(result.makespan, result.bubble_overall, result.peak_in_flight)
    print(Schedule.from_text(lowered.to_text()) == lowered)  # True
    o = overlap(s)                                   # steady-state F&B pairs (kind
                                                     # "interleaved-overlap")
    simulate(o, Costs(overlap_ratio=0.7))            # an F&B at 0.7 * (F + B)

Modules: ir (actions, text form, Schedule, placement: interleaved or V), generate (fthenb /
1f1b / interleaved / the zero-bubble zb-h1 and interleaved-zb), vshape (the V placement's
zb-v and dualpipev),
overlap (forward/backward overlap pairs), lower (communication), flow (data dependencies, channel matching), validate, simulate
(cost model), analytic (closed forms), render (timelines, PNG; the error grid is ir.step_grid), cli.
"""

from paddle_ext.pipeline.schedule.analytic import bubble as analytic_bubble
from paddle_ext.pipeline.schedule.analytic import makespan as analytic_makespan
from paddle_ext.pipeline.schedule.analytic import peak_in_flight_bound
from paddle_ext.pipeline.schedule.generate import (
    KINDS,
    ZB_KINDS,
    ScheduleArgumentError,
    check_args,
    fthenb,
    generate,
    interleaved,
    microbatch_groups,
    one_f_one_b,
    split_cap,
    w_lag,
    zero_bubble,
)
from paddle_ext.pipeline.schedule.ir import (
    FB,
    INPUT_GRAD_KINDS,
    PLACEMENTS,
    WEIGHT_GRAD_KINDS,
    Action,
    B,
    Comm,
    F,
    GradSync,
    I,
    RecvAct,
    RecvGrad,
    Schedule,
    ScheduleError,
    SendAct,
    SendGrad,
    W,
    computes,
    locate,
    parse_action,
    stage_of,
    step_grid,
)
from paddle_ext.pipeline.schedule.lower import lower
from paddle_ext.pipeline.schedule.overlap import (
    OVERLAP_SUFFIX,
    is_overlapped,
    overlap,
    overlap_pairs,
    split_kind,
)
from paddle_ext.pipeline.schedule.render import plot_timeline, text_timeline
from paddle_ext.pipeline.schedule.simulate import Costs, SimResult, Span, simulate
from paddle_ext.pipeline.schedule.validate import validate
from paddle_ext.pipeline.schedule.vshape import V_KINDS, dualpipev, zb_v

__all__ = [
    "INPUT_GRAD_KINDS", "KINDS", "OVERLAP_SUFFIX", "WEIGHT_GRAD_KINDS", "Action", "B", "I", "W", "Comm", "Costs", "F", "FB", "GradSync", "RecvAct", "RecvGrad",
    "Schedule", "ScheduleArgumentError", "ScheduleError", "SendAct", "SendGrad", "SimResult",
    "Span", "analytic_bubble", "analytic_makespan", "check_args", "computes", "fthenb", "generate",
    "interleaved", "is_overlapped", "locate", "lower", "microbatch_groups", "one_f_one_b",
    "overlap", "overlap_pairs", "parse_action", "split_kind",
    "peak_in_flight_bound", "plot_timeline", "simulate", "stage_of", "step_grid",
    "text_timeline", "validate", "ZB_KINDS", "split_cap", "w_lag", "zero_bubble",
    "PLACEMENTS", "V_KINDS", "dualpipev", "zb_v",
]
