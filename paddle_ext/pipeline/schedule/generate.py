"""Schedule generators: pure functions (pp, vpp, microbatches, kind) -> compute-only Schedule.

Each generator only decides the *order* of F and B on every rank; `lower` adds the
communication afterwards. Kinds:

- ``fthenb``: all forwards (chunk-major), then all backwards (reverse chunk order).
  Any vpp. Peak memory: every micro-batch of every chunk at once.
- ``1f1b``: the classic one-forward-one-backward schedule, vpp must be 1: rank r runs
  ``pp - r - 1`` warm-up forwards, then alternates F and B, then drains the B's.
- ``interleaved``: Megatron/Paddle interleaved 1F1B (VPP) for any vpp >= 1 and any
  microbatches >= pp. With vpp == 1 it *is* ``1f1b`` (Paddle picks its 1F1B class then).
- ``1f1b-overlap``, ``interleaved-overlap``: the same with the steady state's F and B
  paired into overlapped ``F..&B..`` steps (overlap.py; upstream #71995).

Unbalanced micro-batch counts (microbatches % pp != 0) follow upstream #58383: the
micro-batches are cut into groups that walk through the chunks together, the first
group holding ``pp + microbatches % pp`` of them and every later one ``pp``. A group of
at least pp keeps rank 0 busy until the group's first micro-batch comes back round the
ring from rank pp-1, so no rank ever waits inside the forward stream; the price is a
longer warm-up (more activations held), see docs/pipeline_schedules.md.
"""

from __future__ import annotations

from typing import List, Mapping, Optional, Tuple

from paddle_ext.pipeline.schedule.ir import B, F, Schedule
from paddle_ext.pipeline.schedule.overlap import OVERLAP_SUFFIX, overlap, split_kind

__all__ = [
    "KINDS",
    "ScheduleArgumentError",
    "check_args",
    "generate",
    "fthenb",
    "one_f_one_b",
    "interleaved",
    "microbatch_groups",
    "interleaved_warmup",
]

KINDS = ("fthenb", "1f1b", "interleaved")


class ScheduleArgumentError(ValueError):
    """An argument to a generator is out of range; the message names it and the range."""

    def __init__(self, name: str, value: object, allowed: str) -> None:
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(f"{name} = {value!r} is not allowed: {allowed}")


_DEFAULT_NAMES = {"pp": "pp", "vpp": "vpp", "microbatches": "microbatches", "kind": "kind"}


def check_args(pp: int, vpp: int, microbatches: int, kind: str,
               names: Optional[Mapping[str, str]] = None) -> str:
    """Validates generator arguments and returns the normalised kind.

    `names` maps "pp", "vpp", "microbatches", "kind" to the spelling the caller's user
    knows (e.g. "--pp"), so the error names what they typed.
    """
    n = {**_DEFAULT_NAMES, **(names or {})}
    base, overlapped = split_kind(str(kind).lower())
    k = base.replace("-", "").replace("_", "")
    k = {"fthenb": "fthenb", "1f1b": "1f1b", "interleaved": "interleaved", "vpp": "interleaved",
         "interleave": "interleaved"}.get(k, k)
    if k not in KINDS or (overlapped and k == "fthenb"):
        raise ScheduleArgumentError(n["kind"], kind, f"must be one of {', '.join(KINDS)}, or "
                                    f"1f1b{OVERLAP_SUFFIX} / interleaved{OVERLAP_SUFFIX}")
    for key, value, low in (("pp", pp, 2), ("vpp", vpp, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ScheduleArgumentError(n[key], value, f"must be an integer >= {low}")
    if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < pp:
        raise ScheduleArgumentError(n["microbatches"], microbatches,
                                    f"must be an integer >= {n['pp']} (= {pp})")
    if k == "1f1b" and vpp != 1:
        raise ScheduleArgumentError(n["vpp"], vpp, f"{n['kind']} 1f1b needs 1 "
                                    "(use interleaved for virtual stages)")
    return k + OVERLAP_SUFFIX if overlapped else k


def generate(pp: int, vpp: int, microbatches: int, kind: str = "interleaved") -> Schedule:
    """The compute-only schedule of `kind` (see module docstring) for the given shape.

    "1f1b-overlap" / "interleaved-overlap": that schedule with its steady-state F and B
    paired into overlapped F&B steps (overlap.py)."""
    k, overlapped = split_kind(check_args(pp, vpp, microbatches, kind))
    if overlapped:
        return overlap(generate(pp, vpp, microbatches, k))
    if k == "fthenb":
        return fthenb(pp, vpp, microbatches)
    if k == "1f1b":
        return one_f_one_b(pp, microbatches)
    return interleaved(pp, vpp, microbatches)


def fthenb(pp: int, vpp: int, microbatches: int) -> Schedule:
    fwd = [F(c, m) for c in range(vpp) for m in range(microbatches)]
    bwd = [B(c, m) for c in reversed(range(vpp)) for m in range(microbatches)]
    return Schedule(pp, vpp, microbatches, tuple(tuple(fwd + bwd) for _ in range(pp)), "fthenb")


def one_f_one_b(pp: int, microbatches: int) -> Schedule:
    ranks = []
    for r in range(pp):
        # Rank r's first B needs the micro-batch to reach the last stage and come back:
        # pp - r - 1 more forwards fit in that time.
        warmup = min(pp - r - 1, microbatches)
        acts: List = [F(0, m) for m in range(warmup)]
        for i in range(microbatches - warmup):
            acts += [F(0, warmup + i), B(0, i)]
        acts += [B(0, m) for m in range(microbatches - warmup, microbatches)]
        ranks.append(tuple(acts))
    return Schedule(pp, 1, microbatches, tuple(ranks), "1f1b")


def microbatch_groups(pp: int, microbatches: int) -> List[range]:
    """Groups of micro-batches that go through all chunks together (upstream #58383):
    the first holds pp + microbatches % pp, the rest pp each."""
    first = pp + microbatches % pp
    groups = [range(0, first)]
    groups += [range(s, s + pp) for s in range(first, microbatches, pp)]
    return groups


def _interleaved_order(pp: int, vpp: int, microbatches: int,
                       backward: bool) -> List[Tuple[int, int]]:
    chunks = list(reversed(range(vpp))) if backward else list(range(vpp))
    return [(c, m) for g in microbatch_groups(pp, microbatches) for c in chunks for m in g]


def interleaved_warmup(pp: int, vpp: int, microbatches: int, rank: int) -> int:
    """Forwards rank `rank` runs before its first backward in `interleaved`."""
    if vpp == 1:
        return min(pp - rank - 1, microbatches)
    first = pp + microbatches % pp
    # Rank r's first backward is B(vpp-1, 0); F(vpp-1, 0) is its forward number
    # (vpp-1)*first, and the micro-batch then needs pp-r-1 hops to the last stage and
    # pp-r-1 hops back, each covered by one more forward in the 1F1B rhythm.
    return min(2 * (pp - rank - 1) + (vpp - 1) * first, vpp * microbatches)


def interleaved(pp: int, vpp: int, microbatches: int) -> Schedule:
    if vpp == 1:
        s = one_f_one_b(pp, microbatches)
        return s.with_ranks(s.ranks, kind="interleaved")
    fwd = _interleaved_order(pp, vpp, microbatches, backward=False)
    bwd = _interleaved_order(pp, vpp, microbatches, backward=True)
    total = len(fwd)
    ranks = []
    for r in range(pp):
        warmup = interleaved_warmup(pp, vpp, microbatches, r)
        acts: List = [F(*cm) for cm in fwd[:warmup]]
        for i in range(total - warmup):
            acts += [F(*fwd[warmup + i]), B(*bwd[i])]
        acts += [B(*cm) for cm in bwd[total - warmup:]]
        ranks.append(tuple(acts))
    return Schedule(pp, vpp, microbatches, tuple(ranks), "interleaved")
