"""`python -m paddle_ext schedule ...`: generate, lower, validate, simulate and draw a
pipeline schedule without Paddle.

    python -m paddle_ext schedule --pp 4 --vpp 2 --microbatches 10 --text --plot t.png

Wiring: `main(argv)` takes the arguments after "schedule" and returns the exit code;
or, under an existing argparse subcommand, `configure_parser(p)` then `run(args)`.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence, TextIO

from paddle_ext.pipeline.schedule import analytic
from paddle_ext.pipeline.schedule.generate import KINDS, ScheduleArgumentError, check_args, generate
from paddle_ext.pipeline.schedule.ir import Comm, Schedule, ScheduleError
from paddle_ext.pipeline.schedule.lower import lower
from paddle_ext.pipeline.schedule.render import plot_timeline, text_timeline
from paddle_ext.pipeline.schedule.simulate import Costs, SimResult
from paddle_ext.pipeline.schedule.validate import validate

__all__ = ["main", "configure_parser", "run"]

_FLAG_NAMES = {"pp": "--pp", "vpp": "--vpp", "microbatches": "--microbatches", "kind": "--kind"}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Generate a pipeline schedule, add its communication, validate it "
                          "(no deadlock under blocking send/recv) and simulate it.")
    parser.add_argument("--pp", type=int, default=None, help="pipeline degree (ranks), >= 2")
    parser.add_argument("--vpp", type=int, default=1,
                        help="virtual stages (model chunks) per rank, >= 1 (default 1)")
    parser.add_argument("--microbatches", "--accumulate-steps", dest="microbatches", type=int,
                        default=None, help="micro-batches per step, >= pp")
    parser.add_argument("--kind", default=None, help=f"one of {', '.join(KINDS)} "
                        "(default: 1f1b for --vpp 1, interleaved otherwise)")
    parser.add_argument("--costs", default="1,2,0", metavar="F,B,COMM",
                        help="cost of one forward, one backward, one transfer, per chunk and "
                        "micro-batch (default 1,2,0)")
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
        costs = _parse_costs(args.costs)
        schedule = _schedule(args)
    except (ScheduleArgumentError, ValueError) as exc:
        print(f"error: {exc}", file=err)
        return 2
    try:
        lowered = schedule if schedule.lowered else lower(schedule, costs)
    except ScheduleError as exc:
        print(f"invalid schedule: {exc}", file=out)
        return 1
    shown = lowered if args.lowered or schedule.lowered else schedule
    print(shown.to_text(), end="", file=out)
    print(file=out)
    try:
        result = validate(lowered, costs)
    except ScheduleError as exc:
        print(f"validation: FAILED\n{exc}", file=out)
        return 1
    transfers = sum(1 for acts in lowered.ranks for a in acts if isinstance(a, Comm) and a.is_send)
    print(f"validation: OK ({transfers} transfers; every send matched; the blocking send/recv "
          "run finishes, no deadlock)", file=out)
    print(_summary(result, costs), file=out)
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


def _parse_costs(text: str) -> Costs:
    try:
        return Costs.parse(text)
    except ValueError as exc:
        raise ValueError(f"--costs {text!r}: {exc} (expected F,B,COMM with F, B > 0 and "
                         "COMM >= 0, e.g. 1,2,0)") from None


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
    kind = args.kind or ("1f1b" if args.vpp == 1 else "interleaved")
    kind = check_args(args.pp, args.vpp, args.microbatches, kind, _FLAG_NAMES)
    return generate(args.pp, args.vpp, args.microbatches, kind)


def _fmt(x: object) -> str:
    return f"{float(x):g}"  # type: ignore[arg-type]


def _summary(result: SimResult, costs: Costs) -> str:
    s = result.schedule
    lines: List[str] = [
        f"simulation (F={_fmt(costs.forward)} B={_fmt(costs.backward)} comm={_fmt(costs.comm)} "
        f"per chunk and micro-batch; blocking send/recv): makespan {_fmt(result.makespan)}"]
    try:  # a loaded schedule may carry any label; the closed forms need a real kind
        check_args(s.pp, s.vpp, s.microbatches, s.kind)
        known = s.kind in KINDS
    except ValueError:
        known = False
    bounds = None
    if known:
        bounds = [analytic.peak_in_flight_bound(s.pp, s.vpp, s.microbatches, s.kind, r)
                  for r in range(s.pp)]
    peak_title = "peak in-flight" + (" (bound)" if bounds else "")
    lines.append(f"  {'rank':<5}{'busy':>8}{'idle':>8}{'bubble':>9}  {peak_title:<24}"
                 "received ahead")
    buffered = result.peak_buffered
    for r in range(s.pp):
        peak = f"{result.peak_in_flight[r]}" + (f" ({bounds[r]})" if bounds else "")
        lines.append(f"  {r:<5}{_fmt(result.busy[r]):>8}{_fmt(result.idle[r]):>8}"
                     f"{float(result.bubble[r]):>9.1%}  {peak:<24}{buffered[r]}")
    lines.append(f"  overall bubble {float(result.bubble_overall):.1%}")
    formula = analytic.bubble(s.pp, s.vpp, s.microbatches, costs)
    if formula is not None and known:
        lines.append(f"  analytic bubble (pp-1)/(vpp*M+pp-1) = {formula} = {float(formula):.1%}, "
                     f"makespan {_fmt(analytic.makespan(s.pp, s.vpp, s.microbatches, costs))}")
    elif known:
        lines.append("  analytic bubble: no closed form for non-uniform costs or comm > 0")
    return "\n".join(lines)
