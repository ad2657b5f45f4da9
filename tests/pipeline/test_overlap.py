"""The forward/backward overlap transformation, F&B costs, asynchronous-p2p lowering and
its simulation, and the CLI's --overlap / --fb-cost / --async-p2p. No Paddle."""

from __future__ import annotations

import io
from fractions import Fraction

import pytest

from paddle_ext.pipeline.schedule import (
    FB,
    B,
    Comm,
    Costs,
    F,
    RecvAct,
    RecvGrad,
    Schedule,
    ScheduleArgumentError,
    ScheduleError,
    SendAct,
    SendGrad,
    computes,
    generate,
    lower,
    overlap,
    overlap_pairs,
    peak_in_flight_bound,
    simulate,
    split_kind,
    text_timeline,
    validate,
)
from paddle_ext.pipeline.schedule.cli import main
from paddle_ext.pipeline.schedule.generate import interleaved_warmup
from tests.pipeline.cases import PPS, VPPS

GRID = [(pp, v) for pp in PPS for v in VPPS]


def _order(acts, kind):
    return [p for a in acts for p in computes(a) if type(p) is kind]


@pytest.mark.parametrize("pp, v", GRID, ids=[f"pp{p}-v{v}" for p, v in GRID])
def test_overlap_keeps_each_ranks_order_validates_and_costs_nothing_at_f_plus_b(pp, v):
    for m in list(range(pp, 4 * pp + 1)) + [64]:
        plain = generate(pp, v, m)
        s = overlap(plain)
        where = f"pp={pp} vpp={v} M={m}"
        assert s.kind == "interleaved-overlap" and split_kind(s.kind) == ("interleaved", True)
        assert s == generate(pp, v, m, "interleaved-overlap")
        ideal = validate(s)  # dataflow: no deadlock, dependencies in time
        assert ideal.makespan == simulate(plain).makespan == (v * m + pp - 1) * 3, where
        for r, (a, b) in enumerate(zip(plain.ranks, s.ranks)):
            # Every parameter accumulates over the same micro-batch order.
            assert _order(a, F) == _order(b, F) and _order(a, B) == _order(b, B), where
            for x in b:
                if type(x) is FB:
                    assert (x.f.chunk, x.f.mb) != (x.b.chunk, x.b.mb)
            # Shape: warm-up w' forwards, pairs, then backwards; w' as documented.
            w = interleaved_warmup(pp, v, m, r)
            w2 = min(max(w + 1, 2 * (pp - r - 1) + 1), v * m)
            assert all(type(x) is F for x in b[:w2]) and type(b[w2]) in (FB, B), where
            assert overlap_pairs(s)[r] == v * m - w2
            assert ideal.peak_in_flight[r] == peak_in_flight_bound(pp, v, m, s.kind, r), where
            if v > 1:
                assert w2 == min(w + 1, v * m)  # upstream's startup_steps + 1
        if m <= 2 * pp + 1:  # the lowered lists, both ways (the dataflow ran for every M)
            blocking = lower(s)
            validate(blocking)
            assert Schedule.from_text(blocking.to_text()) == blocking
            threaded = lower(s, async_p2p=True)
            assert validate(threaded, async_p2p=True).makespan == ideal.makespan, where


def test_cheaper_pairs_shorten_the_step():
    for pp, v, m in [(2, 2, 5), (4, 2, 10), (4, 1, 8), (8, 2, 16)]:
        plain = simulate(generate(pp, v, m)).makespan
        s = overlap(generate(pp, v, m))
        fast = simulate(s, Costs(overlap_ratio=Fraction(7, 10))).makespan
        assert fast < plain
    # pp=4 vpp=2 M=10 with F&B = 0.7 (F + B): 57.3 instead of 69.
    s = generate(4, 2, 10, "interleaved-overlap")
    assert simulate(s, Costs(overlap_ratio=Fraction(7, 10))).makespan == Fraction(573, 10)


def test_1f1b_backwards_trail_so_pairs_do_not_chain_across_ranks():
    s = generate(4, 1, 8, "1f1b-overlap")
    assert [x for x in s.ranks[3]][:3] == [F(0, 0), FB(F(0, 1), B(0, 0)), FB(F(0, 2), B(0, 1))]
    assert s.ranks[0][:7] == tuple(F(0, m) for m in range(7))  # warm-up 2*(pp-1)+1
    assert simulate(s).makespan == simulate(generate(4, 1, 8, "1f1b")).makespan == 33
    # Upstream's w+1 alone would pair F(k+w+1) with B(k) on every rank, and each pair
    # would wait for the next rank's pair of the same step: 51.
    naive = []
    for r, acts in enumerate(generate(4, 1, 8, "1f1b").ranks):
        fwd, bwd = _order(acts, F), _order(acts, B)
        w = min(4 - r - 1, 8) + 1
        naive.append(fwd[:w] + [FB(fwd[w + k], bwd[k]) for k in range(8 - w)] + bwd[8 - w:])
    assert simulate(Schedule(4, 1, 8, naive)).makespan == 51


def test_fb_costs():
    fb = FB(F(0, 1), B(1, 0))
    assert Costs().of(2, 0, fb) == 3
    assert Costs(overlap=2).of(2, 0, fb) == 2
    assert Costs(overlap_ratio=Fraction(1, 2)).of(2, 0, fb) == Fraction(3, 2)
    # F on stage 0 (overridden: 2), B on stage 2 (default: 2)
    assert Costs(overlap_ratio=0.7, per_stage={0: (2, 4)}).of(2, 0, fb) == pytest.approx(0.7 * (2 + 2))
    assert not Costs(overlap_ratio=0.7).uniform and Costs(overlap_ratio=1).uniform
    with pytest.raises(ValueError, match="not both"):
        Costs(overlap=2, overlap_ratio=0.5)
    with pytest.raises(ValueError, match="overlap_ratio = 0"):
        Costs(overlap_ratio=0)


def test_overlap_refuses_what_it_cannot_pair():
    with pytest.raises(ScheduleError, match="takes the compute-only schedule"):
        overlap(lower(generate(2, 1, 3)))
    with pytest.raises(ScheduleError, match="already an overlapped pair"):
        overlap(overlap(generate(2, 2, 4)))
    odd = Schedule(2, 1, 2, [[F(0, 0), B(0, 0), F(0, 1), F(0, 1), B(0, 1)][:2] + [F(0, 1), B(0, 1)],
                             [F(0, 0), B(0, 0), B(0, 1), F(0, 1)]])
    with pytest.raises(ScheduleError, match="rank 1 is not warm-up forwards"):
        overlap(odd)
    with pytest.raises(ScheduleArgumentError, match="1f1b-overlap / interleaved-overlap"):
        generate(2, 1, 3, "fthenb-overlap")
    # fthenb has no steady state: nothing to pair, the kind says so.
    assert overlap_pairs(overlap(generate(2, 2, 3, "fthenb"))) == (0, 0)


def test_threaded_semantics_by_hand():
    tiny = Schedule(2, 1, 2, [
        [F(0, 0), SendAct(0, 0, 1), F(0, 1), SendAct(0, 1, 1), RecvGrad(0, 0, 1), B(0, 0),
         RecvGrad(0, 1, 1), B(0, 1)],
        [RecvAct(0, 0, 0), RecvAct(0, 1, 0), F(0, 0), B(0, 0), SendGrad(0, 0, 0), F(0, 1),
         B(0, 1), SendGrad(0, 1, 0)],
    ])
    costs = Costs(1, 2, Fraction(1, 2))
    r = simulate(tiny, costs, async_p2p=True)
    assert r.mode == "threaded"
    # Rank 1 posts RA0.1 at 3/2, right after RA0.0 finished: while F0.0 computes. Rank 0
    # can post SA0.1 once F0.1 ended at 2.
    assert r.span(1, RecvAct(0, 1, 0))[3:] == (Fraction(3, 2), Fraction(5, 2))
    assert r.span(1, F(0, 1))[3:] == (Fraction(9, 2), Fraction(11, 2))
    assert r.span(0, F(0, 1))[3:] == (1, 2)  # computes on while SA0.0 is in flight
    blocking = simulate(tiny, costs)
    assert r.makespan < blocking.makespan
    # One rank's receives swapped: the channel no longer matches.
    broken = tiny.with_ranks([tiny.ranks[0], [RecvAct(0, 1, 0), RecvAct(0, 0, 0)] + list(tiny.ranks[1][2:])])
    with pytest.raises(ScheduleError, match="receive #0 from rank 0 is RA0.1<0"):
        simulate(broken, costs, async_p2p=True)
    # Matching channels but a cycle: rank 0's link sends SA0.1 first, which needs F0.1,
    # which comes after B0.0, which needs rank 1's B0.0, whose input RA0.0 is second on
    # the link.
    cycle = Schedule(2, 1, 2, [
        [F(0, 0), RecvGrad(0, 0, 1), B(0, 0), F(0, 1), SendAct(0, 1, 1), SendAct(0, 0, 1),
         RecvGrad(0, 1, 1), B(0, 1)],
        [RecvAct(0, 1, 0), RecvAct(0, 0, 0), F(0, 0), B(0, 0), SendGrad(0, 0, 0), F(0, 1),
         B(0, 1), SendGrad(0, 1, 0)],
    ])
    with pytest.raises(ScheduleError, match=r"deadlock with communication threads: rank 0: computes wait "
                       r"in B0.0 \(step 2\), .*its thread to rank 1 waits in SA0.1>1 \(step 4\); "
                       r"rank 1: computes wait in F0.0 \(step 2\), its thread from rank 0 waits in "
                       r"RA0.1<0 \(step 0\)"):
        simulate(cycle, costs, async_p2p=True)


def test_threaded_lowering_posts_receives_early_and_beats_blocking_with_comm():
    s = generate(4, 2, 10, "interleaved-overlap")
    costs = Costs(1, 2, Fraction(1, 5), overlap_ratio=Fraction(7, 10))
    threaded = lower(s, costs, async_p2p=True)
    r = validate(threaded, costs, async_p2p=True)
    b = validate(lower(s, costs), costs)
    assert r.makespan < b.makespan
    # Every transfer at the moment its tensor exists: the dataflow ideal, comm included.
    assert r.makespan == simulate(s, costs).makespan == Fraction(617, 10)
    # The blocking order works with threads too (a relaxation of its dependencies).
    assert validate(lower(s, costs), costs, async_p2p=True).makespan <= b.makespan
    # Per rank the lists keep every transfer after its producer, before its consumer.
    assert all(isinstance(a, Comm) or computes(a) for acts in threaded.ranks for a in acts)
    assert Schedule.from_text(threaded.to_text()) == threaded


def test_text_timeline_draws_pairs():
    r = simulate(generate(2, 2, 5, "interleaved-overlap"), Costs(overlap_ratio=Fraction(7, 10)))
    text = text_timeline(r)
    assert "F0.3&B1.0" in text and "F1.1&B1.0" in text


def _run(*argv):
    out, err = io.StringIO(), io.StringIO()
    rc = main(list(argv), out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def test_cli_overlap_shows_pairs_and_predicted_gain():
    rc, out, err = _run("--pp", "4", "--vpp", "2", "--microbatches", "10", "--overlap", "--fb-cost", "0.7")
    assert rc == 0, err
    assert out.startswith("schedule pp=4 vpp=2 microbatches=10 kind=interleaved-overlap\n")
    assert "0: F0.0 F0.1 F0.2 F0.3 F0.4 F0.5 F1.0 F1.1 F1.2 F1.3 F1.4 F1.5 F0.6 F0.7&B1.0 " in out
    assert "overlap: 40 F&B pairs (per rank 7, 9, 11, 13), each costing 0.7 x (F + B)" in out
    assert ("makespan 57.3 with overlap, 69 without (the plain interleaved schedule): predicted "
            "gain 17.0%") in out
    assert "  0        53.7     3.6     6.3%  14 (14)" in out


def test_cli_overlap_at_full_cost_and_async_p2p():
    rc, out, _ = _run("--pp", "2", "--microbatches", "5", "--overlap")
    assert rc == 0
    assert "1: F0.0 F0.1&B0.0 F0.2&B0.1 F0.3&B0.2 F0.4&B0.3 B0.4" in out
    assert "predicted gain 0.0%" in out
    assert "analytic bubble of the plain schedule (pp-1)/(vpp*M+pp-1) = 1/6" in out
    rc, out, _ = _run("--pp", "4", "--vpp", "2", "--microbatches", "10", "--overlap", "--fb-cost",
                      "0.7", "--costs", "1,2,0.2", "--async-p2p", "--lowered")
    assert rc == 0
    assert "the run with communication threads (one per link) finishes" in out
    assert "communication threads): makespan 61.7" in out
    assert "makespan 61.7 with overlap, 71 without" in out


@pytest.mark.parametrize("argv, message", [
    (["--pp", "2", "--microbatches", "4", "--kind", "fthenb", "--overlap"], "--kind fthenb has none"),
    (["--pp", "2", "--microbatches", "4", "--overlap", "--fb-cost", "0"], "--fb-cost '0' is not allowed"),
    (["--pp", "2", "--microbatches", "4", "--kind", "fthenb-overlap"], "--kind = 'fthenb-overlap'"),
])
def test_cli_overlap_argument_errors(argv, message):
    rc, _, err = _run(*argv)
    assert rc == 2 and message in err


def test_cli_loads_a_saved_overlapped_schedule(tmp_path):
    path = str(tmp_path / "s.txt")
    rc, _, _ = _run("--pp", "2", "--vpp", "2", "--microbatches", "5", "--overlap", "--async-p2p",
                    "--save", path)
    assert rc == 0
    rc, out, _ = _run("--load", path, "--async-p2p", "--fb-cost", "0.7")
    assert rc == 0, out
    assert "kind=interleaved-overlap" in out and "overlap: 10 F&B pairs (per rank 4, 6)" in out
