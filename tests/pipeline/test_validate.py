"""The validator on hand-broken schedules: each error names the fault in a sentence and
shows the rank x step grid with the offending action marked `[..]!`."""

from __future__ import annotations

import re

import pytest

from paddle_ext.pipeline.schedule import (
    FB,
    B,
    F,
    GradSync,
    RecvAct,
    RecvGrad,
    Schedule,
    ScheduleError,
    SendAct,
    generate,
    lower,
    simulate,
    validate,
)


def _edit(schedule: Schedule, rank: int, fn) -> Schedule:
    ranks = [list(r) for r in schedule.ranks]
    ranks[rank] = fn(ranks[rank])
    return schedule.with_ranks(ranks)


def _error(schedule: Schedule) -> ScheduleError:
    with pytest.raises(ScheduleError) as info:
        validate(schedule)
    return info.value


def _marked_row(err: ScheduleError, rank: int) -> str:
    rows = [ln for ln in err.grid.splitlines() if ln.startswith(f"rank {rank} ")]
    assert rows, err.grid
    return rows[0]


def test_missing_backward_is_marked_on_its_forward():
    s = _edit(generate(2, 2, 5), 0, lambda acts: [a for a in acts if a != B(1, 3)])
    err = _error(s)
    assert err.reason == "F1.3 on rank 0 (step 11) has no backward: B1.3 is missing"
    assert "[F1.3]!" in _marked_row(err, 0)
    assert (err.rank, err.index) == (0, 11)
    assert str(err).startswith(err.reason + "\n" + "step")


def test_backward_before_forward():
    def swap(acts):
        i, j = acts.index(F(0, 2)), acts.index(B(0, 2))
        acts[i], acts[j] = acts[j], acts[i]
        return acts

    err = _error(_edit(generate(3, 1, 4, "1f1b"), 1, swap))
    assert re.match(r"B0\.2 on rank 1 \(step \d+\) runs before its forward: its forward F0\.2 "
                    r"comes later", err.reason)
    assert "[B0.2]!" in _marked_row(err, 1) and "[F0.2]!" in _marked_row(err, 1)


def test_duplicate_and_out_of_range_actions():
    s = generate(2, 1, 2, "1f1b")
    err = _error(_edit(s, 1, lambda acts: acts + [B(0, 1)]))
    assert "B0.1 appears twice on rank 1" in err.reason
    err = _error(_edit(s, 0, lambda acts: acts + [F(0, 2)]))
    assert "F0.2 on rank 0 is out of range: chunks are 0..0 and micro-batches 0..1" in err.reason
    assert "[F0.2]!" in str(err)


def test_missing_forward_everywhere():
    s = _edit(generate(2, 1, 2, "1f1b"), 1, lambda acts: [a for a in acts if a.mb != 1])
    assert "rank 1 never runs F0.1 (stage 1, micro-batch 1)" in _error(s).reason


def test_unmatched_send_is_reported():
    lowered = lower(generate(2, 1, 3, "1f1b"))
    # Drop rank 1's receive of micro-batch 2: rank 0's SA0.2>1 is left alone.
    broken = _edit(lowered, 1, lambda acts: [a for a in acts if a != RecvAct(0, 2, 0)])
    err = _error(broken)
    assert "F0.2 on rank 1" in err.reason and "has no RA0.2" in err.reason
    assert "[F0.2]!" in _marked_row(err, 1)
    # The channel matcher on its own (what simulate() runs) names the lonely send.
    with pytest.raises(ScheduleError) as info:
        simulate(broken)
    assert info.value.reason == "SA0.2>1 on rank 0 has no matching receive on rank 1"
    assert "[SA0.2>1]!" in _marked_row(info.value, 0)


def test_receives_in_the_wrong_order_get_the_wrong_tensor():
    lowered = lower(generate(2, 1, 3, "1f1b"))
    # Rank 1: post RA0.1 before RA0.0 (both still before their forwards).
    def swap(acts):
        acts.remove(RecvAct(0, 1, 0))
        acts.insert(0, RecvAct(0, 1, 0))
        return acts

    err = _error(_edit(lowered, 1, swap))
    assert err.reason.startswith("send #0 from rank 0 to rank 1 is SA0.0>1 but rank 1's "
                                 "receive #0 from rank 0 is RA0.1<0")
    assert "[SA0.0>1]!" in _marked_row(err, 0) and "[RA0.1<0]!" in _marked_row(err, 1)


def test_deadlocking_receive_order():
    # pp=2, one micro-batch: rank 0 waits for the gradient before it sends the
    # activation the gradient depends on.
    lowered = lower(generate(2, 1, 2, "1f1b"))
    assert lowered.ranks[0][:4] == (F(0, 0), SendAct(0, 0, 1), F(0, 1), SendAct(0, 1, 1))
    r0 = list(lowered.ranks[0])
    rg = RecvGrad(0, 0, 1)
    r0.remove(rg)
    r0.insert(1, rg)
    err = _error(lowered.with_ranks([r0, lowered.ranks[1]]))
    assert err.reason == ("deadlock: rank 0 waits in RG0.0<1 (step 1) for rank 1, rank 1 waits "
                          "in RA0.0<0 (step 0) for rank 0 (a cycle: no rank can go on).")
    assert "[RG0.0<1]!" in _marked_row(err, 0) and "[RA0.0<0]!" in _marked_row(err, 1)


def test_deadlocking_send_order():
    # Both ranks send first (what hangs on gloo): rank 0 sends SA0.1 before it receives
    # the wrap-around RA1.0, while rank 1 is blocked sending exactly that.
    lowered = lower(generate(2, 2, 5))
    r0 = list(lowered.ranks[0])
    assert r0[:5] == [F(0, 0), SendAct(0, 0, 1), F(0, 1), RecvAct(1, 0, 1), SendAct(0, 1, 1)]
    r0[3], r0[4] = r0[4], r0[3]
    err = _error(lowered.with_ranks([r0, lowered.ranks[1]]))
    assert err.reason == ("deadlock: rank 0 waits in SA0.1>1 (step 3) for rank 1, rank 1 waits "
                          "in SA0.0>0 (step 2) for rank 0 (a cycle: no rank can go on).")
    assert "[SA0.1>1]!" in _marked_row(err, 0) and "[SA0.0>0]!" in _marked_row(err, 1)


def test_deadlock_in_a_ring_of_four():
    lowered = lower(generate(4, 2, 4))
    ranks = [list(r) for r in lowered.ranks]
    # Rank 0 insists on receiving chunk 1's input before sending anything.
    ra = RecvAct(1, 0, 3)
    ranks[0].remove(ra)
    ranks[0].insert(0, ra)
    err = _error(lowered.with_ranks(ranks))
    assert err.reason.startswith("deadlock: rank 0 waits in RA1.0<3 (step 0) for rank 3")
    assert "[RA1.0<3]!" in _marked_row(err, 0)


def test_compute_only_schedule_that_cannot_finish():
    # Rank 0 wants chunk 1 of micro-batch 0 before rank 1 could produce its chunk 0 output
    # ... and rank 1 waits for rank 0's backward first: a dataflow cycle.
    s = Schedule(2, 1, 2, [
        [F(0, 0), B(0, 0), F(0, 1), B(0, 1)],
        [F(0, 1), F(0, 0), B(0, 0), B(0, 1)],
    ])
    err = _error(s)
    assert err.reason.startswith("deadlock: rank 0 waits in B0.0 (step 1) for rank 1, rank 1 "
                                 "waits in F0.1 (step 0) for rank 0")


def test_wrong_peer_and_unneeded_comm():
    lowered = lower(generate(3, 1, 3, "1f1b"))
    wrong = _edit(lowered, 0, lambda acts: [SendAct(a.chunk, a.mb, 2) if a == SendAct(0, 1, 1)
                                            else a for a in acts])
    err = _error(wrong)
    assert "SA0.1>2 on rank 0 talks to rank 2, but the tensor goes to stage 1, which lives on " \
           "rank 1" in err.reason
    extra = _edit(lowered, 2, lambda acts: acts + [SendAct(0, 0, 0)])
    assert "SA0.0>0 on rank 2 is not needed: stage 2 is the last stage" in _error(extra).reason


def test_send_before_its_producer():
    lowered = lower(generate(2, 1, 2, "1f1b"))
    def early(acts):
        acts.remove(SendAct(0, 1, 1))
        acts.insert(0, SendAct(0, 1, 1))
        return acts
    err = _error(_edit(lowered, 0, early))
    assert re.match(r"SA0\.1>1 on rank 0 \(step 0\) must come after F0\.1 \(step \d\), which "
                    r"produces its tensor", err.reason)


def test_grad_sync_points():
    s = generate(2, 2, 4)
    lowered = lower(s, grad_sync=True)
    validate(lowered)
    for acts in lowered.ranks:
        assert [a for a in acts if isinstance(a, GradSync)] == [GradSync(1), GradSync(0)]
        last_b0 = max(i for i, a in enumerate(acts) if isinstance(a, B) and a.chunk == 0)
        assert acts[last_b0 + 1] == GradSync(0)
    early = _edit(lowered, 0, lambda acts: [GradSync(0)] + [a for a in acts if a != GradSync(0)])
    assert "GS0 on rank 0 (step 0) comes before chunk 0's last backward" in _error(early).reason


def test_overlapped_fb_actions_validate_and_lower():
    # A 1F1B steady state written with FB pairs: F(m+1) overlapped with B(m) on the last
    # rank (the shape a later overlap scheduler produces).
    s = Schedule(2, 1, 3, [
        [F(0, 0), F(0, 1), B(0, 0), F(0, 2), B(0, 1), B(0, 2)],
        [F(0, 0), FB(F(0, 1), B(0, 0)), FB(F(0, 2), B(0, 1)), B(0, 2)],
    ])
    validate(s)
    lowered = lower(s)
    result = validate(lowered)
    assert "F0.1&B0.0" in lowered.to_text()
    assert Schedule.from_text(lowered.to_text()) == lowered
    # Its F's activation and its B's are alive together.
    assert result.peak_in_flight == (2, 2)
    same = s.with_ranks([s.ranks[0], [F(0, 0), FB(F(0, 1), B(0, 1)), F(0, 2), B(0, 0),
                                       B(0, 2)]])
    assert "pairs the forward and the backward of the same micro-batch" in _error(same).reason


def test_grid_of_a_long_schedule_shows_the_marked_region():
    s = generate(4, 4, 16)
    broken = _edit(s, 2, lambda acts: [a for a in acts if a != B(3, 9)])
    err = _error(broken)
    assert "..." in err.grid and "[F3.9]!" in err.grid
    assert max(len(ln) for ln in err.grid.splitlines()) < 200


def test_lower_refuses_a_lowered_schedule():
    lowered = lower(generate(2, 1, 2))
    with pytest.raises(ScheduleError, match="already lowered"):
        lower(lowered)
