from __future__ import annotations

from fractions import Fraction

import pytest

from paddle_ext.pipeline.schedule import (
    FB,
    B,
    Costs,
    F,
    RecvAct,
    RecvGrad,
    Schedule,
    SendAct,
    SendGrad,
    generate,
    lower,
    simulate,
)

HALF = Fraction(1, 2)

# pp=2, one micro-batch, written out by hand.
TINY = Schedule(2, 1, 1, [
    [F(0, 0), SendAct(0, 0, 1), RecvGrad(0, 0, 1), B(0, 0)],
    [RecvAct(0, 0, 0), F(0, 0), B(0, 0), SendGrad(0, 0, 0)],
])


def test_blocking_semantics_by_hand():
    r = simulate(TINY, Costs(1, 2, HALF))
    assert r.mode == "blocking"
    # Rank 1 posts its receive at 0, rank 0 its send at 1: both finish at 1 + 1/2.
    assert r.span(0, SendAct(0, 0, 1))[3:] == (1, Fraction(3, 2))
    assert r.span(1, RecvAct(0, 0, 0))[3:] == (0, Fraction(3, 2))
    assert r.span(1, F(0, 0))[3:] == (Fraction(3, 2), Fraction(5, 2))
    assert r.span(1, B(0, 0))[3:] == (Fraction(5, 2), Fraction(9, 2))
    # Rank 0 has been blocked in its receive since 3/2.
    assert r.span(0, RecvGrad(0, 0, 1))[3:] == (Fraction(3, 2), 5)
    assert r.span(0, B(0, 0))[3:] == (5, 7)
    assert r.makespan == 7
    assert r.busy == (3, 3) and r.idle == (4, 4)
    assert r.bubble == (Fraction(4, 7), Fraction(4, 7)) and r.bubble_overall == Fraction(4, 7)
    assert r.peak_in_flight == (1, 1)
    assert r.peak_buffered == (1, 1)


def test_received_ahead_counts_tensors_waiting_for_their_consumer():
    s = Schedule(2, 1, 2, [
        [F(0, 0), SendAct(0, 0, 1), F(0, 1), SendAct(0, 1, 1), RecvGrad(0, 0, 1),
         RecvGrad(0, 1, 1), B(0, 0), B(0, 1)],
        [RecvAct(0, 0, 0), RecvAct(0, 1, 0), F(0, 0), B(0, 0), SendGrad(0, 0, 0), F(0, 1),
         B(0, 1), SendGrad(0, 1, 0)],
    ])
    r = simulate(s)
    assert r.peak_buffered == (2, 2)
    assert r.peak_in_flight == (2, 1)


def test_dataflow_semantics_of_a_compute_only_schedule():
    r = simulate(TINY.compute_only(), Costs(1, 2, HALF))
    assert r.mode == "dataflow"
    assert [(s.start, s.end) for s in r.spans[1]] == [(Fraction(3, 2), Fraction(5, 2)),
                                                      (Fraction(5, 2), Fraction(9, 2))]
    assert r.makespan == 7


def test_blocking_never_beats_dataflow_and_matches_it_without_comm():
    for pp, v, m in [(2, 2, 5), (3, 2, 7), (4, 3, 8)]:
        s = generate(pp, v, m)
        for costs in (Costs(), Costs(1, 2, HALF), Costs(2, 3, 1)):
            ideal, real = simulate(s, costs), simulate(lower(s, costs), costs)
            assert real.makespan >= ideal.makespan
        assert simulate(lower(s)).makespan == simulate(s).makespan


def test_per_stage_and_per_action_costs():
    s = generate(2, 1, 2, "1f1b")
    # The last stage (loss, lm head) twice as expensive.
    r = simulate(lower(s), Costs(per_stage={1: (2, 4)}))
    assert r.span(1, F(0, 0)).end - r.span(1, F(0, 0)).start == 2
    assert r.span(1, B(0, 0)).end - r.span(1, B(0, 0)).start == 4
    assert r.span(0, B(0, 0)).end - r.span(0, B(0, 0)).start == 2
    assert r.busy == (6, 12)
    r = simulate(lower(s), Costs(per_action={(0, F(0, 1)): 5}))
    assert r.span(0, F(0, 1)).end - r.span(0, F(0, 1)).start == 5
    assert r.span(1, F(0, 1)).end - r.span(1, F(0, 1)).start == 1


def test_overlap_cost():
    s = Schedule(2, 1, 2, [
        [F(0, 0), F(0, 1), B(0, 0), B(0, 1)],
        [F(0, 0), FB(F(0, 1), B(0, 0)), B(0, 1)],
    ])
    fb = FB(F(0, 1), B(0, 0))
    r = simulate(s)
    assert r.span(1, fb).end - r.span(1, fb).start == 3  # F + B by default
    r = simulate(s, Costs(overlap=Fraction(5, 2)))
    assert r.span(1, fb).end - r.span(1, fb).start == Fraction(5, 2)


@pytest.mark.parametrize("text, want", [
    ("1,2,0", (1, 2, 0)),
    (" 1 , 3 , 1 ", (1, 3, 1)),
    ("1/3,2/3,0", (Fraction(1, 3), Fraction(2, 3), 0)),
    ("1.5,2,0.25", (1.5, 2, 0.25)),
])
def test_costs_parse(text, want):
    c = Costs.parse(text)
    assert (c.forward, c.backward, c.comm) == want
    assert type(c.forward) is type(want[0])


@pytest.mark.parametrize("text, message", [
    ("1,2", "expected three numbers F,B,comm"),
    ("1,x,0", "'x' is not a number"),
    ("0,2,0", "cost forward = 0: compute costs must be > 0"),
    ("1,-2,0", "cost backward = -2: compute costs must be > 0"),
    ("1,2,-1", "cost comm = -1: must be >= 0"),
])
def test_costs_parse_errors(text, message):
    with pytest.raises(ValueError, match=message):
        Costs.parse(text)


def test_float_costs_give_float_bubble():
    r = simulate(lower(generate(2, 1, 2)), Costs(1.0, 2.0, 0.0))
    assert isinstance(r.bubble_overall, float)
    assert r.bubble_overall == pytest.approx(1 / 3)


def test_span_lookup_error():
    r = simulate(TINY)
    with pytest.raises(KeyError, match="F0.5 is not on rank 0"):
        r.span(0, F(0, 5))
