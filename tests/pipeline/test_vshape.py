"""V placement (rank r holds stages r and 2*pp-1-r) and its schedules, zb-v and dualpipev:
the IR, lowering with the last rank's local hand-over, validation, the simulator's
closed forms, and the generators' properties."""

from __future__ import annotations

from fractions import Fraction

import pytest

from paddle_ext.pipeline.schedule import (
    FB,
    B,
    Comm,
    Costs,
    F,
    I,
    Schedule,
    ScheduleArgumentError,
    ScheduleError,
    SendAct,
    W,
    computes,
    generate,
    locate,
    lower,
    simulate,
    stage_of,
    validate,
)
from paddle_ext.pipeline.schedule.analytic import (
    peak_held_bound,
    peak_in_flight_bound,
    peak_pending_w_bound,
    v_idle,
)
from paddle_ext.pipeline.schedule.cli import main

V_KINDS = ("zb-v", "dualpipev", "dualpipev-overlap")


def _counts(pp):
    return sorted({1, 2, pp, pp + 1, 2 * pp - 1, 2 * pp, 2 * pp + 1, 3 * pp})


GRID = [(pp, m, k) for pp in range(2, 7) for m in _counts(pp) for k in V_KINDS]
GRID += [(8, 16, k) for k in V_KINDS] + [(8, 3, k) for k in V_KINDS]


def test_v_placement_maps_stages_down_and_back_up():
    pp = 4
    assert [stage_of(pp, r, 0, "v") for r in range(pp)] == [0, 1, 2, 3]
    assert [stage_of(pp, r, 1, "v") for r in range(pp)] == [7, 6, 5, 4]
    assert all(locate(pp, stage_of(pp, r, c, "v"), "v") == (r, c) for r in range(pp) for c in (0, 1))
    assert stage_of(pp, 1, 1) == 5 and locate(pp, 5) == (1, 1)  # interleaved stays the default


def test_text_carries_the_placement_and_old_texts_stay_interleaved():
    s = generate(2, 2, 3, "zb-v")
    assert s.placement == "v"
    assert s.to_text().splitlines()[0] == "schedule pp=2 vpp=2 microbatches=3 kind=zb-v placement=v"
    assert Schedule.from_text(s.to_text()) == s
    low = lower(s)
    assert Schedule.from_text(low.to_text()) == low
    plain = generate(2, 2, 4, "interleaved")
    assert "placement" not in plain.to_text() and Schedule.from_text(plain.to_text()).placement == "interleaved"
    with pytest.raises(ScheduleError, match="placement = 'w' is not allowed: must be one of interleaved, v"):
        Schedule.from_text("schedule pp=2 vpp=2 microbatches=1 kind=x placement=w\n0:\n1:\n")
    with pytest.raises(ScheduleError, match="vpp = 3 is not allowed with placement v"):
        Schedule(2, 3, 1, ((), ()), "x", "v")


# DualPipeV pp=4, 10 micro-batches: the eight phases of DeepSeek's dualpipev.py.
PINNED_DUALPIPEV_4_10 = """\
schedule pp=4 vpp=2 microbatches=10 kind=dualpipev placement=v
0: F0.0 F0.1 F0.2 F0.3 F0.4 F0.5 F0.6 F1.0 I1.0 W1.0 F1.1 I1.1 W1.1 F1.2 I1.2 W1.2 F1.3 F0.7 B1.3 F1.4 B0.0 F0.8 B1.4 F1.5 B0.1 F0.9 B1.5 F1.6 B0.2 B1.6 F1.7 B0.3 B1.7 F1.8 B0.4 B1.8 F1.9 B0.5 B1.9 I0.6 W0.6 I0.7 W0.7 I0.8 W0.8 I0.9 W0.9
1: F0.0 F0.1 F0.2 F0.3 F0.4 F1.0 F0.5 F1.1 I1.0 W1.0 F1.2 I1.1 W1.1 F1.3 F0.6 B1.2 F1.4 B0.0 F0.7 B1.3 F1.5 B0.1 F0.8 B1.4 F1.6 B0.2 F0.9 B1.5 F1.7 B0.3 B1.6 F1.8 B0.4 B1.7 F1.9 B0.5 B1.8 B0.6 I1.9 I0.7 W1.9 I0.8 W0.7 I0.9 W0.8 W0.9
2: F0.0 F0.1 F0.2 F1.0 F0.3 F1.1 F0.4 F1.2 I1.0 W1.0 F1.3 F0.5 B1.1 F1.4 B0.0 F0.6 B1.2 F1.5 B0.1 F0.7 B1.3 F1.6 B0.2 F0.8 B1.4 F1.7 B0.3 F0.9 B1.5 F1.8 B0.4 B1.6 F1.9 B0.5 B1.7 B0.6 B1.8 I0.7 I1.9 I0.8 W0.7 I0.9 W1.9 W0.8 W0.9
3: F0.0 F1.0 F0.1 F1.1 F0.2 F1.2 F0.3 F1.3 F0.4 B1.0 F1.4 B0.0 F0.5 B1.1 F1.5 B0.1 F0.6 B1.2 F1.6 B0.2 F0.7 B1.3 F1.7 B0.3 F0.8 B1.4 F1.8 B0.4 F0.9 B1.5 F1.9 B0.5 B1.6 B0.6 B1.7 B0.7 I1.8 I0.8 I1.9 I0.9 W1.8 W0.8 W1.9 W0.9
"""


def test_pinned_dualpipev():
    s = generate(4, 2, 10, "dualpipev")
    assert s.to_text() == PINNED_DUALPIPEV_4_10
    assert Schedule.from_text(PINNED_DUALPIPEV_4_10) == s
    validate(lower(s))


@pytest.mark.parametrize("pp, m, kind", GRID, ids=[f"pp{p}-m{m}-{k}" for p, m, k in GRID])
def test_v_schedules_validate_lower_and_keep_their_bounds(pp, m, kind):
    s = generate(pp, 2, m, kind)
    assert s.placement == "v" and s.kind == kind
    low = lower(s)
    validate(s)  # dataflow
    validate(low)  # blocking send/recv: no deadlock
    validate(lower(s, async_p2p=True), async_p2p=True)
    for acts in s.ranks:
        parts = [p for a in acts for p in computes(a)]
        for c in (0, 1):
            # one F per (chunk, mb), and one B or one I and one W; each chunk runs its
            # forwards, and its gradient accumulations, in micro-batch order
            assert [p.mb for p in parts if type(p) is F and p.chunk == c] == list(range(m))
            assert [p.mb for p in parts if type(p) in (B, I) and p.chunk == c] == list(range(m))
            grads = [p.mb for p in parts if type(p) in (B, W) and p.chunk == c]
            assert sorted(grads) == list(range(m))
        if kind == "zb-v":
            assert not any(type(p) is B for p in parts)  # every backward split
        if kind != "dualpipev-overlap":
            assert not any(isinstance(a, FB) for a in acts)
    # the last rank hands chunk 0's output to chunk 1 in place: no transfer between them
    last = low.ranks[pp - 1]
    assert not [a for a in last if isinstance(a, Comm) and a.peer == pp - 1]
    assert sum(isinstance(a, Comm) and a.is_send for a in last) == 2 * m  # SA of chunk 1, SG of chunk 0
    # memory: 1F1B's on rank 0 (pp whole stages = 2*pp half stages) for zb-v, one more for dualpipev
    res = simulate(low)
    ideal = simulate(s).makespan  # blocking transfers cost nothing for zb-v and the F&B form,
    assert res.makespan - ideal <= (0 if kind != "dualpipev" else pp - 1)  # up to pp-1 for F then B
    bounds = [peak_in_flight_bound(pp, 2, m, kind, r) for r in range(pp)]
    assert all(res.peak_in_flight[r] <= bounds[r] for r in range(pp)), (res.peak_in_flight, bounds)
    pending = [peak_pending_w_bound(pp, 2, m, kind, r) for r in range(pp)]
    held = [peak_held_bound(pp, 2, m, kind, r) for r in range(pp)]
    assert all(res.peak_pending_w[r] <= pending[r] and res.peak_held[r] <= held[r] for r in range(pp))
    if m >= 2 * pp:
        assert list(res.peak_in_flight) == bounds == held == list(res.peak_held)
        assert list(res.peak_pending_w) == pending == [2 * r + 1 if kind == "zb-v" else r + 1 for r in range(pp)]
        assert bounds == [2 * pp if kind == "zb-v" else 2 * pp + 1] * pp


@pytest.mark.parametrize("pp", [2, 3, 4, 6])
def test_closed_forms_of_the_v_kinds(pp):
    """Unit costs F = I = W = 1 (B = 2), full pipe, dataflow: zb-v idles (pp-1)*F on every
    rank, the bound the last rank cannot beat; dualpipev's busiest-waiting rank idles
    DualPipe's (PP/2-1)(F&B + B - 3W), PP/2 = pp, for an F&B costing from B to F + B."""
    for m in (2 * pp, 3 * pp):
        zb = simulate(generate(pp, 2, m, "zb-v"))
        assert set(zb.idle) == {pp - 1} == {v_idle(pp, "zb-v")}
        assert zb.makespan == 2 * m * 3 + pp - 1
        assert max(simulate(generate(pp, 2, m, "dualpipev")).idle) == pp - 1 == v_idle(pp, "dualpipev")
        over = generate(pp, 2, m, "dualpipev-overlap")
        for costs, fb in ((Costs(), 3), (Costs(overlap=2), 2), (Costs(overlap=Fraction(5, 2)), Fraction(5, 2)),
                          (Costs(overlap_ratio=Fraction(5, 6)), Fraction(5, 2))):
            assert max(simulate(over, costs).idle) == (pp - 1) * (fb + 2 - 3) == v_idle(pp, over.kind, costs)
    assert v_idle(pp, "zb-v", Costs(forward=2)) is None


def test_dualpipev_overlap_pairs_are_the_plain_schedule_paired():
    for pp, m in ((2, 4), (4, 10), (5, 7)):
        plain, over = generate(pp, 2, m, "dualpipev"), generate(pp, 2, m, "dualpipev-overlap")
        assert [[p for a in acts for p in computes(a)] for acts in over.ranks] == [list(r) for r in plain.ranks]
        for r, acts in enumerate(over.ranks):
            pairs = [a for a in acts if isinstance(a, FB)]
            # phases 4 and 5: 2*(M - 2pp + r + 1) + (pp - r - 1) pairs, the last rank's first kept apart
            expect = 2 * (m - 2 * pp + r + 1) + (pp - r - 1) - (r == pp - 1) if m >= 2 * pp else None
            if expect is not None:
                assert len(pairs) == expect
            assert all(p.f.chunk != p.b.chunk for p in pairs)


def test_validation_names_a_broken_local_hand_over():
    s = generate(2, 2, 2, "zb-v")
    last = list(s.ranks[1])
    i, j = last.index(F(0, 0)), last.index(F(1, 0))
    last[i], last[j] = last[j], last[i]
    with pytest.raises(ScheduleError, match=r"F1\.0 on rank 1 \(step 0\) needs the activation that F0\.0 .* "
                       r"hands over locally \(placement v: stages 1 and 2 share rank 1\)"):
        validate(s.with_ranks([s.ranks[0], last]))
    low = lower(generate(2, 2, 1, "zb-v"))
    bad = list(low.ranks[1])
    bad.insert(bad.index(F(0, 0)) + 1, SendAct(0, 0, 0))
    with pytest.raises(ScheduleError, match=r"SA0\.0>0 on rank 1 is not needed: stages 1 and 2 both live on "
                       "this rank"):
        validate(low.with_ranks([low.ranks[0], bad]))


@pytest.mark.parametrize("args, name, text", [
    ((2, 1, 4, "zb-v"), "vpp", "zb-v needs 2"),
    ((2, 3, 4, "dualpipev"), "vpp", "dualpipev needs 2"),
    ((2, 2, 0, "dualpipev"), "microbatches", "must be an integer >= 1"),
    ((2, 2, 4, "zb-v-overlap"), "kind", "zero-bubble kinds have no -overlap form"),
])
def test_v_argument_errors(args, name, text):
    with pytest.raises(ScheduleArgumentError, match=text) as e:
        generate(*args)
    assert e.value.name == name


def test_v_kind_spellings_and_small_counts():
    assert generate(3, 2, 1, "ZBV").kind == "zb-v"
    assert generate(3, 2, 2, "DualPipe").kind == "dualpipev"
    s = generate(4, 2, 1, "dualpipev")  # one micro-batch: down the V and back, nothing else
    # ranks 0-2 keep one backward's split (phase 3's I1.0 W1.0), the last runs both whole
    assert [len(acts) for acts in s.ranks] == [5, 5, 5, 4]
    assert s.ranks[3] == (F(0, 0), F(1, 0), B(1, 0), B(0, 0))


def test_cli_defaults_to_two_chunks_for_v_kinds():
    import io
    out, err = io.StringIO(), io.StringIO()
    assert main(["--pp", "4", "--microbatches", "8", "--kind", "zb-v"], out=out, err=err) == 0, err.getvalue()
    text = out.getvalue()
    assert text.startswith("schedule pp=4 vpp=2 microbatches=8 kind=zb-v placement=v\n")
    assert "blocking send/recv): makespan 51" in text
    assert "analytic idle of the most idle rank = 3 in the dataflow ideal" in text
