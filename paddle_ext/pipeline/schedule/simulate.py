"""Cost-model simulation of a schedule: start/end of every action, makespan, bubble,
peak in-flight activations.

Three execution semantics, chosen by the schedule and `async_p2p`:

- a *lowered* schedule (one with communication actions) runs with blocking
  point-to-point semantics, as on gloo: a send and its matching receive (matched in
  order per directed rank pair, see flow.py) both complete at
  ``max(time the sender posts, time the receiver posts) + comm``. Compute actions
  only wait for the rank's previous action: their inputs arrived through earlier
  receives.
- a lowered schedule with ``async_p2p=True`` runs as with communication threads
  (pp_configs.overlap_p2p_comm), one per directed link (sender, receiver): a link's
  transfers, in list order, meet as above on its thread, a send once its producing
  compute has ended; the computes, in list order, each wait only for their own
  receives. A transfer's span starts when its side posted it.
- a *compute-only* schedule runs with dataflow semantics and unbounded buffers: an
  action starts when its rank is free and its inputs from other ranks exist (their
  producer's end + comm). This is the ideal that `lower` aims the blocking run at.

Either way a rank that can never go on raises ScheduleError (deadlock) with the
blocked actions marked.

Costs are per action: one chunk of one micro-batch. Busy time is compute time only;
idle = makespan - busy, so waiting and transfers count as bubble.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from paddle_ext.pipeline.schedule.flow import Payload, consumes, match_channels, payload, produces
from paddle_ext.pipeline.schedule.ir import (
    FB,
    INPUT_GRAD_KINDS,
    WEIGHT_GRAD_KINDS,
    Action,
    B,
    Comm,
    F,
    GradSync,
    I,
    Schedule,
    ScheduleError,
    W,
    computes,
    schedule_error,
    stage_of,
)

Number = Union[int, float, Fraction]

__all__ = ["Number", "Costs", "Span", "SimResult", "simulate", "peak_in_flight",
           "peak_pending_w", "peak_held"]


@dataclass(frozen=True)
class Costs:
    """Per-action costs. `forward`/`backward`: one chunk of one micro-batch; `comm`: one
    send/recv pair; `overlap`: an FB action; `overlap_ratio`: an FB action as a fraction
    of its F plus its B (e.g. 0.7). Default for FB: its F plus its B.

    Zero bubble: `input_grad` / `weight_grad` price an I / a W. Left out, they split the
    backward: both None gives backward / 2 each (F=1, B=2: the unit costs F = I = W = 1),
    one given leaves the other backward minus it. A B keeps costing `backward`.

    Overrides, most specific first: `per_action[(rank, action)]`, then
    `per_stage[global_stage] = (forward, backward)` or `(forward, input_grad,
    weight_grad)` (B then costs I + W; with two numbers I and W split B as above). For
    per-chunk costs, list every stage of the chunk.
    """

    forward: Number = 1
    backward: Number = 2
    comm: Number = 0
    overlap: Optional[Number] = None
    overlap_ratio: Optional[Number] = None
    input_grad: Optional[Number] = None
    weight_grad: Optional[Number] = None
    per_stage: Mapping[int, Tuple[Number, ...]] = field(default_factory=dict)
    per_action: Mapping[Tuple[int, Action], Number] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Positive compute costs keep "starts before t" and "ends by t" apart, which
        # lower() relies on to put each send after its producer.
        checks = [("forward", self.forward), ("backward", self.backward)]
        for stage, fb in self.per_stage.items():
            if len(fb) not in (2, 3):
                raise ValueError(f"costs per_stage[{stage}] = {fb!r}: expected (F, B) or "
                                 "(F, I, W)")
            checks += [(f"per_stage[{stage}]", c) for c in fb]
        checks += [(f"per_action[{k}]", c) for k, c in self.per_action.items()
                   if computes(k[1])]
        i_w = _split(self.backward, self.input_grad, self.weight_grad)
        checks += [("input_grad", i_w[0]), ("weight_grad", i_w[1])]
        if self.overlap is not None:
            checks.append(("overlap", self.overlap))
        if self.overlap_ratio is not None:
            checks.append(("overlap_ratio", self.overlap_ratio))
        if self.overlap is not None and self.overlap_ratio is not None:
            raise ValueError("costs: give overlap (absolute) or overlap_ratio (fraction of F + B), "
                             "not both")
        for name, value in checks:
            if not value > 0:
                raise ValueError(f"cost {name} = {value!r}: compute costs must be > 0")
        if not self.comm >= 0:
            raise ValueError(f"cost comm = {self.comm!r}: must be >= 0")

    @classmethod
    def parse(cls, text: str) -> Costs:
        """'F,B,comm' (e.g. '1,2,0.1') or 'F,I,W,comm' (zero bubble: B = I + W);
        integers and fractions like '1/3' stay exact."""
        parts = [p.strip() for p in text.split(",")]
        if len(parts) not in (3, 4):
            raise ValueError(f"costs {text!r}: expected three numbers F,B,comm or four "
                             "F,I,W,comm")
        nums: List[Number] = []
        for p in parts:
            try:
                nums.append(Fraction(p) if "." not in p and "e" not in p.lower() else float(p))
            except ValueError:
                raise ValueError(f"costs {text!r}: {p!r} is not a number") from None
        nums = [int(n) if isinstance(n, Fraction) and n.denominator == 1 else n for n in nums]
        if len(nums) == 4:
            f, i, w, comm = nums
            return cls(f, i + w, comm, input_grad=i, weight_grad=w)
        return cls(nums[0], nums[1], nums[2])

    @property
    def i_w(self) -> Tuple[Number, Number]:
        """(cost of an I, cost of a W) away from per-stage / per-action overrides."""
        return _split(self.backward, self.input_grad, self.weight_grad)

    @property
    def uniform(self) -> bool:
        """No per-stage or per-action overrides and no special FB cost (I and W may
        differ from each other: every I costs the same, every W too)."""
        return (not self.per_stage and not self.per_action and self.overlap is None
                and self.overlap_ratio in (None, 1))

    def of(self, pp: int, rank: int, action: Action, placement: str = "interleaved") -> Number:
        """Cost of `action` on `rank`; `placement` maps its chunk to the global stage
        `per_stage` is keyed by."""
        t = type(action)
        if self.per_action and (rank, action) in self.per_action:
            return self.per_action[(rank, action)]
        if not self.per_stage and (t is F or t is B):  # the common case, kept fast
            return self.forward if t is F else self.backward
        if not self.per_stage and (t is I or t is W):
            return self.i_w[0 if t is I else 1]
        if isinstance(action, (Comm, GradSync)):
            return self.comm if isinstance(action, Comm) else 0
        if t is FB:
            if self.overlap is not None:
                return self.overlap
            both = (self.of(pp, rank, action.f, placement)
                    + self.of(pp, rank, action.b, placement))
            return both if self.overlap_ratio is None else self.overlap_ratio * both
        own = self.per_stage.get(stage_of(pp, rank, action.chunk, placement))
        if own is None:
            fwd, bwd, (i, w) = self.forward, self.backward, self.i_w
        elif len(own) == 3:
            fwd, i, w = own
            bwd = i + w
        else:
            fwd, bwd = own
            i, w = _split(bwd, None, None)
        return {F: fwd, B: bwd, I: i, W: w}[t]


def _split(backward: Number, input_grad: Optional[Number],
           weight_grad: Optional[Number]) -> Tuple[Number, Number]:
    """(I, W) costs from a backward's and the given halves (see Costs)."""
    if input_grad is None and weight_grad is None:
        half = Fraction(backward) / 2 if isinstance(backward, (int, Fraction)) else backward / 2
        half = int(half) if isinstance(half, Fraction) and half.denominator == 1 else half
        return half, half
    if input_grad is None:
        return backward - weight_grad, weight_grad  # type: ignore[operator]
    if weight_grad is None:
        return input_grad, backward - input_grad
    return input_grad, weight_grad


class Span(NamedTuple):
    """When one action ran. For communication, `start` is when this side posted it and
    `end` when the transfer finished (the wait is included)."""

    rank: int
    index: int
    action: Action
    start: Number
    end: Number


def _ratio(a: Number, b: Number) -> Number:
    # Exact when the inputs are exact, so tests can compare bubbles with ==.
    if isinstance(a, (int, Fraction)) and isinstance(b, (int, Fraction)):
        return Fraction(a) / Fraction(b)
    return float(a) / float(b)


@dataclass(frozen=True)
class SimResult:
    schedule: Schedule
    costs: Costs
    mode: str  # "blocking" / "threaded" (lowered; async_p2p) or "dataflow" (compute only)
    spans: Tuple[Tuple[Span, ...], ...]
    makespan: Number
    busy: Tuple[Number, ...]
    peak_in_flight: Tuple[int, ...]

    @property
    def idle(self) -> Tuple[Number, ...]:
        return tuple(self.makespan - b for b in self.busy)

    @property
    def bubble(self) -> Tuple[Number, ...]:
        """Idle / makespan for each rank."""
        return tuple(_ratio(i, self.makespan) for i in self.idle)

    @property
    def bubble_overall(self) -> Number:
        """Total idle / (pp * makespan)."""
        return _ratio(sum(self.idle), self.schedule.pp * self.makespan)

    @property
    def peak_buffered(self) -> Tuple[int, ...]:
        """Most received tensors each rank holds before their consumer runs: boundary
        tensors (a stage input or an output gradient), on top of `peak_in_flight`."""
        s = self.schedule
        out = []
        for r, acts in enumerate(s.ranks):
            cur = peak = 0
            for a in acts:
                if isinstance(a, Comm) and not a.is_send:
                    cur += 1
                    peak = max(peak, cur)
                elif computes(a) and s.lowered:
                    cur -= len(consumes(s.pp, s.num_stages, r, a, s.placement))
            out.append(peak)
        return tuple(out)

    @property
    def peak_pending_w(self) -> Tuple[int, ...]:
        """Per rank, most I's done whose W has not (see `peak_pending_w`)."""
        return tuple(peak_pending_w(acts) for acts in self.schedule.ranks)

    @property
    def peak_held(self) -> Tuple[int, ...]:
        """Per rank, most F's done whose B or W has not (see `peak_held`)."""
        return tuple(peak_held(acts) for acts in self.schedule.ranks)

    def span(self, rank: int, action: Action) -> Span:
        for s in self.spans[rank]:
            if s.action == action:
                return s
        raise KeyError(f"{action} is not on rank {rank}")


def _peak(actions: Sequence[Action], opens: Tuple[type, ...], closes: Tuple[type, ...]) -> int:
    cur = peak = 0
    for a in actions:
        parts = computes(a)
        for p in parts:  # an FB opens its F's before it closes its B's
            if isinstance(p, opens):
                cur += 1
                peak = max(peak, cur)
        for p in parts:
            if isinstance(p, closes):
                cur -= 1
    return peak


def peak_in_flight(actions: Sequence[Action]) -> int:
    """Most chunk-activations held at once: F's run whose B (or I) has not finished. An
    FB holds its F's activation while its B's is still alive, so it counts +1 first.
    An I frees the activations autograd kept; what its W still needs is
    `peak_pending_w`."""
    return _peak(actions, (F,), INPUT_GRAD_KINDS)


def peak_pending_w(actions: Sequence[Action]) -> int:
    """Most I's done whose W has not run: each holds what its weight gradients need (the
    chunk's linear-layer inputs and output gradients of that micro-batch), a part of
    one chunk-activation."""
    return _peak(actions, (I,), (W,))


def peak_held(actions: Sequence[Action]) -> int:
    """Most micro-batches whose chunk memory is not released at all: F's run whose B (or
    W) has not finished. The conservative figure for zero bubble: it counts a pending W
    as a whole chunk-activation."""
    return _peak(actions, (F,), WEIGHT_GRAD_KINDS)


def simulate(schedule: Schedule, costs: Optional[Costs] = None,
             async_p2p: bool = False) -> SimResult:
    """Runs `schedule` under `costs` (default F=1, B=2, comm=0); see module docstring.
    async_p2p: a lowered schedule's transfers run on a communication thread per rank."""
    costs = costs or Costs()
    if schedule.lowered and async_p2p:
        spans, mode = _run_threaded(schedule, costs), "threaded"
    elif schedule.lowered:
        spans, mode = _run_blocking(schedule, costs), "blocking"
    else:
        spans, mode = _run_dataflow(schedule, costs), "dataflow"
    makespan = max((s.end for row in spans for s in row), default=0)
    busy = tuple(sum((s.end - s.start for s in row if computes(s.action)), 0) for row in spans)
    return SimResult(schedule, costs, mode, tuple(tuple(r) for r in spans), makespan, busy,
                     tuple(peak_in_flight(acts) for acts in schedule.ranks))


def _run_blocking(schedule: Schedule, costs: Costs) -> List[List[Span]]:
    partner = match_channels(schedule)
    pp, ranks, pl = schedule.pp, schedule.ranks, schedule.placement
    ptr = [0] * pp
    clock: List[Number] = [0] * pp
    spans: List[List[Span]] = [[] for _ in range(pp)]
    ready = deque(range(pp))
    queued = [True] * pp
    while ready:
        r = ready.popleft()
        queued[r] = False
        acts = ranks[r]
        while ptr[r] < len(acts):
            i = ptr[r]
            a = acts[i]
            if isinstance(a, Comm):
                q, j = partner[(r, i)]
                if ptr[q] != j:
                    break  # the peer completes this pair when it gets to j
                end = max(clock[r], clock[q]) + max(costs.of(pp, r, a, pl), costs.of(pp, q, ranks[q][j], pl))
                spans[r].append(Span(r, i, a, clock[r], end))
                spans[q].append(Span(q, j, ranks[q][j], clock[q], end))
                clock[r] = clock[q] = end
                ptr[q] += 1
                if not queued[q]:
                    ready.append(q)
                    queued[q] = True
            else:
                end = clock[r] + costs.of(pp, r, a, pl)
                spans[r].append(Span(r, i, a, clock[r], end))
                clock[r] = end
            ptr[r] += 1
    if any(ptr[r] < len(ranks[r]) for r in range(pp)):
        raise _deadlock(schedule, ptr, lambda r: partner[(r, ptr[r])][0])
    return spans


def _run_threaded(schedule: Schedule, costs: Costs) -> List[List[Span]]:
    """Computes (and GS) in list order on each rank, each starting once its receives are
    done; transfers on one communication thread per directed link (sender, receiver),
    in list order, a send once its producer is done, both sides meeting as in the
    blocking run."""
    run = _ThreadedRun(schedule, costs)
    moved = True
    while moved:
        moved = False
        for r in range(schedule.pp):
            moved = run.computes(r) or moved
        for (r, q, sends), steps in run.links.items():
            if sends:  # each transfer is driven from its sending side
                moved = run.transfers(r, q, steps) or moved
    stuck = run.stuck()
    if stuck:
        raise run.deadlock(stuck)
    return [sorted(row, key=lambda sp: sp.index) for row in run.spans]


class _ThreadedRun:
    """_run_threaded's state: per rank the next compute (cp) and when the rank is free
    (busy); per link thread (rank, peer, sends) its steps and the next one (lp); per
    directed link (src, dst) when it is free (line); the end of every step done."""

    def __init__(self, schedule: Schedule, costs: Costs) -> None:
        self.schedule, self.costs = schedule, costs
        self.partner = match_channels(schedule)
        pp, ns, ranks, pl = schedule.pp, schedule.num_stages, schedule.ranks, schedule.placement
        self.comp = [[i for i, a in enumerate(acts) if not isinstance(a, Comm)] for acts in ranks]
        self.links: Dict[Tuple[int, int, bool], List[int]] = {}  # (rank, peer, sends) -> steps
        self.recv_at: Dict[Tuple[int, Payload], int] = {}
        self.made_by: Dict[Tuple[int, Payload], int] = {}
        for r, acts in enumerate(ranks):
            for i, a in enumerate(acts):
                if isinstance(a, Comm):
                    self.links.setdefault((r, a.peer, a.is_send), []).append(i)
                    if not a.is_send:
                        self.recv_at[(r, payload(pp, r, a, pl))] = i
                elif computes(a):
                    for p in produces(pp, ns, r, a, pl):
                        self.made_by[(r, p)] = i
        self.end: Dict[Tuple[int, int], Number] = {}
        self.spans: List[List[Span]] = [[] for _ in range(pp)]
        self.cp = [0] * pp
        self.lp = {link: 0 for link in self.links}
        self.busy: List[Number] = [0] * pp
        self.line: Dict[Tuple[int, int], Number] = {}  # directed link (src, dst) free at

    def computes(self, r: int) -> bool:
        """Runs rank r's computes until one waits for a receive; True when any ran."""
        s, pl = self.schedule, self.schedule.placement
        acts, comp, moved = s.ranks[r], self.comp[r], False
        while self.cp[r] < len(comp):
            i = comp[self.cp[r]]
            waits = [self.recv_at[(r, p)] for p in consumes(s.pp, s.num_stages, r, acts[i], pl)]
            if any((r, j) not in self.end for j in waits):
                break
            start = max([self.busy[r]] + [self.end[(r, j)] for j in waits])
            self.end[(r, i)] = self.busy[r] = start + self.costs.of(s.pp, r, acts[i], pl)
            self.spans[r].append(Span(r, i, acts[i], start, self.busy[r]))
            self.cp[r] += 1
            moved = True
        return moved

    def transfers(self, r: int, q: int, steps: List[int]) -> bool:
        """Runs the transfers of link thread r -> q while both sides have reached them
        and their producer is done; True when any ran."""
        pp, ranks, pl = self.schedule.pp, self.schedule.ranks, self.schedule.placement
        back, lp, moved = self.links.get((q, r, False), []), self.lp, False
        while lp[(r, q, True)] < len(steps):
            i = steps[lp[(r, q, True)]]
            _, j = self.partner[(r, i)]
            if lp.get((q, r, False), 0) >= len(back) or back[lp[(q, r, False)]] != j:
                break  # the receiver's thread has not reached it yet
            producer = self.made_by[(r, payload(pp, r, ranks[r][i], pl))]
            if (r, producer) not in self.end:
                break
            posted_s = max(self.line.get((r, q), 0), self.end[(r, producer)])
            posted_d = self.line.get((r, q), 0)
            finish = max(posted_s, posted_d) + max(self.costs.of(pp, r, ranks[r][i], pl),
                                                   self.costs.of(pp, q, ranks[q][j], pl))
            self.spans[r].append(Span(r, i, ranks[r][i], posted_s, finish))
            self.spans[q].append(Span(q, j, ranks[q][j], posted_d, finish))
            self.end[(r, i)] = self.end[(q, j)] = self.line[(r, q)] = finish
            lp[(r, q, True)] += 1
            lp[(q, r, False)] += 1
            moved = True
        return moved

    def stuck(self) -> List[int]:
        """Ranks with a compute or a link thread not at its end."""
        return [r for r in range(self.schedule.pp)
                if self.cp[r] < len(self.comp[r])
                or any(self.lp[k] < len(v) for k, v in self.links.items() if k[0] == r)]

    def deadlock(self, stuck: List[int]) -> ScheduleError:
        """The error naming where each stuck rank's computes and threads wait."""
        ranks, marks, parts = self.schedule.ranks, [], []
        for r in stuck:
            where = []
            comp, cp = self.comp[r], self.cp[r]
            if cp < len(comp):
                marks.append((r, comp[cp]))
                where.append(f"computes wait in {ranks[r][comp[cp]]} (step {comp[cp]})")
            for (rr, q, sends), steps in sorted(self.links.items()):
                if rr == r and self.lp[(rr, q, sends)] < len(steps):
                    k = steps[self.lp[(rr, q, sends)]]
                    marks.append((r, k))
                    where.append(f"its thread {'to' if sends else 'from'} rank {q} waits in "
                                 f"{ranks[r][k]} (step {k})")
            parts.append(f"rank {r}: " + ", ".join(where))
        return schedule_error(self.schedule, "deadlock with communication threads: "
                              + "; ".join(parts) + ".", sorted(marks))


def _run_dataflow(schedule: Schedule, costs: Costs) -> List[List[Span]]:
    pp, ns, ranks, pl = schedule.pp, schedule.num_stages, schedule.ranks, schedule.placement
    ptr = [0] * pp
    clock: List[Number] = [0] * pp
    spans: List[List[Span]] = [[] for _ in range(pp)]
    avail: Dict[Payload, Number] = {}
    waiting: Dict[Payload, List[int]] = {}
    blocked_on: Dict[int, Payload] = {}
    ready = deque(range(pp))
    while ready:
        r = ready.popleft()
        acts = ranks[r]
        while ptr[r] < len(acts):
            a = acts[ptr[r]]
            need = consumes(pp, ns, r, a, pl)
            missing = [p for p in need if p not in avail]
            if missing:
                waiting.setdefault(missing[0], []).append(r)
                blocked_on[r] = missing[0]
                break
            blocked_on.pop(r, None)
            start = max([clock[r]] + [avail[p] for p in need])
            end = start + costs.of(pp, r, a, pl)
            spans[r].append(Span(r, ptr[r], a, start, end))
            clock[r] = end
            for p in produces(pp, ns, r, a, pl):
                avail[p] = end + costs.comm
                ready.extend(waiting.pop(p, ()))
            ptr[r] += 1
    if any(ptr[r] < len(ranks[r]) for r in range(pp)):
        def producer_rank(r: int) -> int:
            _, src, _, _ = blocked_on[r]
            return schedule.locate(src)[0]
        raise _deadlock(schedule, ptr, producer_rank)
    return spans


def _deadlock(schedule: Schedule, ptr: Sequence[int], waits_for) -> Exception:
    """Names one cycle of ranks waiting on each other, marks every blocked action."""
    ranks = schedule.ranks
    stuck = [r for r in range(schedule.pp) if ptr[r] < len(ranks[r])]
    finished = [r for r in range(schedule.pp) if ptr[r] >= len(ranks[r])]
    r, seen, chain = stuck[0], [], []
    while r not in seen and ptr[r] < len(ranks[r]):
        seen.append(r)
        q = waits_for(r)
        chain.append(f"rank {r} waits in {ranks[r][ptr[r]]} (step {ptr[r]}) for rank {q}")
        r = q
    tail = (f"; rank {r} has already finished its list" if r in finished else "")
    reason = "deadlock: " + ", ".join(chain) + tail + (
        " (a cycle: no rank can go on)" if not tail else "") + "."
    return schedule_error(schedule, reason, [(r, ptr[r]) for r in stuck])
