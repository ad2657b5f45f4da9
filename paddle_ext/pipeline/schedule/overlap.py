"""The forward/backward overlap transformation (upstream #71995's schedule, in the IR).

`overlap(schedule)` takes a compute-only schedule of the warm-up / steady / cool-down
shape (`1f1b`, `interleaved`: balanced or not) and pairs every steady-state forward with
the backward that follows it into one `FB` action, `F<a>.<i>&B<b>.<j>`: a model that
defines `overlapped_forward_backward` then runs the two as one step and interleaves
their pieces (one micro-batch's attention with another's MLP backward, an MoE
all-to-all behind the other half's compute, ...).

More warm-up makes the pairs possible. Rank r with plain warm-up w gets

    w' = min(max(w + 1, 2*(pp - r - 1) + 1), vpp*M)

forwards first, then `F(fwd[w'+k]) & B(bwd[k])` for k = 0, 1, ..., then the last B's,
where fwd / bwd are the rank's forward and backward orders, unchanged (so every
parameter accumulates its gradient over the micro-batches in the same order as without
overlap). For interleaved VPP, w + 1 is the larger term: upstream's
`startup_steps += 1`, needed because the last stage runs F(m) then B(m) and an F&B
cannot hold a micro-batch's own forward and backward. For 1F1B the second term rules:
with w + 1 only, rank r's k-th pair would wait for rank r+1's k-th pair (its output
gradient), which waits for rank r+2's, ... so the pairs of one step would run one rank
after the other (pp=4 M=8, unit costs: makespan 51 instead of 33). Letting rank r's
backwards trail by pp - r - 1 more steps makes every pair depend only on its
neighbours' previous pairs.

Costs: with an F&B that costs exactly F + B the makespan is the plain schedule's in
the whole test sweep (dataflow run); the gain comes from an F&B cheaper than F + B
(`Costs.overlap_ratio`). Memory: one more chunk-activation in flight per rank for
interleaved (w + 2), and 2*(pp - r) for 1F1B (twice plain 1F1B's pp - r on rank 0; see
`analytic.peak_in_flight_bound`).

Kinds: the result's kind is the input's plus "-overlap" (`1f1b-overlap`,
`interleaved-overlap`); `split_kind` undoes that.
"""

from __future__ import annotations

from typing import List, Tuple

from paddle_ext.pipeline.schedule.ir import FB, Action, B, F, Schedule, schedule_error

__all__ = ["OVERLAP_SUFFIX", "overlap", "split_kind", "overlap_pairs", "warmup_of", "is_overlapped"]

OVERLAP_SUFFIX = "-overlap"


def split_kind(kind: str) -> Tuple[str, bool]:
    """('interleaved', True) for 'interleaved-overlap'; (kind, False) otherwise."""
    if kind.endswith(OVERLAP_SUFFIX):
        return kind[: -len(OVERLAP_SUFFIX)], True
    return kind, False


def warmup_of(actions) -> int:
    """Forwards before the first backward (or any overlapped pair) in a compute list."""
    for i, a in enumerate(actions):
        if type(a) is not F:
            return i
    return len(actions)


def overlap_pairs(schedule: Schedule) -> Tuple[int, ...]:
    """Number of FB actions on each rank."""
    return tuple(sum(1 for a in acts if type(a) is FB) for acts in schedule.ranks)


def overlap(schedule: Schedule) -> Schedule:
    """Pairs each steady-state F with a B (see module docstring).

    Raises ScheduleError for a lowered schedule, one that already has FB actions, or a
    rank whose list is not warm-up F's, alternating F/B, then B's.
    """
    if schedule.lowered:
        raise schedule_error(schedule, "overlap() takes the compute-only schedule: pair the "
                             "forwards and backwards first, then lower()")
    ranks: List[Tuple[Action, ...]] = []
    for r, acts in enumerate(schedule.ranks):
        fwd: List[F] = []
        bwd: List[B] = []
        for i, a in enumerate(acts):
            if type(a) is FB:
                raise schedule_error(schedule, f"{a} on rank {r} is already an overlapped pair",
                                     [(r, i)])
            if type(a) not in (F, B):
                raise schedule_error(schedule, f"{a} on rank {r} is half of a split backward: "
                                     "overlap() pairs an F with a whole B, so zero-bubble "
                                     "schedules have no overlapped form", [(r, i)])
            (fwd if type(a) is F else bwd).append(a)  # type: ignore[arg-type]
        n = len(fwd)
        if len(bwd) != n:
            raise schedule_error(schedule, f"rank {r} has {n} forwards and {len(bwd)} "
                                 "backwards: overlap() needs one B per F", [])
        # The plain warm-up: the forwards before the first B, less the F that the
        # steady state pairs with that B (all forwards first: any w gives the same list).
        w = max(warmup_of(acts) - 1, 0)
        expected: List[Action] = list(fwd[:w])
        for k in range(n - w):
            expected += [fwd[w + k], bwd[k]]
        expected += bwd[n - w:]
        if list(acts) != expected:
            bad = next(i for i, (x, y) in enumerate(zip(acts, expected)) if x != y)
            raise schedule_error(
                schedule, f"rank {r} is not warm-up forwards, then one F and one B in turn, "
                f"then backwards (step {bad} is {acts[bad]}, expected {expected[bad]}): "
                "overlap() pairs the steady state of 1f1b / interleaved schedules", [(r, bad)])
        w2 = min(max(w + 1, 2 * (schedule.pp - r - 1) + 1), n)
        out: List[Action] = list(fwd[:w2])
        out += [FB(fwd[w2 + k], bwd[k]) for k in range(n - w2)]
        out += bwd[n - w2:]
        ranks.append(tuple(out))
    kind = schedule.kind if split_kind(schedule.kind)[1] else schedule.kind + OVERLAP_SUFFIX
    return schedule.with_ranks(ranks, kind=kind)


def is_overlapped(schedule: Schedule) -> bool:
    """True when some rank has an FB action."""
    return any(type(a) is FB for acts in schedule.ranks for a in acts)
