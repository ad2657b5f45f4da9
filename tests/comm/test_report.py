"""The hang report's analysis, on hand-written rank states (pure Python)."""

from paddle_ext.comm.report import analyse, find_divergence
from paddle_ext.comm.trace import CommRecord


def rec(seq, op, what, group=0, shape=(4,), peer=None, done=True, start=0.0):
    r = CommRecord(seq, group, op, (shape,), "float32", peer, what, start, "MainThread")
    r.end = start + 0.1 if done else None
    return r


def state(records, groups, status="running", now=10.0):
    counts = {}
    for r in records:
        counts[str(r.group)] = max(counts.get(str(r.group), 0), r.seq + 1)
    return {"status": status, "error": None, "now": now, "pid": 1,
            "snapshot": {"groups": {str(g): ranks for g, ranks in groups.items()}, "counts": counts,
                         "records": [r.to_dict() for r in records],
                         "in_flight": [r.to_dict() for r in records if r.end is None]}}


def program(skip_at=None, steps=4, stuck=True):
    """all_reduce at line 10 (loss) and line 12 (norm) per step; skip_at: the step whose
    norm this rank skips."""
    out = []
    for step in range(steps):
        out.append(("all_reduce", "train.py:10"))
        if step != skip_at:
            out.append(("all_reduce", "train.py:12"))
    recs = [rec(i, op, what) for i, (op, what) in enumerate(out)]
    if stuck and skip_at is None:
        recs[-1].end = None
    return recs


def test_skipped_all_reduce_names_the_rank_and_the_sequence_number_with_four_ranks():
    groups = {0: [0, 1, 2, 3]}
    states = {r: state(program(skip_at=1 if r == 2 else None), groups) for r in range(4)}
    states[2]["status"] = "finished"
    d = find_divergence(0, [0, 1, 2, 3], states)
    assert (d.seq, d.ranks, d.kind) == (3, [2], "caller")
    text = analyse(states, 4, "rank 0 stuck", 3).text
    assert "ranks diverge at sequence number 3: rank 2 reached it from a different place" in text
    assert "rank 2: has finished its program" in text
    assert "rank 2: 7" in text and "rank 0: 8" in text


def test_two_ranks_tie_is_broken_by_who_issued_fewer():
    groups = {0: [0, 1]}
    states = {0: state(program(), groups), 1: state(program(skip_at=2, stuck=False), groups, "finished")}
    d = find_divergence(0, [0, 1], states)
    assert (d.seq, d.ranks) == (5, [1])


def test_same_program_counts_apart_reports_the_missing_op():
    groups = {5: [0, 1]}
    a = [rec(i, "all_reduce", "x.py:3", group=5) for i in range(3)]
    a[-1].end = None
    b = [rec(i, "all_reduce", "x.py:3", group=5) for i in range(2)]
    states = {0: state(a, groups), 1: state(b, groups)}
    d = find_divergence(5, [0, 1], states)
    assert (d.seq, d.ranks, d.kind) == (2, [1], "missing")
    assert any("never issued #2 (issued 2 on this group)" in line for line in d.lines)


def test_different_shapes_are_a_mismatch_not_just_a_caller_difference():
    groups = {0: [0, 1, 2]}
    recs = [[rec(0, "all_reduce", f"a{r}.py:1", shape=(8,) if r == 1 else (4,), done=False)] for r in range(3)]
    states = {r: state(recs[r], groups) for r in range(3)}
    d = find_divergence(0, [0, 1, 2], states)
    assert (d.seq, d.ranks, d.kind) == (0, [1], "mismatch")


def test_two_receives_facing_each_other_name_both_ranks_and_actions():
    groups = {9: [0, 1]}
    r0 = [rec(0, "send", "SA0.0>1", group=9, peer=1), rec(1, "recv", "RG0.0<1", group=9, peer=1, done=False)]
    r1 = [rec(0, "recv", "RA0.0<0", group=9, peer=0), rec(1, "recv", "RA0.1<0", group=9, peer=0, done=False)]
    states = {0: state(r0, groups), 1: state(r1, groups)}
    d = find_divergence(9, [0, 1], states)
    assert (d.seq, d.ranks, d.kind) == (1, [0, 1], "p2p")
    text = analyse(states, 2, "stuck", 3).text
    assert "both receive: neither sends" in text
    assert "RG0.0<1" in text and "RA0.1<0" in text


def test_matching_histories_report_no_divergence_and_name_silent_ranks():
    groups = {0: [0, 1, 2]}
    recs = [rec(0, "all_reduce", "x.py:1")]
    states = {0: state(recs, groups), 1: state(recs, groups), 2: None}
    report = analyse(states, 3, "rank 2 lost", 4)
    assert not report.divergences and report.unreachable == [2]
    assert "no divergence" in report.text and "rank 2: did not answer" in report.text


def test_only_the_records_every_rank_still_holds_are_compared():
    groups = {0: [0, 1]}
    old = [rec(i, "all_reduce", "x.py:1") for i in range(10, 14)]   # rank 0's ring lost 0..9
    new = [rec(i, "all_reduce", "y.py:1" if i < 5 else "x.py:1") for i in range(14)]
    states = {0: state(old, groups), 1: state(new, groups)}
    assert find_divergence(0, [0, 1], states) is None
