"""Schedule IR: the actions of a pipeline schedule, their text form, and `Schedule`.

Placement. With `pp` ranks and `vpp` virtual stages per rank, the model is cut into
`pp * vpp` global stages. An action names a *chunk*, the index of the stage among the
rank's own stages (Paddle's virtual_pp_rank); local chunks are what a runtime indexes
its model chunks by, and the rank is implied by the list an action sits in. Which
global stage a chunk is depends on the schedule's placement:

- ``interleaved`` (the default; Paddle's VPP layout): rank r holds stages r, r + pp,
  r + 2*pp, ...; chunk c on rank r is global stage ``c * pp + r``.
- ``v`` (vpp = 2; ZB-V, DualPipeV): rank r holds stages r (chunk 0) and 2*pp - 1 - r
  (chunk 1), so the model goes down the ranks and back up. Rank 0 holds the first and
  the last stage; the last rank's two chunks are adjacent stages pp - 1 and pp, whose
  activation and gradient are handed over locally (no send, no receive).

Text grammar (one token per action, no spaces inside):

    F<c>.<m>             forward of chunk c, micro-batch m
    B<c>.<m>             backward of chunk c, micro-batch m (input and weight grads)
    I<c>.<m>             input-gradient half of B(c, m): the gradient sent upstream
    W<c>.<m>             weight-gradient half of B(c, m): parameter grads only, after I
    F<c>.<m>&B<d>.<n>    overlapped pair: F(c, m) and B(d, n) run as one step
    SA<c>.<m>><p>        send the activation that F(c, m) produced to rank p
    RA<c>.<m><<p>        receive from rank p the input activation of F(c, m)
    SG<c>.<m>><p>        send the input gradient that B(c, m) produced to rank p
    RG<c>.<m><<p>        receive from rank p the output gradient B(c, m) needs
    GS<c>                chunk c's last backward (B or W) is done: its gradients may sync

Zero-bubble schedules split a backward in two: I(c, m) computes the input gradient
(what the previous stage waits for) and W(c, m) the weight gradients (what nothing
downstream waits for, so it can fill a bubble). A (chunk, micro-batch) runs either one
B or one I and one W, never both.

Every communication token names the chunk on *its own* rank that produces (send)
or consumes (recv) the tensor, so `SA1.3>0` on rank 3 (pp=4: stage 7) is matched by
`RA2.3<3` on rank 0 (stage 8). A whole schedule prints as

    schedule pp=2 vpp=2 microbatches=5 kind=interleaved
    0: F0.0 F0.1 ...
    1: F0.0 ...

and `Schedule.from_text(s.to_text()) == s`. Blank lines and `#` comments are ignored.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

__all__ = [
    "F",
    "B",
    "I",
    "W",
    "FB",
    "Comm",
    "SendAct",
    "RecvAct",
    "SendGrad",
    "RecvGrad",
    "GradSync",
    "Action",
    "Compute",
    "Schedule",
    "ScheduleError",
    "schedule_error",
    "step_grid",
    "INPUT_GRAD_KINDS",
    "WEIGHT_GRAD_KINDS",
    "computes",
    "parse_action",
    "stage_of",
    "locate",
    "PLACEMENTS",
    "check_placement",
]


class ScheduleError(ValueError):
    """A schedule is malformed, inconsistent or cannot finish.

    `reason` is the one-sentence diagnosis; `rank` and `index` locate the offending
    action (None when the fault is not one action); `grid` is the rank x step grid
    with that action marked, already part of str(error).
    """

    def __init__(self, reason: str, rank: int | None = None, index: int | None = None,
                 grid: str = "") -> None:
        self.reason = reason
        self.rank = rank
        self.index = index
        self.grid = grid
        super().__init__(f"{reason}\n{grid}" if grid else reason)


PLACEMENTS = ("interleaved", "v")


def check_placement(placement: str, vpp: int) -> None:
    """Raises ScheduleError unless `placement` is known and fits `vpp`."""
    if placement not in PLACEMENTS:
        raise ScheduleError(f"placement = {placement!r} is not allowed: must be one of "
                            f"{', '.join(PLACEMENTS)}")
    if placement == "v" and vpp != 2:
        raise ScheduleError(f"vpp = {vpp} is not allowed with placement v: the V holds exactly "
                            "2 chunks per rank")


def stage_of(pp: int, rank: int, chunk: int, placement: str = "interleaved") -> int:
    """Global stage of `chunk` on `rank` (see Placement in the module docstring)."""
    if placement == "v":
        return rank if chunk == 0 else 2 * pp - 1 - rank if chunk == 1 else -1
    return chunk * pp + rank


def locate(pp: int, stage: int, placement: str = "interleaved") -> Tuple[int, int]:
    """(rank, chunk) that holds global `stage`."""
    if placement == "v":
        return (stage, 0) if stage < pp else (2 * pp - 1 - stage, 1)
    return stage % pp, stage // pp


@dataclass(frozen=True)
class Compute:
    """Base of the four compute actions on (chunk, mb); `token` is the grammar's letter."""

    chunk: int
    mb: int

    token = ""

    def __str__(self) -> str:
        return f"{self.token}{self.chunk}.{self.mb}"


@dataclass(frozen=True)
class F(Compute):
    """Forward of (chunk, mb)."""

    token = "F"


@dataclass(frozen=True)
class B(Compute):
    """Backward of (chunk, mb): input grads and parameter grads together."""

    token = "B"


@dataclass(frozen=True)
class I(Compute):  # noqa: E742 - the grammar's letter; zero-bubble papers call it B_input
    """Input-gradient half of B(chunk, mb): the gradient the previous stage needs.
    Keeps what W(chunk, mb) needs (layer inputs, output gradients) alive."""

    token = "I"


@dataclass(frozen=True)
class W(Compute):
    """Weight-gradient half of B(chunk, mb): accumulates that micro-batch's parameter
    gradients of the chunk; needs I(chunk, mb) done, nothing downstream waits for it."""

    token = "W"


@dataclass(frozen=True)
class FB:
    """An F and a B issued as one overlapped step (filled in by the overlap scheduler)."""

    f: F
    b: B

    def __str__(self) -> str:
        return f"{self.f}&{self.b}"


@dataclass(frozen=True)
class Comm:
    """Base of the four point-to-point actions; `peer` is the other rank."""

    chunk: int
    mb: int
    peer: int

    # Subclasses set these: the token prefix, and whether this side sends.
    token = ""
    is_send = True
    is_grad = False

    def __str__(self) -> str:
        arrow = ">" if self.is_send else "<"
        return f"{self.token}{self.chunk}.{self.mb}{arrow}{self.peer}"


@dataclass(frozen=True)
class SendAct(Comm):
    token = "SA"
    is_send = True
    is_grad = False


@dataclass(frozen=True)
class RecvAct(Comm):
    token = "RA"
    is_send = False
    is_grad = False


@dataclass(frozen=True)
class SendGrad(Comm):
    token = "SG"
    is_send = True
    is_grad = True


@dataclass(frozen=True)
class RecvGrad(Comm):
    token = "RG"
    is_send = False
    is_grad = True


@dataclass(frozen=True)
class GradSync:
    """All backwards of `chunk` on this rank are done; its gradient buckets may launch."""

    chunk: int

    def __str__(self) -> str:
        return f"GS{self.chunk}"


Compute = Union[F, B, I, W, FB]
Action = Union[F, B, I, W, FB, SendAct, RecvAct, SendGrad, RecvGrad, GradSync]
_SINGLE: Dict[str, type] = {"F": F, "B": B, "I": I, "W": W}

# The computes that make a (chunk, mb)'s input gradient (they read its output gradient,
# RG, and their result is sent upstream, SG) and those that finish its parameter
# gradients (the chunk's GS follows the last of them).
INPUT_GRAD_KINDS: Tuple[type, ...] = (B, I)
WEIGHT_GRAD_KINDS: Tuple[type, ...] = (B, W)

_COMM_TYPES: Dict[str, type] = {"SA": SendAct, "RA": RecvAct, "SG": SendGrad, "RG": RecvGrad}
_TOKEN = re.compile(
    r"(?P<fb>F(?P<fc>\d+)\.(?P<fm>\d+)&B(?P<bc>\d+)\.(?P<bm>\d+))"
    r"|(?P<k>[FBIW])(?P<c>\d+)\.(?P<m>\d+)"
    r"|(?P<s>S[AG])(?P<sc>\d+)\.(?P<sm>\d+)>(?P<sp>\d+)"
    r"|(?P<r>R[AG])(?P<rc>\d+)\.(?P<rm>\d+)<(?P<rp>\d+)"
    r"|GS(?P<gc>\d+)"
)


def parse_action(text: str) -> Action:
    """Parses one token of the grammar in the module docstring."""
    return _parse(text.strip())


@functools.lru_cache(maxsize=1 << 16)  # actions are immutable and tokens repeat a lot
def _parse(text: str) -> Action:
    m = _TOKEN.fullmatch(text)
    if m is None:
        raise ScheduleError(
            f"cannot parse action {text!r}: expected F<c>.<m>, B<c>.<m>, I<c>.<m>, W<c>.<m>, "
            "F<c>.<m>&B<c>.<m>, "
            "SA/SG<c>.<m>><rank>, RA/RG<c>.<m><<rank> or GS<c>")
    g = {k: v for k, v in m.groupdict().items() if v is not None}
    if "fb" in g:
        return FB(F(int(g["fc"]), int(g["fm"])), B(int(g["bc"]), int(g["bm"])))
    if "k" in g:
        return _SINGLE[g["k"]](int(g["c"]), int(g["m"]))
    if "s" in g:
        return _COMM_TYPES[g["s"]](int(g["sc"]), int(g["sm"]), int(g["sp"]))
    if "r" in g:
        return _COMM_TYPES[g["r"]](int(g["rc"]), int(g["rm"]), int(g["rp"]))
    return GradSync(int(g["gc"]))


def computes(action: Action) -> Tuple[Union[F, B, I, W], ...]:
    """The F/B/I/W parts of a compute action; () for communication and GS."""
    t = type(action)  # exact type tests: this runs for every action of every check
    if t is F or t is B or t is I or t is W:
        return (action,)  # type: ignore[return-value]
    if t is FB:
        return (action.f, action.b)  # type: ignore[union-attr]
    return ()


@dataclass(frozen=True)
class Schedule:
    """Per-rank action lists of one training step, plus the shape they were made for.

    `ranks[r]` is rank r's instruction stream, executed strictly in order. `kind` is a
    free-form label (no spaces) naming the generator.
    """

    pp: int
    vpp: int
    microbatches: int
    ranks: Tuple[Tuple[Action, ...], ...]
    kind: str = "custom"
    placement: str = "interleaved"

    def __post_init__(self) -> None:
        # Accept lists from callers but store tuples, so schedules hash and compare.
        object.__setattr__(self, "ranks", tuple(tuple(r) for r in self.ranks))
        if len(self.ranks) != self.pp:
            raise ScheduleError(f"schedule has {len(self.ranks)} rank lists for pp={self.pp}")
        if not self.kind or any(ch.isspace() for ch in self.kind):
            raise ScheduleError(f"schedule kind {self.kind!r} must be one word")
        check_placement(self.placement, self.vpp)

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    @property
    def lowered(self) -> bool:
        """True when the lists carry communication (the output of `lower`)."""
        return any(isinstance(a, (Comm, GradSync)) for r in self.ranks for a in r)

    @property
    def forward_only(self) -> bool:
        """True when no rank computes a gradient (kinds forward / forward-v: evaluation):
        the checks then ask for no backward and no gradient transfer."""
        return all(type(p) is F for r in self.ranks for a in r for p in computes(a))

    def stage(self, rank: int, chunk: int) -> int:
        return stage_of(self.pp, rank, chunk, self.placement)

    def locate(self, stage: int) -> Tuple[int, int]:
        """(rank, chunk) holding global `stage` under this schedule's placement."""
        return locate(self.pp, stage, self.placement)

    def compute_only(self) -> Schedule:
        """The same schedule with communication and GS actions removed."""
        return self.with_ranks([a for a in r if computes(a)] for r in self.ranks)

    def with_ranks(self, ranks: Iterable[Sequence[Action]], kind: str | None = None) -> Schedule:
        return Schedule(self.pp, self.vpp, self.microbatches, tuple(tuple(r) for r in ranks),
                        self.kind if kind is None else kind, self.placement)

    def __iter__(self) -> Iterator[Tuple[Action, ...]]:
        return iter(self.ranks)

    def header(self) -> str:
        place = "" if self.placement == "interleaved" else f" placement={self.placement}"
        return (f"schedule pp={self.pp} vpp={self.vpp} microbatches={self.microbatches} "
                f"kind={self.kind}{place}")

    def to_text(self) -> str:
        lines = [self.header()]
        lines += [f"{r}: " + " ".join(map(str, acts)) for r, acts in enumerate(self.ranks)]
        return "\n".join(line.rstrip() for line in lines) + "\n"

    @classmethod
    def from_text(cls, text: str) -> Schedule:
        lines = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
        lines = [ln for ln in lines if ln]
        if not lines or not lines[0].startswith("schedule "):
            raise ScheduleError("schedule text must start with 'schedule pp=.. vpp=.. "
                                "microbatches=.. kind=..'")
        fields = dict(kv.split("=", 1) for kv in lines[0].split()[1:] if "=" in kv)
        try:
            pp, vpp, mbs = int(fields["pp"]), int(fields["vpp"]), int(fields["microbatches"])
        except (KeyError, ValueError) as err:
            raise ScheduleError(f"bad schedule header {lines[0]!r}: {err}") from None
        ranks: list = [None] * pp
        for ln in lines[1:]:
            head, _, body = ln.partition(":")
            if not head.strip().isdigit() or not 0 <= int(head) < pp:
                raise ScheduleError(f"bad rank line {ln[:40]!r}: expected '<rank 0..{pp - 1}>: "
                                    "actions'")
            r = int(head)
            if ranks[r] is not None:
                raise ScheduleError(f"rank {r} appears twice in the schedule text")
            ranks[r] = tuple(parse_action(tok) for tok in body.split())
        missing = [r for r, acts in enumerate(ranks) if acts is None]
        if missing:
            raise ScheduleError(f"schedule text has no line for rank(s) {missing}")
        return cls(pp, vpp, mbs, tuple(ranks), fields.get("kind", "custom"),
                   fields.get("placement", "interleaved"))

    def __str__(self) -> str:
        return self.to_text()


# Errors located in a schedule: every layer (flow, lower, overlap, simulate, validate)
# raises them, so they live here, below all of those layers.

# A grid wider than this many steps shows only the steps around the marks.
_MAX_GRID_STEPS = 32
_CONTEXT = 5


def _visible_steps(length: int, marks: Sequence[Tuple[int, int]]) -> List[Optional[int]]:
    """Step indices to show, with None standing for an elided run."""
    if length <= _MAX_GRID_STEPS or not marks:
        return list(range(min(length, _MAX_GRID_STEPS if not marks else length)))
    keep = set()
    for _, i in marks:
        keep.update(range(max(0, i - _CONTEXT), min(length, i + _CONTEXT + 1)))
    out: List[Optional[int]] = []
    for i in sorted(keep):
        if out and out[-1] is not None and i != out[-1] + 1:
            out.append(None)
        elif not out and i > 0:
            out.append(None)
        out.append(i)
    if out[-1] is not None and out[-1] < length - 1:
        out.append(None)
    return out


def step_grid(schedule: Schedule, marks: Iterable[Tuple[int, int]] = ()) -> str:
    """Ranks as rows, list positions (steps) as columns; marked actions read `[F0.3]!`.

    Long schedules show the steps near the marks, with `...` for the rest.
    """
    marks = sorted(set(marks))
    marked = set(marks)
    length = max((len(r) for r in schedule.ranks), default=0)
    steps = _visible_steps(length, marks)
    cells = [[
        "..." if i is None else
        ("" if i >= len(acts) else
         f"[{acts[i]}]!" if (r, i) in marked else str(acts[i]))
        for i in steps] for r, acts in enumerate(schedule.ranks)]
    header = ["..." if i is None else str(i) for i in steps]
    widths = [max(len(h), *(len(row[k]) for row in cells)) for k, h in enumerate(header)]
    label = max(len(f"rank {schedule.pp - 1}"), len("step"))
    lines = [f"{'step'.ljust(label)} | " + " ".join(h.ljust(w) for h, w in zip(header, widths))]
    for r, row in enumerate(cells):
        lines.append(f"{f'rank {r}'.ljust(label)} | "
                     + " ".join(c.ljust(w) for c, w in zip(row, widths)))
    if length > _MAX_GRID_STEPS and not marks:
        lines.append(f"(first {_MAX_GRID_STEPS} of {length} steps)")
    return "\n".join(line.rstrip() for line in lines)


def schedule_error(schedule: Schedule, reason: str,
                   marks: Sequence[Tuple[int, int]] = ()) -> ScheduleError:
    """A ScheduleError whose message is `reason` followed by the marked grid."""
    first = marks[0] if marks else (None, None)
    return ScheduleError(reason, first[0], first[1], step_grid(schedule, marks))
