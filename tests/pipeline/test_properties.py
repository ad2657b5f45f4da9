"""Property tests over pp 2..8, vpp 1..4, M from pp to 4*pp plus large M, every kind."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest

from paddle_ext.pipeline.schedule import (
    B,
    Comm,
    F,
    Schedule,
    analytic_bubble,
    analytic_makespan,
    computes,
    generate,
    peak_in_flight_bound,
    simulate,
)
from tests.pipeline.cases import PPS, VPPS, assert_dependency_order, case, microbatch_counts

GRID = [(pp, v, kind) for pp in PPS for v in VPPS for kind in ("fthenb", "interleaved")]
GRID += [(pp, 1, "1f1b") for pp in PPS]


def _ids(p):
    return f"pp{p[0]}-v{p[1]}-{p[2]}"


@pytest.mark.parametrize("pp, v, kind", GRID, ids=[_ids(p) for p in GRID])
def test_every_schedule_validates_and_meets_the_closed_forms(pp, v, kind):
    for m in microbatch_counts(pp, kind):
        s, lowered, result = case(pp, v, m, kind)  # validate() ran inside: no deadlock
        where = f"pp={pp} vpp={v} M={m} {kind}"
        assert result.mode == "blocking", where

        # Each (chunk, mb) exactly once as F and once as B on every rank, F first.
        for acts in s.ranks:
            parts = [p for a in acts for p in computes(a)]
            count = Counter(parts)
            want = {k(c, mb) for k in (F, B) for c in range(v) for mb in range(m)}
            assert set(count) == want and set(count.values()) == {1}, where
            pos = {p: i for i, p in enumerate(parts)}
            assert all(pos[F(c, mb)] < pos[B(c, mb)] for c in range(v) for mb in range(m))

        assert_dependency_order(result, where)  # in simulated (blocking) time

        # Memory: the documented bound, reached exactly.
        bounds = tuple(peak_in_flight_bound(pp, v, m, kind, r) for r in range(pp))
        assert result.peak_in_flight == bounds, where
        if kind == "1f1b" or (kind == "interleaved" and v == 1):
            assert bounds == tuple(pp - r for r in range(pp))

        # Unit costs (F=1, B=2, comm=0): exact closed forms, balanced or not, on the
        # blocking run of the lowered lists.
        assert result.makespan == analytic_makespan(pp, v, m) == (v * m + pp - 1) * 3, where
        formula = Fraction(pp - 1, v * m + pp - 1)
        assert analytic_bubble(pp, v, m) == formula
        assert result.bubble_overall == formula, where
        assert set(result.bubble) == {formula}, where

        # Text round trip of both forms.
        assert Schedule.from_text(s.to_text()) == s
        assert Schedule.from_text(lowered.to_text()) == lowered
        assert lowered.compute_only() == s


@pytest.mark.parametrize("costs", [(1, 1), (2, 3), (3, 1), (5, 7)])
def test_closed_form_holds_for_any_uniform_costs_in_the_ideal_run(costs):
    # Dataflow semantics (compute-only schedule, unbounded buffers): the formula is
    # exact for any F and B; blocking send/recv can only add to it.
    from paddle_ext.pipeline.schedule import Costs

    f, b = costs
    c = Costs(f, b)
    for pp in (2, 3, 5, 8):
        for v in (1, 2, 3):
            for m in (pp, pp + 1, 2 * pp + 1, 3 * pp):
                for kind in ("fthenb", "interleaved"):
                    s = generate(pp, v, m, kind)
                    r = simulate(s, c)
                    assert r.makespan == analytic_makespan(pp, v, m, c) == (v * m + pp - 1) * (f + b)
                    assert r.bubble_overall == analytic_bubble(pp, v, m, c)


def test_lowered_lists_are_complete_instruction_streams():
    # Every tensor crossing a rank boundary has exactly one send and one receive, and
    # pp=2 (both neighbours are the same rank) included.
    for pp, v, m in [(2, 2, 5), (2, 4, 9), (3, 3, 7), (4, 2, 10)]:
        _, lowered, _ = case(pp, v, m, "interleaved")
        comms = [(r, a) for r, acts in enumerate(lowered.ranks) for a in acts
                 if isinstance(a, Comm)]
        sends = [a for _, a in comms if a.is_send]
        recvs = [a for _, a in comms if not a.is_send]
        boundaries = pp * v - 1
        assert len(sends) == len(recvs) == 2 * boundaries * m
        assert all(a.peer != r for r, a in comms)


def _random_schedule(rng, pp: int, v: int, m: int) -> Schedule:
    """Per-rank orders from a random topological order of the whole step's dataflow: a
    compute order that can finish, but nothing like the generators' regular shapes."""
    n = pp * v
    ranks = [[] for _ in range(pp)]
    done = set()
    ready = {("F", 0, mb) for mb in range(m)}
    while ready:
        kind, s, mb = rng.choice(sorted(ready))
        ready.remove((kind, s, mb))
        done.add((kind, s, mb))
        ranks[s % pp].append((F if kind == "F" else B)(s // pp, mb))
        if kind == "F":
            ready.add(("F", s + 1, mb) if s + 1 < n else ("B", s, mb))
        elif s > 0:
            ready.add(("B", s - 1, mb))
    return Schedule(pp, v, m, ranks, kind="random")


@pytest.mark.parametrize("seed", range(40))
def test_lowering_any_valid_compute_order_cannot_deadlock(seed):
    import random

    from paddle_ext.pipeline.schedule import Costs, lower, validate

    rng = random.Random(seed)
    pp, v = rng.randint(2, 5), rng.randint(1, 3)
    m = rng.randint(pp, 2 * pp + 1)
    s = _random_schedule(rng, pp, v, m)
    validate(s)
    placement = rng.choice([Costs(), Costs(2, 3, 1), Costs(1, 1, Fraction(1, 3))])
    lowered = lower(s, placement)
    for costs in (Costs(), Costs(3, 1, 2), placement):  # deadlock-free whatever the costs
        result = validate(lowered, costs)
        assert result.makespan >= simulate(s, costs).makespan
