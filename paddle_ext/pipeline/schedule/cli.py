"""`python -m paddle_ext schedule ...`: generate, lower, validate, simulate and draw a
pipeline schedule without Paddle.

    python -m paddle_ext schedule --pp 4 --vpp 2 --microbatches 10 --text --plot t.png
    python -m paddle_ext schedule --pp 4 --vpp 2 --microbatches 10 --overlap --fb-cost 0.7
    python -m paddle_ext schedule --pp 4 --vpp 1 --microbatches 8 --kind zb-h1 --plot zb.png

Wiring: `main(argv)` takes the arguments after "schedule" and returns the exit code;
or, under an existing argparse subcommand, `configure_parser(p)` then `run(args)`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import List, Optional, Sequence, TextIO

from paddle_ext.pipeline.schedule import analytic
from paddle_ext.pipeline.schedule.generate import (
    KINDS,
    ZB_KINDS,
    ScheduleArgumentError,
    check_args,
    generate,
    split_cap,
)
from paddle_ext.pipeline.schedule.ir import Comm, Schedule, ScheduleError, W, computes
from paddle_ext.pipeline.schedule.lower import lower
from paddle_ext.pipeline.schedule.overlap import (
    OVERLAP_SUFFIX,
    is_overlapped,
    overlap_pairs,
    split_kind,
)
from paddle_ext.pipeline.schedule.render import plot_timeline, text_timeline
from paddle_ext.pipeline.schedule.simulate import Costs, SimResult, simulate
from paddle_ext.pipeline.schedule.validate import validate
from paddle_ext.pipeline.schedule.vshape import V_KINDS

__all__ = ["main", "configure_parser", "run"]

_FLAG_NAMES = {"pp": "--pp", "vpp": "--vpp", "microbatches": "--microbatches", "kind": "--kind",
               "max_pending_w": "--max-pending-w"}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Generate a pipeline schedule, add its communication, validate it "
                          "(no deadlock under blocking send/recv) and simulate it.")
    parser.add_argument("--pp", type=int, default=None, help="pipeline degree (ranks), >= 2")
    parser.add_argument("--vpp", type=int, default=None,
                        help="virtual stages (model chunks) per rank, >= 1 (default 1; 2 for "
                        "the V kinds zb-v and dualpipev)")
    parser.add_argument("--microbatches", "--accumulate-steps", dest="microbatches", type=int,
                        default=None, help="micro-batches per step, >= pp with virtual "
                        "stages (>= 1 for --vpp 1 and the V kinds)")
    parser.add_argument("--kind", default=None, help=f"one of {', '.join(KINDS)} "
                        "(default: 1f1b for --vpp 1, interleaved otherwise); zb-h1 and "
                        "interleaved-zb split each backward into I (input grad) and W (weight "
                        "grads)")
    parser.add_argument("--max-pending-w", type=int, default=None, metavar="K",
                        help="zero-bubble kinds: at most K weight-gradient steps pending (I "
                        "done, W not) per rank, K >= 1 (the same as --kind zb-h1-wK)")
    parser.add_argument("--costs", default="1,2,0", metavar="F,B,COMM",
                        help="cost of one forward, one backward, one transfer, per chunk and "
                        "micro-batch (default 1,2,0: I and W cost half a B each), or "
                        "F,I,W,COMM")
    parser.add_argument("--overlap", action="store_true",
                        help="pair the steady state's forwards and backwards into overlapped "
                        "F&B steps (the forward/backward overlap scheduler; 1f1b and "
                        "interleaved)")
    parser.add_argument("--fb-cost", default=None, metavar="RATIO",
                        help="cost of an overlapped F&B as a fraction of F + B, e.g. 0.7 "
                        "(default 1); the summary compares with the plain schedule")
    parser.add_argument("--async-p2p", action="store_true",
                        help="order and run the transfers for a communication thread per rank "
                        "(pp_configs.overlap_p2p_comm) instead of blocking send/recv between "
                        "computes")
    parser.add_argument("--text", action="store_true", help="print the text timeline")
    parser.add_argument("--plot", metavar="PNG", help="write the timeline picture (matplotlib)")
    parser.add_argument("--lowered", action="store_true",
                        help="print the lowered lists (with sends/recvs), not just F/B")
    parser.add_argument("--save", metavar="FILE", help="write the lowered schedule text")
    parser.add_argument("--load", metavar="FILE",
                        help="read a schedule text instead of generating one")


def main(argv: Optional[Sequence[str]] = None, out: Optional[TextIO] = None,
         err: Optional[TextIO] = None) -> int:
    """Entry point: `argv` are the arguments after 'schedule' (default sys.argv[1:]).
    Returns the exit code: 0 valid, 1 the schedule is invalid, 2 bad arguments."""
    parser = argparse.ArgumentParser(prog="python -m paddle_ext schedule")
    configure_parser(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its message
        return int(exc.code or 0)
    return run(args, out, err)


def run(args: argparse.Namespace, out: Optional[TextIO] = None,
        err: Optional[TextIO] = None) -> int:
    """Runs a parsed command line (see configure_parser); returns the exit code."""
    out = out or sys.stdout  # looked up now, so redirected streams are honoured
    err = err or sys.stderr
    try:
        costs = _parse_costs(args.costs, args.fb_cost)
        schedule = _schedule(args)
    except (ScheduleArgumentError, ValueError) as exc:
        print(f"error: {exc}", file=err)
        return 2
    threaded = args.async_p2p
    try:
        lowered = schedule if schedule.lowered else lower(schedule, costs, async_p2p=threaded)
    except ScheduleError as exc:
        print(f"invalid schedule: {exc}", file=out)
        return 1
    shown = lowered if args.lowered or schedule.lowered else schedule
    print(shown.to_text(), end="", file=out)
    print(file=out)
    try:
        result = validate(lowered, costs, async_p2p=threaded)
    except ScheduleError as exc:
        print(f"validation: FAILED\n{exc}", file=out)
        return 1
    transfers = sum(1 for acts in lowered.ranks for a in acts if isinstance(a, Comm) and a.is_send)
    how = "with communication threads (one per link)" if threaded else "with blocking send/recv"
    print(f"validation: OK ({transfers} transfers; every send matched; the run {how} finishes, "
          "no deadlock)", file=out)
    print(_summary(result, costs), file=out)
    if is_overlapped(schedule):
        print(_overlap_summary(result, costs, threaded), file=out)
    if args.text:
        print(file=out)
        print(text_timeline(result), file=out)
    if args.save:
        with open(args.save, "w") as fh:
            fh.write(lowered.to_text())
        print(f"wrote {args.save}", file=out)
    if args.plot:
        try:
            plot_timeline(result, args.plot)
        except ImportError as exc:
            print(f"error: --plot: {exc}", file=err)
            return 2
        print(f"wrote {args.plot}", file=out)
    return 0


def _parse_costs(text: str, fb_cost: Optional[str] = None) -> Costs:
    try:
        costs = Costs.parse(text)
    except ValueError as exc:
        raise ValueError(f"--costs {text!r}: {exc} (expected F,B,COMM with F, B > 0 and "
                         "COMM >= 0, e.g. 1,2,0, or F,I,W,COMM)") from None
    if fb_cost is None:
        return costs
    try:
        ratio = Costs.parse(f"1,1,{fb_cost}").comm  # the same number syntax as --costs
        return dataclasses.replace(costs, overlap_ratio=ratio)
    except ValueError:
        raise ValueError(f"--fb-cost {fb_cost!r} is not allowed: must be a number > 0, the "
                         "cost of an F&B step as a fraction of F + B (e.g. 0.7)") from None


def _schedule(args: argparse.Namespace) -> Schedule:
    if args.load:
        with open(args.load) as fh:
            try:
                return Schedule.from_text(fh.read())
            except ScheduleError as exc:
                raise ValueError(f"--load {args.load}: {exc}") from None
    for flag, value in (("--pp", args.pp), ("--microbatches", args.microbatches)):
        if value is None:
            raise ValueError(f"{flag} is required (or --load FILE)")
    v_kind = bool(args.kind) and split_kind(str(args.kind).lower())[0].replace("_", "-") in V_KINDS
    vpp = args.vpp if args.vpp is not None else (2 if v_kind else 1)
    kind = args.kind or ("1f1b" if vpp == 1 else "interleaved")
    kind = check_args(args.pp, vpp, args.microbatches, kind, _FLAG_NAMES,
                      max_pending_w=args.max_pending_w)
    if args.overlap and not split_kind(kind)[1]:
        if kind == "fthenb":
            raise ValueError("--overlap pairs the steady state of 1f1b / interleaved schedules; "
                             "--kind fthenb has none")
        if split_cap(kind)[0] in ZB_KINDS:
            raise ValueError(f"--overlap pairs an F with a whole B; --kind {kind} splits each "
                             "B into I and W, so the two do not combine")
        kind += OVERLAP_SUFFIX
    return generate(args.pp, vpp, args.microbatches, kind)


def _fmt(x: object) -> str:
    return f"{float(x):g}"  # type: ignore[arg-type]


def _summary(result: SimResult, costs: Costs) -> str:
    s = result.schedule
    zero = any(isinstance(p, W) for acts in s.ranks for a in acts for p in computes(a))
    priced = (f"F={_fmt(costs.forward)} I={_fmt(costs.i_w[0])} W={_fmt(costs.i_w[1])}" if zero
              else f"F={_fmt(costs.forward)} B={_fmt(costs.backward)}")
    lines: List[str] = [
        f"simulation ({priced} comm={_fmt(costs.comm)} "
        f"per chunk and micro-batch; "
        f"{'communication threads' if result.mode == 'threaded' else 'blocking send/recv'}): "
        f"makespan {_fmt(result.makespan)}"]
    try:  # a loaded schedule may carry any label; the closed forms need a real kind
        known = split_cap(split_kind(check_args(s.pp, s.vpp, s.microbatches, s.kind))[0])[0] \
            in KINDS
    except ValueError:
        known = False
    bounds = pending = None
    if known:
        bounds = [analytic.peak_in_flight_bound(s.pp, s.vpp, s.microbatches, s.kind, r)
                  for r in range(s.pp)]
        pending = [analytic.peak_pending_w_bound(s.pp, s.vpp, s.microbatches, s.kind, r)
                   for r in range(s.pp)]
    peak_title = "peak in-flight" + (" (bound)" if bounds else "")
    w_title = f"{'pending W' + (' (bound)' if bounds else ''):<20}" if zero else ""
    lines.append(f"  {'rank':<5}{'busy':>8}{'idle':>8}{'bubble':>9}  {peak_title:<24}"
                 f"{w_title}received ahead")
    buffered = result.peak_buffered
    for r in range(s.pp):
        peak = f"{result.peak_in_flight[r]}" + (f" ({bounds[r]})" if bounds else "")
        w_col = ""
        if zero:
            w_col = f"{result.peak_pending_w[r]}" + (f" ({pending[r]})" if pending else "")
            w_col = f"{w_col:<20}"
        lines.append(f"  {r:<5}{_fmt(result.busy[r]):>8}{_fmt(result.idle[r]):>8}"
                     f"{float(result.bubble[r]):>9.1%}  {peak:<24}{w_col}{buffered[r]}")
    lines.append(f"  overall bubble {float(result.bubble_overall):.1%}")
    if zero:
        lines.append("  in-flight: F done, I (or B) not yet; pending W: I done, W not yet (what "
                     "the weight gradients need)")
    if known and split_cap(s.kind)[0] in ZB_KINDS:
        return "\n".join(lines + _zero_bubble_lines(s, costs, result))
    formula = analytic.bubble(s.pp, s.vpp, s.microbatches, costs)
    if known and split_kind(s.kind)[0] in V_KINDS:
        idle = analytic.v_idle(s.pp, s.kind, costs) if s.microbatches >= 2 * s.pp else None
        lines.append("  analytic idle of the most idle rank "
                     + (f"= {_fmt(idle)} in the dataflow ideal (unbounded buffers; "
                        "docs/pipeline_schedules.md, V placement)" if idle is not None
                        else "(V placement): closed form only for microbatches >= 2*pp and unit "
                        "costs F = I = W"))
    elif formula is not None and known and is_overlapped(s):
        lines.append(f"  analytic bubble of the plain schedule (pp-1)/(vpp*M+pp-1) = {formula} = "
                     f"{float(formula):.1%}, makespan "
                     f"{_fmt(analytic.makespan(s.pp, s.vpp, s.microbatches, costs))}")
    elif formula is not None and known:
        lines.append(f"  analytic bubble (pp-1)/(vpp*M+pp-1) = {formula} = {float(formula):.1%}, "
                     f"makespan {_fmt(analytic.makespan(s.pp, s.vpp, s.microbatches, costs))}")
    elif known:
        lines.append("  analytic bubble: no closed form for non-uniform costs or comm > 0")
    return "\n".join(lines)


def _overlap_summary(result: SimResult, costs: Costs, threaded: bool = False) -> str:
    """Pairs per rank, and the makespan against the same schedule without overlap: the
    plain generator's for a known kind, else this one with each F&B run as F then B."""
    s = result.schedule
    pairs = overlap_pairs(s)
    base_kind = split_kind(s.kind)[0]
    try:
        plain = generate(s.pp, s.vpp, s.microbatches, base_kind)
        what = f"the plain {base_kind} schedule"
    except ValueError:
        flat = s.compute_only()
        plain = flat.with_ranks([[p for a in acts for p in computes(a)] for acts in flat.ranks],
                                kind=base_kind)
        what = "each F&B run as its F then its B"
    base = simulate(lower(plain, costs, async_p2p=threaded), costs, async_p2p=threaded)
    ratio = costs.overlap_ratio if costs.overlap_ratio is not None else 1
    gain = 1 - float(result.makespan) / float(base.makespan)
    return "\n".join([
        f"overlap: {sum(pairs)} F&B pairs (per rank {', '.join(map(str, pairs))}), each costing "
        f"{_fmt(ratio)} x (F + B)",
        f"  makespan {_fmt(result.makespan)} with overlap, {_fmt(base.makespan)} without ({what}): "
        f"predicted gain {gain:.1%}"])


def _zero_bubble_lines(s: Schedule, costs: Costs, result: SimResult) -> List[str]:
    """The closed form of a zero-bubble kind, and the plain schedule it improves on."""
    lines = []
    formula = analytic.bubble(s.pp, s.vpp, s.microbatches, costs, s.kind)
    if formula is not None:
        idle = analytic.zb_idle(s.pp, s.vpp, costs, split_cap(s.kind)[1])
        ratio = f"{_fmt(idle)}/{_fmt(analytic.makespan(s.pp, s.vpp, s.microbatches, costs, s.kind))}"
        ratio += f" = {formula}" if str(formula) != ratio else ""
        lines.append(f"  analytic bubble idle/makespan = {ratio} = {float(formula):.1%} (zero "
                     "bubble, docs/pipeline_schedules.md)")
    else:
        lines.append("  analytic bubble: no closed form for these costs (non-uniform, comm > 0, "
                     "or W > F with --vpp > 1)")
    plain_kind = "1f1b" if s.vpp == 1 else "interleaved"
    threaded = result.mode == "threaded"
    plain = simulate(lower(generate(s.pp, s.vpp, s.microbatches, plain_kind), costs,
                           async_p2p=threaded), costs, async_p2p=threaded)
    gain = 1 - float(result.makespan) / float(plain.makespan)
    lines.append(f"  the plain {plain_kind} schedule: makespan {_fmt(plain.makespan)}, bubble "
                 f"{float(plain.bubble_overall):.1%}; zero bubble is {gain:.1%} shorter")
    return lines
