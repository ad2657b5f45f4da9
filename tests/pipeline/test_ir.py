from __future__ import annotations

import pytest

from paddle_ext.pipeline.schedule import (
    FB,
    B,
    F,
    GradSync,
    I,
    RecvAct,
    RecvGrad,
    Schedule,
    ScheduleError,
    SendAct,
    SendGrad,
    W,
    computes,
    locate,
    parse_action,
    stage_of,
)


@pytest.mark.parametrize("action, text", [
    (F(1, 3), "F1.3"),
    (B(0, 12), "B0.12"),
    (I(0, 12), "I0.12"),
    (W(3, 0), "W3.0"),
    (FB(F(0, 3), B(1, 1)), "F0.3&B1.1"),
    (SendAct(0, 3, 1), "SA0.3>1"),
    (RecvAct(2, 3, 3), "RA2.3<3"),
    (SendGrad(1, 0, 0), "SG1.0>0"),
    (RecvGrad(0, 7, 2), "RG0.7<2"),
    (GradSync(3), "GS3"),
])
def test_action_text_round_trip(action, text):
    assert str(action) == text
    assert parse_action(text) == action
    assert type(parse_action(text)) is type(action)


def test_send_and_recv_are_different_actions():
    assert SendAct(0, 1, 1) != RecvAct(0, 1, 1)
    assert SendAct(0, 1, 1) != SendGrad(0, 1, 1)
    assert len({SendAct(0, 1, 1), RecvAct(0, 1, 1), SendAct(0, 1, 1)}) == 2


@pytest.mark.parametrize("bad", ["", "F1", "F1.", "X1.2", "SA0.3<1", "RA0.3>1", "F0.1&F0.2",
                                 "B0.1&F0.2", "F-1.2", "GS", "F1.2 B1.2", "I1",
                                 "W0.1>1", "F0.1&I0.2", "X0.1"])
def test_parse_rejects_bad_tokens(bad):
    with pytest.raises(ScheduleError, match="cannot parse action"):
        parse_action(bad)


def test_layout_is_interleaved():
    # pp=4: rank 1 holds stages 1, 5, 9.
    assert [stage_of(4, 1, c) for c in range(3)] == [1, 5, 9]
    assert locate(4, 9) == (1, 2)
    assert all(locate(4, stage_of(4, r, c)) == (r, c) for r in range(4) for c in range(3))


def test_schedule_text_round_trip_with_every_action_kind():
    s = Schedule(2, 2, 4, [
        [F(0, 0), SendAct(0, 0, 1), FB(F(1, 1), B(0, 2)), I(0, 1), W(0, 1), GradSync(0)],
        [RecvAct(0, 0, 0), RecvGrad(1, 3, 0), SendGrad(1, 2, 0)],
    ], kind="hand-made")
    text = s.to_text()
    assert text.splitlines()[0] == "schedule pp=2 vpp=2 microbatches=4 kind=hand-made"
    assert Schedule.from_text(text) == s
    assert s.lowered and not s.compute_only().lowered
    assert s.compute_only().ranks == ((F(0, 0), FB(F(1, 1), B(0, 2)), I(0, 1), W(0, 1)), ())
    assert computes(I(0, 1)) == (I(0, 1),) and computes(W(0, 1)) == (W(0, 1),)
    assert I(0, 1) != W(0, 1) != B(0, 1)


def test_from_text_ignores_comments_and_blank_lines():
    text = "# saved by hand\nschedule pp=2 vpp=1 microbatches=2 kind=x\n\n1: F0.0 # rank one\n0:\n"
    s = Schedule.from_text(text)
    assert s.ranks == ((), (F(0, 0),))


@pytest.mark.parametrize("text, message", [
    ("0: F0.0", "must start with 'schedule"),
    ("schedule pp=2 vpp=1\n0:\n1:", "bad schedule header"),
    ("schedule pp=2 vpp=1 microbatches=2\n0: F0.0", r"no line for rank\(s\) \[1\]"),
    ("schedule pp=2 vpp=1 microbatches=2\n0:\n0:\n1:", "rank 0 appears twice"),
    ("schedule pp=2 vpp=1 microbatches=2\n0:\n2:\n1:", "bad rank line"),
    ("schedule pp=2 vpp=1 microbatches=2\n0: F0.0 Q\n1:", "cannot parse action 'Q'"),
])
def test_from_text_errors(text, message):
    with pytest.raises(ScheduleError, match=message):
        Schedule.from_text(text)


def test_schedule_checks_rank_count_and_kind():
    with pytest.raises(ScheduleError, match="1 rank lists for pp=2"):
        Schedule(2, 1, 2, [[]])
    with pytest.raises(ScheduleError, match="must be one word"):
        Schedule(2, 1, 2, [[], []], kind="two words")
