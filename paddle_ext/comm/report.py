"""The hang report: where the ranks' communication histories part ways. Pure Python.

Input: what the watchdog gathered from every reachable rank (comm/watchdog.py), each
rank's tracer snapshot (trace.CommTracer.snapshot) plus its status. Output: a text
that names, per group involved, the first sequence number at which the ranks of the
group did not issue the same operation, the ranks that are out of line, and what
each rank is waiting in.

How operations are compared at one sequence number of one group:
- collectives: the same op, dtype and shapes on every rank; a different caller
  (file:line) is reported too, as the likely place where the programs parted, since
  the op itself can match by coincidence (two all-reduces of one shape);
- p2p (send/recv): a send to rank b at seq s must meet b's receive from this rank
  at seq s, with the same shapes (gloo matches a send and a recv by that number);
- an op one rank issued and another never did.
The rank out of line is the minority at that seq; with two ranks, the one that
issued fewer operations on the group (it skipped one), else both are named.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

from paddle_ext.comm.trace import CommRecord

__all__ = ["Divergence", "Report", "analyse", "find_divergence"]

_P2P = ("send", "recv", "send_partial", "recv_partial")


@dataclass
class Divergence:
    group: int
    seq: int
    ranks: list[int]          # the ranks out of line
    lines: list[str] = field(default_factory=list)
    kind: str = ""            # "missing", "mismatch", "caller", "p2p"
    detail: str = ""


@dataclass
class Report:
    text: str
    divergences: list[Divergence]
    unreachable: list[int]


def _is_p2p(op: str) -> bool:
    return op in _P2P


def _records(state: dict, gid: int) -> dict[int, CommRecord]:
    out = {}
    for d in state["snapshot"]["records"]:
        if d["group"] == gid and d["seq"] >= 0:
            out[d["seq"]] = CommRecord.from_dict(d)
    return out


def _issued(state: dict, gid: int) -> int:
    return int(state["snapshot"]["counts"].get(str(gid), 0))


def _now_doing(rank: int, state: Optional[dict], note: str = "") -> str:
    if state is None:
        return note or "did not answer"
    flying = [CommRecord.from_dict(d) for d in state["snapshot"]["in_flight"]]
    if flying:
        rec = min(flying, key=lambda r: r.start)
        return f"waits in {rec.describe()} on group {rec.group} for {state['now'] - rec.start:.1f} s"
    status = state.get("status", "running")
    if status == "failed":
        return f"failed: {state.get('error')}"
    if status == "finished":
        return "has finished its program (it waits at exit)"
    return "is not in any communication (computing, or blocked elsewhere)"


def _complement(a: CommRecord, b: CommRecord, rank_a: int, rank_b: int) -> bool:
    sends = {a.op.startswith("send"), b.op.startswith("send")}
    return (sends == {True, False} and a.peer == rank_b and b.peer == rank_a
            and a.shapes == b.shapes and a.dtype == b.dtype)


def find_divergence(gid: int, members: list[int], states: dict[int, Optional[dict]]) -> Optional[Divergence]:
    """The first sequence number of group `gid` at which its reachable members differ."""
    alive = [r for r in members if states.get(r) is not None]
    if len(alive) < 2:
        return None
    recs = {r: _records(states[r], gid) for r in alive}
    issued = {r: _issued(states[r], gid) for r in alive}
    # Compare only where every rank still holds its records (the rings are bounded).
    lo = max((min(recs[r]) if recs[r] else issued[r]) for r in alive)
    caller_split: Optional[Divergence] = None
    for s in range(lo, max(issued.values())):
        have = [r for r in alive if issued[r] > s]
        lacking = [r for r in alive if issued[r] <= s]
        if any(s not in recs[r] for r in have):
            continue
        if lacking:
            found = Divergence(gid, s, lacking, kind="missing")
            found.lines = [f"rank {r}: {recs[r][s].describe()}" for r in have]
            found.lines += [f"rank {r}: never issued #{s} (issued {issued[r]} on this group); it "
                            f"{_now_doing(r, states[r])}" for r in lacking]
            return caller_split or found
        at = {r: recs[r][s] for r in have}
        if any(_is_p2p(rec.op) for rec in at.values()):
            bad = _p2p_mismatch(at)
            if bad:
                sends = {rec.op.startswith("send") for rec in at.values()}
                detail = ("both receive: neither sends" if sends == {False} else
                          "both send: neither receives" if sends == {True} else
                          "a send must meet a receive from its peer with the same shapes")
                found = Divergence(gid, s, bad, kind="p2p", detail=detail)
                found.lines = [f"rank {r}: {at[r].describe()}" for r in sorted(at)]
                return found
            continue
        strict = Counter((rec.op, rec.dtype, rec.shapes) for rec in at.values())
        if len(strict) > 1:
            found = Divergence(gid, s, _minority(at, lambda rec: (rec.op, rec.dtype, rec.shapes), issued),
                               kind="mismatch")
            found.lines = [f"rank {r}: {at[r].describe()}" for r in sorted(at)]
            return caller_split or found
        if caller_split is None and len({rec.what for rec in at.values()}) > 1:
            caller_split = Divergence(gid, s, _minority(at, lambda rec: rec.what, issued), kind="caller")
            caller_split.lines = [f"rank {r}: {at[r].describe()}" for r in sorted(at)]
    return caller_split


def _minority(at: dict[int, CommRecord], key: Any, issued: dict[int, int]) -> list[int]:
    votes = Counter(key(rec) for rec in at.values())
    ranked = votes.most_common()
    if len(ranked) > 1 and ranked[0][1] > ranked[1][1]:
        return sorted(r for r, rec in at.items() if key(rec) != ranked[0][0])
    fewest = min(issued[r] for r in at)  # a tie: the rank that skipped issued fewer
    behind = sorted(r for r in at if issued[r] == fewest)
    return behind if len(behind) < len(at) else sorted(at)


def _p2p_mismatch(at: dict[int, CommRecord]) -> list[int]:
    """Ranks whose send/recv at this seq meets no complementary op of its peer."""
    bad = set()
    for r, rec in at.items():
        if not _is_p2p(rec.op):
            bad.add(r)
            continue
        other = at.get(rec.peer)
        if other is None or not _complement(rec, other, r, rec.peer):
            bad.update({r} | ({rec.peer} if rec.peer in at else set()))
    return sorted(bad)


def _explain(d: Divergence) -> str:
    names = " and ".join(f"rank {r}" for r in d.ranks)
    if d.kind == "missing":
        return f"{names} never issued it"
    if d.kind == "p2p":
        return f"{names}: a send/recv pair that does not match ({d.detail})"
    if d.kind == "caller":
        return f"{names} reached it from a different place in the program"
    return f"{names} issued a different operation"


def _groups(states: dict[int, Optional[dict]]) -> dict[int, list[int]]:
    """gid -> member ranks as the ranks' group maps describe them; a group no rank
    described (made outside paddle.distributed) gets the ranks that used it. Negative
    gids are numbered per rank (unknown process groups) and not comparable."""
    live = {r: s["snapshot"] for r, s in states.items() if s is not None}
    groups: dict[int, list[int]] = {}
    for snap in live.values():
        for g, ranks in snap["groups"].items():
            groups.setdefault(int(g), list(ranks))
    users: dict[int, list[int]] = {}
    for r, snap in sorted(live.items()):
        for g in map(int, snap["counts"]):
            if g >= 0 and g not in groups:
                users.setdefault(g, []).append(r)
    return {**groups, **users}


def analyse(states: dict[int, Optional[dict]], world_size: int, reason: str, exit_code: int,
            notes: Optional[dict[int, str]] = None, hosts: Optional[dict[int, str]] = None) -> Report:
    """The report for one incident. `states[r]` is None for a rank that did not answer;
    `notes[r]` says why, where that is known (a lost rank); `hosts[r]`: where rank r
    runs (its address as the launcher gave it), listed on a line of its own."""
    notes = notes or {}
    groups = _groups(states)
    lines = [f"paddle_ext comm watchdog: {reason}", "what each rank is doing:"]
    unreachable = [r for r in range(world_size) if states.get(r) is None and r not in notes]
    for r in range(world_size):
        lines.append(f"  rank {r}: {_now_doing(r, states.get(r), notes.get(r, ''))}")
    if hosts:
        lines.append("where the ranks run: " + "; ".join(f"rank {r} on {hosts[r]}" for r in sorted(hosts)))
    involved = set()
    for state in states.values():
        if state is not None:
            involved |= {d["group"] for d in state["snapshot"]["in_flight"]}
            involved |= {int(g) for g in state["snapshot"]["counts"]}
    divergences = []
    for gid in sorted(g for g in involved if g in groups):
        d = find_divergence(gid, groups[gid], states)
        if d is not None:
            issued = {r: _issued(states[r], gid) for r in groups[gid] if states.get(r) is not None}
            if len(set(issued.values())) > 1:
                d.lines.append("operations issued on this group: "
                               + ", ".join(f"rank {r}: {n}" for r, n in sorted(issued.items())))
            divergences.append(d)
    if divergences:
        lines.append("where the ranks diverge:")
        for d in divergences:
            lines.append(f"  group {d.group} (ranks {groups.get(d.group)}): ranks diverge at sequence number "
                         f"{d.seq}: {_explain(d)}")
            lines += [f"    {line}" for line in d.lines]
    else:
        lines.append("no divergence in the recorded operations: every group's ranks issued the same "
                     "operations (a slow rank, or a wait outside the traced communication)")
    if unreachable:
        lines.append(f"no answer from rank(s) {unreachable}: lost, or blocked without releasing Python's GIL")
    lines.append(f"ending every rank with exit code {exit_code}")
    return Report("\n".join(lines), divergences, unreachable)
