"""Evaluation's schedules (kinds forward / forward-v): forwards only, lowered and validated
by the same layer as training's, so eval_batch runs through the one interpreter."""

from __future__ import annotations

import pytest

from paddle_ext.pipeline.schedule import (
    F,
    RecvAct,
    Schedule,
    ScheduleArgumentError,
    ScheduleError,
    SendAct,
    SendGrad,
    computes,
    generate,
    lower,
    validate,
)

SHAPES = [(pp, vpp, m) for pp in (2, 3, 4) for vpp in (1, 2, 3) for m in (1, 2, 3, 5, 8)
          if vpp == 1 or m >= pp]


@pytest.mark.parametrize("pp, vpp, m", SHAPES)
@pytest.mark.parametrize("async_p2p", [False, True])
def test_forward_kind_is_the_training_forwards_and_lowers_deadlock_free(pp, vpp, m, async_p2p):
    train = generate(pp, vpp, m, "1f1b" if vpp == 1 else "interleaved")
    schedule = generate(pp, vpp, m, "forward")
    assert schedule.forward_only and not train.forward_only
    for acts, train_acts in zip(schedule.ranks, train.ranks):
        # the training schedule's forwards, in its order: lowering then orders the transfers
        assert list(acts) == [p for a in train_acts for p in computes(a) if type(p) is F]
    lowered = lower(schedule, async_p2p=async_p2p)
    validate(lowered, async_p2p=async_p2p)
    for r, acts in enumerate(lowered.ranks):
        assert not any(getattr(a, "is_grad", False) for a in acts), "no gradient moves in evaluation"
        sends = sum(isinstance(a, SendAct) for a in acts)
        receives = sum(isinstance(a, RecvAct) for a in acts)
        stages = [lowered.stage(r, c) for c in range(vpp)]
        assert sends == m * sum(s < pp * vpp - 1 for s in stages)
        assert receives == m * sum(s > 0 for s in stages)


@pytest.mark.parametrize("pp, m", [(2, 1), (2, 3), (3, 4), (4, 7), (4, 8)])
def test_forward_v_hands_over_locally_on_the_last_rank(pp, m):
    schedule = generate(pp, 2, m, "forward-v")
    assert schedule.placement == "v" and schedule.kind == "forward-v"
    lowered = lower(schedule)
    validate(lowered)
    last = lowered.ranks[pp - 1]
    assert not any(isinstance(a, SendAct) and a.chunk == 0 for a in last), "chunk 0 -> 1 is local there"
    for mb in range(m):
        assert last.index(F(0, mb)) < last.index(F(1, mb))


def test_forward_kinds_refuse_what_they_cannot_run():
    with pytest.raises(ScheduleArgumentError, match="vpp = 3 is not allowed"):
        generate(2, 3, 4, "forward-v")
    with pytest.raises(ScheduleArgumentError, match="kind = 'forward-overlap' is not allowed"):
        generate(2, 1, 4, "forward-overlap")
    with pytest.raises(ScheduleArgumentError, match="microbatches = 1 is not allowed"):
        generate(2, 2, 1, "forward")


def test_a_gradient_transfer_in_a_forward_only_schedule_is_refused():
    lowered = lower(generate(2, 1, 2, "forward"))
    ranks = [list(r) for r in lowered.ranks]
    ranks[1].append(SendGrad(0, 0, 0))
    bad = Schedule(2, 1, 2, ranks, "forward")
    with pytest.raises(ScheduleError, match="not needed: a forward-only schedule has no backward"):
        validate(bad)
