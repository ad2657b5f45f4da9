"""Schedule generators: pure functions (pp, vpp, microbatches, kind) -> compute-only Schedule.

Each generator only decides the *order* of F and B on every rank; `lower` adds the
communication afterwards. Kinds:

- ``fthenb``: all forwards (chunk-major), then all backwards (reverse chunk order).
  Any vpp. Peak memory: every micro-batch of every chunk at once.
- ``1f1b``: the classic one-forward-one-backward schedule, vpp must be 1: rank r runs
  ``min(pp - r - 1, M)`` warm-up forwards, then alternates F and B, then drains the B's.
  Any microbatches >= 1, as fleet's PipelineParallel (so every kind with vpp = 1).
- ``interleaved``: Megatron/Paddle interleaved 1F1B (VPP) for any vpp >= 1 and any
  microbatches >= pp (>= 1 with vpp = 1). With vpp == 1 it *is* ``1f1b`` (Paddle picks its 1F1B class then).
- ``1f1b-overlap``, ``interleaved-overlap``: the same with the steady state's F and B
  paired into overlapped ``F..&B..`` steps (overlap.py; upstream #71995).
- ``zb-h1`` (vpp = 1) and ``interleaved-zb`` (any vpp; with vpp = 1 it is zb-h1): zero
  bubble (Qi et al., ICLR 2024). Every B is split into I (input gradient, what the
  previous stage waits for) and W (weight gradients, what only the gradient sync waits
  for). F's and I's keep the 1f1b / interleaved order and warm-up, so the activations
  autograd holds are the plain schedule's; on rank r each W trails its I by r steps
  (the paper's ZB-H1, and torch.distributed.pipelining's W placement): rank 0, whose
  last I ends the step, never defers, and deferred W's fill the cool-down bubbles.
  Suffix ``-w<k>`` (``zb-h1-w2``) caps the pending W's (I done, W not) at k per rank:
  W trails by min(r, k - 1). Zero-bubble kinds have no ``-overlap`` form (an F&B pairs
  an F with a whole B). Why no ZB-H2: docs/pipeline_schedules.md.

- ``zb-v`` and ``dualpipev`` (``dualpipev-overlap`` with F&B pairs): the V placement's
  schedules (vshape.py), vpp must be 2, any microbatches >= 1.
- ``forward`` and ``forward-v``: evaluation (forward only, no backward, no gradient
  traffic) on the interleaved and the V placement: the forwards of ``interleaved`` (``1f1b``
  with vpp = 1) and of ``zb-v`` in their order, each rank's forwards back to back, so
  `lower` gives eval_batch the same deadlock-free transfers and the one interpreter runs it.

Unbalanced micro-batch counts (microbatches % pp != 0) follow upstream #58383: the
micro-batches are cut into groups that walk through the chunks together, the first
group holding ``pp + microbatches % pp`` of them and every later one ``pp``. A group of
at least pp keeps rank 0 busy until the group's first micro-batch comes back round the
ring from rank pp-1, so no rank ever waits inside the forward stream; the price is a
longer warm-up (more activations held), see docs/pipeline_schedules.md.
"""

from __future__ import annotations

import re
from typing import List, Mapping, Optional, Tuple

from paddle_ext.pipeline.schedule.ir import Action, B, F, I, Schedule, W, computes
from paddle_ext.pipeline.schedule.overlap import OVERLAP_SUFFIX, overlap, split_kind
from paddle_ext.pipeline.schedule.vshape import V_KINDS, V_MIN_MICROBATCHES, dualpipev, zb_v

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
    "interleaved_orders",
    "zero_bubble",
    "w_lag",
    "split_cap",
    "V_KINDS",
    "zb_v",
    "dualpipev",
    "FORWARD_KINDS",
    "forward_only",
]

ZB_KINDS = ("zb-h1", "interleaved-zb")
FORWARD_KINDS = ("forward", "forward-v")  # evaluation: forwards only (interleaved, V placement)
KINDS = ("fthenb", "1f1b", "interleaved") + ZB_KINDS + V_KINDS + FORWARD_KINDS
CAP_SUFFIX = "-w"  # zb-h1-w2: at most 2 pending W's per rank
_CAP = re.compile(r"(?P<base>.*)-w(?P<cap>\d+)")


class ScheduleArgumentError(ValueError):
    """An argument to a generator is out of range; the message names it and the range."""

    def __init__(self, name: str, value: object, allowed: str) -> None:
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(f"{name} = {value!r} is not allowed: {allowed}")


_DEFAULT_NAMES = {"pp": "pp", "vpp": "vpp", "microbatches": "microbatches", "kind": "kind"}


def split_cap(kind: str) -> Tuple[str, Optional[int]]:
    """('zb-h1', 2) for 'zb-h1-w2'; (kind, None) without a cap suffix."""
    m = _CAP.fullmatch(kind)
    return (m["base"], int(m["cap"])) if m else (kind, None)


def check_args(pp: int, vpp: int, microbatches: int, kind: str,
               names: Optional[Mapping[str, str]] = None,
               max_pending_w: Optional[int] = None) -> str:
    """Validates generator arguments and returns the normalised kind.

    `names` maps "pp", "vpp", "microbatches", "kind" (and "max_pending_w") to the
    spelling the caller's user knows (e.g. "--pp"), so the error names what they typed.
    A zero-bubble kind's cap (suffix -w<k> or `max_pending_w`) comes back as the suffix.
    Checked in this order: the kind, the W cap, the shape (pp, vpp, microbatches).
    """
    n = {**_DEFAULT_NAMES, "max_pending_w": "max_pending_w", **(names or {})}
    k, overlapped, cap = _check_kind(kind, n)
    cap = _check_cap(k, kind, cap, max_pending_w, n)
    _check_shape(pp, vpp, microbatches, k, n)
    if cap is not None:
        k += f"{CAP_SUFFIX}{cap}"
    return k + OVERLAP_SUFFIX if overlapped else k


# Spellings of the kinds (lower case, '-' and '_' dropped) -> the kind.
_ALIASES = {"fthenb": "fthenb", "1f1b": "1f1b", "interleaved": "interleaved", "vpp": "interleaved",
            "interleave": "interleaved", "zbh1": "zb-h1", "interleavedzb": "interleaved-zb",
            "zbinterleaved": "interleaved-zb", "zbvpp": "interleaved-zb", "zbv": "zb-v",
            "dualpipe": "dualpipev", "forwardv": "forward-v"}


def _check_kind(kind: str, n: Mapping[str, str]) -> Tuple[str, bool, Optional[int]]:
    """(base kind, overlapped, cap from a -w<k> suffix) of a known kind spelling."""
    allowed = (f"must be one of {', '.join(KINDS)}, or 1f1b{OVERLAP_SUFFIX} / "
               f"interleaved{OVERLAP_SUFFIX}, or a zero-bubble kind with {CAP_SUFFIX}<k> "
               "(at most k pending W's per rank, k >= 1)")
    base, overlapped = split_kind(str(kind).lower())
    base, cap = split_cap(base)
    k = base.replace("-", "").replace("_", "")
    k = _ALIASES.get(k, k)
    if (k not in KINDS or (overlapped and k in ("fthenb",) + FORWARD_KINDS)
            or (cap is not None and k not in ZB_KINDS)):
        raise ScheduleArgumentError(n["kind"], kind, allowed)
    if overlapped and k in ZB_KINDS + ("zb-v",):
        raise ScheduleArgumentError(
            n["kind"], kind, f"zero-bubble kinds have no {OVERLAP_SUFFIX} form: the forward/"
            "backward overlap pairs an F with a whole B, which zero bubble splits into I and "
            f"W (use {k}, or 1f1b{OVERLAP_SUFFIX} / interleaved{OVERLAP_SUFFIX} / "
            f"dualpipev{OVERLAP_SUFFIX})")
    return k, overlapped, cap


def _check_cap(k: str, kind: str, cap: Optional[int], max_pending_w: Optional[int],
               n: Mapping[str, str]) -> Optional[int]:
    """The W cap: the kind's suffix or max_pending_w (they must agree), an integer >= 1."""
    if max_pending_w is not None:
        if k not in ZB_KINDS:
            raise ScheduleArgumentError(n["max_pending_w"], max_pending_w,
                                        f"only zero-bubble kinds ({', '.join(ZB_KINDS)}) defer "
                                        f"W's; {n['kind']} is {kind!r}")
        if cap is not None and cap != max_pending_w:
            raise ScheduleArgumentError(n["max_pending_w"], max_pending_w,
                                        f"{n['kind']} {kind!r} already caps it at {cap}")
        cap = max_pending_w
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise ScheduleArgumentError(n["max_pending_w"], cap, "must be an integer >= 1 (1: each "
                                    "W right after its I)")
    return cap


def _check_shape(pp: int, vpp: int, microbatches: int, k: str, n: Mapping[str, str]) -> None:
    """pp, vpp and microbatches as kind `k` takes them."""
    for key, value, low in (("pp", pp, 2), ("vpp", vpp, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ScheduleArgumentError(n[key], value, f"must be an integer >= {low}")
    if k in V_KINDS + ("forward-v",):
        if vpp != 2:
            raise ScheduleArgumentError(n["vpp"], vpp, f"{n['kind']} {k} needs 2 (the V "
                                        "placement holds two chunks per rank)")
        if (not isinstance(microbatches, int) or isinstance(microbatches, bool)
                or microbatches < V_MIN_MICROBATCHES):
            raise ScheduleArgumentError(n["microbatches"], microbatches,
                                        f"must be an integer >= {V_MIN_MICROBATCHES}")
    elif vpp == 1:  # fleet's PipelineParallel (1F1B) takes any count: its warm-up is min(pp - r - 1, M)
        if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < 1:
            raise ScheduleArgumentError(n["microbatches"], microbatches, "must be an integer >= 1")
    elif not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < pp:
        raise ScheduleArgumentError(n["microbatches"], microbatches,
                                    f"must be an integer >= {n['pp']} (= {pp}) with virtual stages")
    if k in ("1f1b", "zb-h1") and vpp != 1:
        alt = "interleaved" if k == "1f1b" else "interleaved-zb"
        raise ScheduleArgumentError(n["vpp"], vpp, f"{n['kind']} {k} needs 1 "
                                    f"(use {alt} for virtual stages)")


def generate(pp: int, vpp: int, microbatches: int, kind: str = "interleaved",
             max_pending_w: Optional[int] = None) -> Schedule:
    """The compute-only schedule of `kind` (see module docstring) for the given shape.

    "1f1b-overlap" / "interleaved-overlap": that schedule with its steady-state F and B
    paired into overlapped F&B steps (overlap.py). `max_pending_w` (zero-bubble kinds
    only) is the same as the kind suffix -w<k>."""
    k, overlapped = split_kind(check_args(pp, vpp, microbatches, kind,
                                          max_pending_w=max_pending_w))
    if k == "dualpipev":
        return dualpipev(pp, microbatches, overlapped)
    if k == "zb-v":
        return zb_v(pp, microbatches)
    if overlapped:
        return overlap(generate(pp, vpp, microbatches, k))
    base, cap = split_cap(k)
    if base in ZB_KINDS:
        return zero_bubble(pp, vpp, microbatches, cap, kind=k)
    if k == "fthenb":
        return fthenb(pp, vpp, microbatches)
    if k in FORWARD_KINDS:
        return forward_only(pp, vpp, microbatches, "v" if k == "forward-v" else "interleaved")
    if k == "1f1b":
        return one_f_one_b(pp, microbatches)
    return interleaved(pp, vpp, microbatches)


def fthenb(pp: int, vpp: int, microbatches: int) -> Schedule:
    fwd = [F(c, m) for c in range(vpp) for m in range(microbatches)]
    bwd = [B(c, m) for c in reversed(range(vpp)) for m in range(microbatches)]
    return Schedule(pp, vpp, microbatches, tuple(tuple(fwd + bwd) for _ in range(pp)), "fthenb")


def forward_only(pp: int, vpp: int, microbatches: int, placement: str = "interleaved") -> Schedule:
    """Evaluation's schedule: the forwards of the placement's training schedule (1f1b or
    interleaved; zb-v on the V), in their order and without the backwards, so each rank's
    forwards run back to back; kind ``forward`` / ``forward-v``."""
    if placement == "v":
        train = zb_v(pp, microbatches)
    else:
        train = one_f_one_b(pp, microbatches) if vpp == 1 else interleaved(pp, vpp, microbatches)
    ranks = [[p for a in acts for p in computes(a) if type(p) is F] for acts in train.ranks]
    kind = "forward-v" if placement == "v" else "forward"
    return Schedule(pp, vpp, microbatches, tuple(tuple(r) for r in ranks), kind, placement)


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
    the first holds pp + microbatches % pp, the rest pp each (fewer than pp: one group,
    which only one virtual stage takes)."""
    if microbatches < pp:
        return [range(microbatches)]
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


def interleaved_orders(pp: int, vpp: int, microbatches: int
                       ) -> Tuple[List[Tuple[int, int]], List[Tuple[int, int]]]:
    """Every rank's (chunk, mb) forward order and backward order in `interleaved` (for
    vpp = 1 just 0..M-1 twice)."""
    return (_interleaved_order(pp, vpp, microbatches, backward=False),
            _interleaved_order(pp, vpp, microbatches, backward=True))


def interleaved(pp: int, vpp: int, microbatches: int) -> Schedule:
    if vpp == 1:
        s = one_f_one_b(pp, microbatches)
        return s.with_ranks(s.ranks, kind="interleaved")
    fwd, bwd = interleaved_orders(pp, vpp, microbatches)
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


def w_lag(rank: int, max_pending_w: Optional[int] = None) -> int:
    """Steps each W trails its I by on `rank` in the zero-bubble kinds: the rank (rank 0
    none, its last I ends the step), fewer under the cap."""
    return rank if max_pending_w is None else min(rank, max_pending_w - 1)


def zero_bubble(pp: int, vpp: int, microbatches: int, max_pending_w: Optional[int] = None,
                kind: Optional[str] = None) -> Schedule:
    """zb-h1 (vpp = 1) / interleaved-zb: the interleaved (1F1B) order of F's with I in
    place of B, each W trailing its I by `w_lag(rank)` steps, the rest at the end.
    `kind` only labels the result (default zb-h1 / interleaved-zb)."""
    fwd, bwd = interleaved_orders(pp, vpp, microbatches)
    total = len(fwd)
    ranks = []
    for r in range(pp):
        warmup = interleaved_warmup(pp, vpp, microbatches, r)
        lag = w_lag(r, max_pending_w)
        acts: List[Action] = [F(*cm) for cm in fwd[:warmup]]
        done_w = 0
        for k in range(total):
            if warmup + k < total:
                acts.append(F(*fwd[warmup + k]))
            acts.append(I(*bwd[k]))
            if k + 1 - done_w > lag:  # the W of the I `lag` steps back
                acts.append(W(*bwd[done_w]))
                done_w += 1
        acts += [W(*cm) for cm in bwd[done_w:]]
        ranks.append(tuple(acts))
    label = kind or ("zb-h1" if vpp == 1 else "interleaved-zb")
    return Schedule(pp, vpp, microbatches, tuple(ranks), label)
