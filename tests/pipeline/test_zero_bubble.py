"""Zero-bubble schedules (zb-h1, interleaved-zb, the -w<k> cap) and the I/W actions:
properties over pp 2..8, vpp 1..4, M pp..4pp against the closed forms of
docs/pipeline_schedules.md, and the validator / cost model / argument errors by hand."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from paddle_ext.pipeline.schedule import (
    B,
    Costs,
    F,
    GradSync,
    I,
    Schedule,
    ScheduleArgumentError,
    ScheduleError,
    SendGrad,
    W,
    analytic_bubble,
    analytic_makespan,
    computes,
    generate,
    lower,
    simulate,
    validate,
)
from paddle_ext.pipeline.schedule.analytic import (
    peak_held_bound,
    peak_in_flight_bound,
    peak_pending_w_bound,
    zb_idle,
)
from tests.pipeline.cases import PPS, VPPS, assert_dependency_order


def _kind(vpp: int) -> str:
    return "zb-h1" if vpp == 1 else "interleaved-zb"


def _check_order_and_times(s: Schedule, result) -> None:
    """One F, one I, one W per (chunk, mb) on every rank, F < I < W in the list, and the
    dataflow dependencies in simulated time."""
    v, m = s.vpp, s.microbatches
    want = {k(c, mb) for k in (F, I, W) for c in range(v) for mb in range(m)}
    for acts in s.ranks:
        parts = [p for a in acts for p in computes(a)]
        assert len(parts) == len(want) and set(parts) == want
        pos = {p: i for i, p in enumerate(parts)}
        assert all(pos[F(c, mb)] < pos[I(c, mb)] < pos[W(c, mb)]
                   for c in range(v) for mb in range(m))
    assert_dependency_order(result)


GRID = [(pp, v) for pp in PPS for v in VPPS]


@pytest.mark.parametrize("pp, v", GRID, ids=[f"pp{pp}-v{v}" for pp, v in GRID])
def test_zero_bubble_schedules_validate_and_meet_the_closed_forms(pp, v):
    kind = _kind(v)
    # Every M from pp to 4*pp uncapped; the capped variants on a sample of M (the
    # caps' behaviour does not depend on M, see the closed form).
    rng = random.Random(pp * 10 + v)
    ms = list(range(pp, 4 * pp + 1))
    cases = [(m, None) for m in ms]
    cases += [(rng.choice(ms), cap) for cap in sorted({1, 2, pp - 1, pp + 1})]
    for m, cap in cases:
        where = f"pp={pp} vpp={v} M={m} {kind} max_pending_w={cap}"
        s = generate(pp, v, m, kind, max_pending_w=cap)
        lowered = lower(s, grad_sync=True)
        result = validate(lowered)  # blocking send/recv: runs to the end, no deadlock
        _check_order_and_times(s, result)

        # GS<c> right after chunk c's last W: never before a W of the chunk.
        for acts in lowered.ranks:
            at = {a: i for i, a in enumerate(acts)}  # every action appears once in a rank's list
            for c in range(v):
                gs = at[GradSync(c)]
                assert all(at[W(c, mb)] < gs for mb in range(m)), where
                assert acts[gs - 1] in {W(c, mb) for mb in range(m)} or \
                    isinstance(acts[gs - 1], GradSync), where

        # Memory: activations as the plain schedule (ZB-H1: 1F1B's, per rank), pending
        # W's and the whole-until-W figure as documented.
        rows = range(pp)
        label = s.kind
        assert result.peak_in_flight == tuple(
            peak_in_flight_bound(pp, v, m, label, r) for r in rows), where
        assert result.peak_pending_w == tuple(
            peak_pending_w_bound(pp, v, m, label, r) for r in rows), where
        assert result.peak_held == tuple(peak_held_bound(pp, v, m, label, r) for r in rows), where
        if v == 1:
            plain = simulate(generate(pp, 1, m, "1f1b"))
            assert all(z <= o for z, o in zip(result.peak_in_flight, plain.peak_in_flight)), where
            assert result.peak_in_flight == tuple(pp - r for r in rows)
            assert max(result.peak_held) <= max(plain.peak_in_flight) == pp, where

        # Unit costs F = I = W = 1 (the default Costs(): B = 2 split in halves): the
        # blocking run of the lowered lists meets the closed form exactly.
        c = pp - 1 if cap is None else min(cap - 1, pp - 1)
        idle = 2 * (pp - 1) - c
        assert result.makespan == analytic_makespan(pp, v, m, kind=label) == 3 * v * m + idle
        formula = Fraction(idle, 3 * v * m + idle)
        assert result.bubble_overall == analytic_bubble(pp, v, m, kind=label) == formula, where
        assert set(result.bubble) == {formula}, where
        if cap is None:
            assert formula == Fraction(pp - 1, 3 * v * m + pp - 1)
            # A third of the plain schedule's bubble time (pp - 1 against 3*(pp - 1)),
            # and even counting a pending W as a whole activation no rank holds more
            # than the plain schedule's rank 0.
            plain = simulate(generate(pp, v, m, "interleaved"))
            assert plain.makespan - 3 * v * m == 3 * idle
            assert max(result.peak_held) <= max(plain.peak_in_flight), where

        assert Schedule.from_text(lowered.to_text()) == lowered
        assert lowered.compute_only() == s


def test_threaded_lowering_of_zero_bubble_schedules():
    for pp, v, m in [(2, 1, 2), (2, 2, 5), (4, 1, 9), (3, 3, 7), (4, 2, 10)]:
        s = generate(pp, v, m, _kind(v))
        for costs in (Costs(), Costs(1, 2, Fraction(1, 5))):
            lowered = lower(s, costs, async_p2p=True)
            result = validate(lowered, costs, async_p2p=True)
            assert result.mode == "threaded"
            if costs.comm == 0:
                assert result.makespan == analytic_makespan(pp, v, m, kind=s.kind)


# (F, I, W) triples; the closed form holds for every one with vpp = 1 and for the W <= F
# ones with vpp > 1.
TRIPLES = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (3, 2, 1), (1, 3, 2), (5, 2, 3),
           (2, 1, 2), (4, 3, 2)]


@pytest.mark.parametrize("f, i, w", TRIPLES)
def test_closed_form_for_general_costs_in_the_ideal_run(f, i, w):
    costs = Costs(f, i + w, input_grad=i, weight_grad=w)
    for pp in (2, 3, 5, 8):
        for v in (1, 2, 3):
            for m in (pp, pp + 1, 2 * pp + 1, 3 * pp):
                for cap in (None, 1, 2):
                    s = generate(pp, v, m, _kind(v), max_pending_w=cap)
                    expect = analytic_makespan(pp, v, m, costs, kind=s.kind)
                    if v > 1 and w > f:
                        assert expect is None
                        continue
                    result = simulate(s, costs)  # dataflow
                    assert result.makespan == expect == v * m * (f + i + w) + zb_idle(
                        pp, v, costs, cap)
                    assert result.bubble_overall == analytic_bubble(pp, v, m, costs, s.kind)


def test_zb_idle_formula_by_hand():
    # Unit costs: pp - 1 uncapped, one unit more per pending W the cap takes away.
    assert [zb_idle(4, 1, Costs(), cap) for cap in (None, 1, 2, 3, 4, 9)] == [3, 6, 5, 4, 3, 3]
    # F=3, I=2, W=1: (pp-1)(F+I-W) = 3*4; F=5, I=2, W=3: the F chain, (pp-1)*F.
    assert zb_idle(4, 1, Costs(3, 3, input_grad=2, weight_grad=1)) == 12
    assert zb_idle(4, 1, Costs(5, 5, input_grad=2, weight_grad=3)) == 15
    assert zb_idle(4, 2, Costs(1, 3, input_grad=1, weight_grad=2)) is None  # W > F, vpp > 1
    assert zb_idle(4, 1, Costs(1, 2, 1)) is None  # comm > 0


def test_zb_h1_lists_by_hand():
    s = generate(4, 1, 8, "zb-h1")
    assert s.to_text().splitlines()[1:] == [
        "0: F0.0 F0.1 F0.2 F0.3 I0.0 W0.0 F0.4 I0.1 W0.1 F0.5 I0.2 W0.2 F0.6 I0.3 W0.3 F0.7 "
        "I0.4 W0.4 I0.5 W0.5 I0.6 W0.6 I0.7 W0.7",
        "1: F0.0 F0.1 F0.2 I0.0 F0.3 I0.1 W0.0 F0.4 I0.2 W0.1 F0.5 I0.3 W0.2 F0.6 I0.4 W0.3 F0.7 "
        "I0.5 W0.4 I0.6 W0.5 I0.7 W0.6 W0.7",
        "2: F0.0 F0.1 I0.0 F0.2 I0.1 F0.3 I0.2 W0.0 F0.4 I0.3 W0.1 F0.5 I0.4 W0.2 F0.6 I0.5 W0.3 F0.7 "
        "I0.6 W0.4 I0.7 W0.5 W0.6 W0.7",
        "3: F0.0 I0.0 F0.1 I0.1 F0.2 I0.2 F0.3 I0.3 W0.0 F0.4 I0.4 W0.1 F0.5 I0.5 W0.2 F0.6 I0.6 W0.3 "
        "F0.7 I0.7 W0.4 W0.5 W0.6 W0.7",
    ]
    # With at most one pending W, each W follows its I: 1F1B with B split in two.
    flat = generate(4, 1, 8, "zb-h1-w1")
    plain = generate(4, 1, 8, "1f1b")
    split = [[p for a in acts for p in ((I(a.chunk, a.mb), W(a.chunk, a.mb)) if type(a) is B
                                        else (a,))] for acts in plain.ranks]
    assert [list(r) for r in flat.ranks] == split
    assert generate(4, 1, 8, "interleaved-zb").ranks == s.ranks
    assert generate(4, 1, 8, "zb-h1", max_pending_w=2) == generate(4, 1, 8, "zb-h1-w2")


@pytest.mark.parametrize("kind, vpp, cap, message", [
    ("zb-h1-overlap", 1, None, "zero-bubble kinds have no -overlap form"),
    ("interleaved-zb-overlap", 2, None, "zero-bubble kinds have no -overlap form"),
    ("zb-h1", 2, None, "vpp = 2 is not allowed: kind zb-h1 needs 1 (use interleaved-zb"),
    ("1f1b-w2", 1, None, "kind = '1f1b-w2' is not allowed"),
    ("zb-h1-w0", 1, None, "max_pending_w = 0 is not allowed: must be an integer >= 1"),
    ("1f1b", 1, 2, "max_pending_w = 2 is not allowed: only zero-bubble kinds"),
    ("zb-h1-w2", 1, 3, "max_pending_w = 3 is not allowed: kind 'zb-h1-w2' already caps it at 2"),
])
def test_bad_zero_bubble_arguments(kind, vpp, cap, message):
    with pytest.raises(ScheduleArgumentError) as info:
        generate(4, vpp, 8, kind, max_pending_w=cap)
    assert message in str(info.value)


def _error(schedule: Schedule) -> ScheduleError:
    with pytest.raises(ScheduleError) as info:
        validate(schedule)
    return info.value


def _edit(s: Schedule, rank: int, fn) -> Schedule:
    ranks = [list(r) for r in s.ranks]
    ranks[rank] = fn(ranks[rank])
    return s.with_ranks(ranks)


def test_validator_on_broken_split_backwards():
    s = generate(2, 1, 3, "zb-h1")

    def swap(a, b):
        def fn(acts):
            i, j = acts.index(a), acts.index(b)
            acts[i], acts[j] = acts[j], acts[i]
            return acts
        return fn

    err = _error(_edit(s, 1, swap(I(0, 1), W(0, 1))))
    assert err.reason.startswith("W0.1 on rank 1 (step ") and \
        "runs before its input gradient: I0.1 comes later" in err.reason
    assert "[W0.1]!" in err.grid
    err = _error(_edit(s, 0, lambda acts: [a for a in acts if a != W(0, 2)]))
    assert "I0.2 on rank 0" in err.reason and "has no W0.2" in err.reason
    err = _error(_edit(s, 0, lambda acts: [a for a in acts if a != I(0, 2)]))
    assert "W0.2 on rank 0" in err.reason and "rank 0 has no I0.2" in err.reason
    err = _error(_edit(s, 0, lambda acts: acts + [B(0, 1)]))
    assert "both compute gradients of micro-batch 1: a (chunk, micro-batch) runs one B, or " \
        "one I and one W" in err.reason
    err = _error(_edit(s, 1, swap(F(0, 2), I(0, 2))))
    assert "I0.2 on rank 1" in err.reason and "runs before its forward" in err.reason
    err = _error(_edit(s, 0, lambda acts: acts + [W(0, 0)]))
    assert "W0.0 appears twice on rank 0" in err.reason

    # GS before the chunk's last W (the torch DDP trap): refused.
    lowered = lower(s, grad_sync=True)
    early = _edit(lowered, 1, lambda acts: [GradSync(0)] + [a for a in acts if a != GradSync(0)])
    err = _error(early)
    assert "GS0 on rank 1 (step 0) comes before chunk 0's last weight-gradient W0.2" in err.reason
    # The gradient send follows I: moved before it, refused.
    def send_early(acts):
        send = SendGrad(0, 1, 0)
        acts.remove(send)
        acts.insert(acts.index(I(0, 1)), send)
        return acts
    err = _error(_edit(lowered, 1, send_early))
    assert "SG0.1>0 on rank 1" in err.reason and "must come after I0.1" in err.reason


def test_mixed_b_and_split_backwards_validate():
    # Some micro-batches with B, others with I and W, on one rank: allowed.
    s = generate(2, 1, 3, "1f1b")
    mixed = _edit(s, 1, lambda acts: [x for a in acts for x in (
        (I(0, a.mb), W(0, a.mb)) if a == B(0, 1) else (a,))])
    result = validate(lower(mixed, grad_sync=True))
    assert result.peak_pending_w == (0, 1)


def test_costs_for_split_backwards():
    c = Costs()
    assert (c.of(2, 0, I(0, 0)), c.of(2, 0, W(0, 0)), c.of(2, 0, B(0, 0))) == (1, 1, 2)
    assert Costs(1, 3).i_w == (Fraction(3, 2), Fraction(3, 2))
    assert Costs(1, 3, input_grad=2).i_w == (2, 1)
    assert Costs(1, 3, weight_grad=2).i_w == (1, 2)
    parsed = Costs.parse("1,2,1/2,0")
    assert (parsed.forward, parsed.i_w, parsed.backward, parsed.comm) == (1, (2, Fraction(1, 2)),
                                                                          Fraction(5, 2), 0)
    per = Costs(per_stage={1: (2, 3, 4), 0: (1, 6)})
    assert [per.of(2, 1, a(0, 0)) for a in (F, I, W, B)] == [2, 3, 4, 7]
    assert [per.of(2, 0, a(0, 0)) for a in (F, I, W, B)] == [1, 3, 3, 6]
    with pytest.raises(ValueError, match="cost weight_grad = -1: compute costs must be > 0"):
        Costs(1, 2, input_grad=3)
    with pytest.raises(ValueError, match=r"expected \(F, B\) or \(F, I, W\)"):
        Costs(per_stage={0: (1, 2, 3, 4)})
    with pytest.raises(ValueError, match="expected three numbers F,B,comm or four"):
        Costs.parse("1,2")


def test_measured_timeline_of_a_zero_bubble_run_prices_i_and_w():
    # The bench's path: spans as the interpreter records them -> measured SimResult and
    # Costs -> the simulator's prediction on the same footing.
    from paddle_ext.pipeline.timeline import measured_costs, measured_result

    s = lower(generate(2, 1, 3, "zb-h1"))
    truth = Costs(1, 3, input_grad=1, weight_grad=2)
    run = simulate(s, truth)
    spans = [[(sp.index, sp.action, float(sp.start), float(sp.end)) for sp in row]
             for row in run.spans]
    measured = measured_result(s, spans)
    assert measured.busy == (12.0, 12.0) and measured.makespan == run.makespan
    costs = measured_costs(s, spans)
    assert costs.i_w == (1.0, 2.0) and costs.per_stage == {0: (1.0, 1.0, 2.0), 1: (1.0, 1.0, 2.0)}
    assert simulate(s, costs).makespan == run.makespan


def test_replayed_costs_reproduce_a_run_whose_actions_vary_and_busy_share_counts_overlap():
    # pp=4 on two cores: an action's time depends on what the other ranks do at that
    # moment, so medians mispredict; replaying each action's own span must give back the
    # run's makespan exactly, and busy_share the time >= k ranks computed at once.
    from paddle_ext.pipeline.timeline import (
        busy_share,
        measured_costs,
        measured_result,
        replayed_costs,
    )

    s = lower(generate(2, 1, 4, "zb-h1"))
    slow = {(0, a): 6 for a in s.ranks[0] if computes(a) and a.mb == 0}  # rank 0's first micro-batch
    run = simulate(s, Costs(1, 2, per_action=slow))
    spans = [[(sp.index, sp.action, float(sp.start), float(sp.end)) for sp in row] for row in run.spans]
    assert simulate(s, replayed_costs(s, spans)).makespan == run.makespan
    assert simulate(s, measured_costs(s, spans)).makespan != run.makespan
    measured = measured_result(s, spans)
    assert busy_share(measured, 1) == 1.0  # some rank computes at every moment of this run
    both = sum(max(0.0, min(a.end, b.end) - max(a.start, b.start))
               for a in measured.spans[0] if computes(a.action)
               for b in measured.spans[1] if computes(b.action))
    assert 0 < both < measured.makespan
    assert busy_share(measured, 2) == both / measured.makespan
    assert busy_share(measured, 3) == 0.0
