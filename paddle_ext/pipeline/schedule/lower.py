"""Lowering: turn a compute-only schedule into each rank's complete instruction stream.

Contract of a lowered rank list (what the runtime interpreter executes, in order):

- ``F<c>.<m>``: run chunk c's forward on micro-batch m. Its input is the data loader's
  micro-batch m on global stage 0, otherwise the tensor an earlier ``RA<c>.<m>`` on this
  rank received. On the last stage it also computes the loss.
- ``B<c>.<m>``: backward of that forward; the output gradient comes from the loss on the
  last stage, otherwise from an earlier ``RG<c>.<m>``. Frees F's activations.
- ``F..&B..``: both of the above as one overlapped step (inputs received before it; a
  model's ``overlapped_forward_backward`` runs it when it has one, else F then B).
- ``SA<c>.<m>>p`` / ``SG<c>.<m>>p``: send F(c, m)'s output / B(c, m)'s input gradient
  to rank p. Always after the compute that made it; the tensor may be freed after.
- ``RA<c>.<m><p`` / ``RG<c>.<m><p``: receive from rank p; always before the consumer.
- ``I<c>.<m>`` / ``W<c>.<m>`` (zero bubble): the backward in two halves. I computes the
  input gradient (from ``RG<c>.<m>`` or the loss, like B) and is what ``SG<c>.<m>``
  sends; it frees the activations autograd kept but keeps what W needs. W then
  accumulates the micro-batch's parameter gradients of chunk c; it moves no tensor.
- V placement: the last rank's F1.m takes F0.m's output and its I/B0.m takes I/B1.m's
  input gradient in place (a local hand-over), with no transfer action.
- ``GS<c>`` (only with grad_sync=True): chunk c's last B or W on this rank is done, its
  gradient buckets may launch (asynchronously, on their own group).

Sends and receives may be blocking rendezvous (gloo: a send returns only once the peer
posts the receive). The lists are deadlock-free by construction: `lower` *runs* the
compute schedule under exactly those semantics and records what happened. Each
transfer takes place at the first moment the tensor exists and both ranks are between
computes; a rank whose next compute lacks an input waits; no rank ever waits just to
send. The recorded transfers form one global sequence and every rank performs its own
in that order, so the earliest unfinished transfer always has both sides waiting for
it and nothing can hang. (`validate` proves it again by simulation.)

Asynchronous p2p (``async_p2p=True``, pp_configs.overlap_p2p_comm): the runtime gives each
directed link (sender, receiver) a communication thread that performs the link's
transfers in list order while the computes run; a send waits for its producing compute,
a compute only for its own receives. The order is then recorded under those semantics:
each transfer at the first moment its tensor exists and its link is free, computing
meanwhile, so a receive is posted as early as the order allows; each rank's list merges
its computes and transfers by that start time. The same argument applies per link: the
earliest transfer not yet done has its producer done (the producer's inputs came from
earlier transfers) and both ends of its link waiting for it. The blocking order is also
safe under threads (it only has more dependencies), just later.

Placing transfers only where both ranks are idle costs nothing with comm = 0 for the
generators here: the blocking run's makespan equals the unbounded-buffer ideal in all
the configurations the tests sweep with F=1, B=2. With comm > 0 every transfer stops
both ranks for `comm`, which the simulator shows as bubble.
"""

from __future__ import annotations

import heapq
from bisect import insort
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from paddle_ext.pipeline.schedule.flow import Payload, consumes, produces
from paddle_ext.pipeline.schedule.ir import (
    WEIGHT_GRAD_KINDS,
    Action,
    GradSync,
    RecvAct,
    RecvGrad,
    Schedule,
    SendAct,
    SendGrad,
    computes,
    locate,
    schedule_error,
)
from paddle_ext.pipeline.schedule.simulate import Costs, Number, simulate
from paddle_ext.pipeline.schedule.validate import check_compute

__all__ = ["lower"]


def lower(schedule: Schedule, costs: Optional[Costs] = None, grad_sync: bool = False,
          async_p2p: bool = False) -> Schedule:
    """Adds the sends/receives (and, with grad_sync, GS<c> points) to a compute-only
    schedule.

    `costs` (default F=1, B=2, comm=0) drive the run that places the transfers; the
    result is deadlock-free whatever the real costs turn out to be, they only move
    where the waits fall. With async_p2p the order is made for a runtime whose
    transfers run on communication threads (see "Asynchronous p2p" above); run and
    check such a schedule with simulate/validate(..., async_p2p=True).
    """
    if schedule.lowered:
        raise schedule_error(schedule, "schedule is already lowered: lower() takes the "
                             "compute-only schedule (Schedule.compute_only())")
    check_compute(schedule)
    out = _record(schedule, costs or Costs(), _Threads() if async_p2p else _Rendezvous(schedule.pp))
    if grad_sync:
        out = [_with_grad_sync(acts) for acts in out]
    return schedule.with_ranks(out)


class _Rendezvous:
    """Blocking transfers (gloo): a transfer takes place only while both of its ranks are
    between computes, and stops both for `comm`; each rank's list is its actions in the
    order they happened."""

    def __init__(self, pp: int) -> None:
        self.clock: List[Number] = [0] * pp  # when each rank's current compute or transfer ends
        self.have: List[Set[Payload]] = [set() for _ in range(pp)]
        self.out: List[List[Action]] = [[] for _ in range(pp)]

    def can_transfer(self, t: Number, src: int, dst: int) -> bool:
        return self.clock[src] <= t and self.clock[dst] <= t

    def transfer(self, t: Number, comm: Number, p: Payload, src: int, dst: int, send: Action,
                 recv: Action) -> None:
        self.out[src].append(send)
        self.out[dst].append(recv)
        self.have[dst].add(p)
        if comm:
            self.clock[src] = self.clock[dst] = t + comm

    def can_compute(self, t: Number, r: int, needs: Set[Payload]) -> bool:
        return self.clock[r] <= t and self.have[r].issuperset(needs)

    def compute(self, t: Number, r: int, a: Action, end: Number) -> None:
        self.out[r].append(a)
        self.clock[r] = end

    def lists(self) -> List[List[Action]]:
        return self.out


class _Threads:
    """Transfers on communication threads, one per directed link (sender, receiver):
    each transfer at the first moment its tensor exists and its link is free, computing
    meanwhile; a compute waits only for its own inputs. Each rank's list holds its
    computes and its transfers merged by start time (a transfer before a compute that
    starts at the same moment)."""

    def __init__(self) -> None:
        self.busy: Dict[int, Number] = {}                    # compute stream free at
        self.line: Dict[Tuple[int, int], Number] = {}        # directed link (src, dst) free at
        self.arrived: Dict[Tuple[int, Payload], Number] = {}
        self.events: Dict[int, List[Tuple[Number, int, int, Action]]] = {}
        self.seq = 0

    def can_transfer(self, t: Number, src: int, dst: int) -> bool:
        return self.line.get((src, dst), 0) <= t

    def transfer(self, t: Number, comm: Number, p: Payload, src: int, dst: int, send: Action,
                 recv: Action) -> None:
        self.events.setdefault(src, []).append((t, 0, self.seq, send))
        self.events.setdefault(dst, []).append((t, 0, self.seq, recv))
        self.seq += 1
        self.arrived[(dst, p)] = t + comm
        if comm:
            self.line[(src, dst)] = t + comm

    def can_compute(self, t: Number, r: int, needs: Set[Payload]) -> bool:
        return self.busy.get(r, 0) <= t and all(self.arrived.get((r, p), t + 1) <= t for p in needs)

    def compute(self, t: Number, r: int, a: Action, end: Number) -> None:
        self.events.setdefault(r, []).append((t, 1, 0, a))
        self.busy[r] = end

    def lists(self) -> List[List[Action]]:
        return [[a for *_order, a in sorted(self.events.get(r, []), key=lambda e: e[:3])]
                for r in range(max(self.events, default=-1) + 1)]


def _record(schedule: Schedule, costs: Costs, semantics: Any) -> List[List[Action]]:
    """Runs the compute schedule as an event simulation under `semantics` (_Rendezvous or
    _Threads) and returns each rank's list of computes and transfers. At each moment,
    first every transfer whose tensor exists and that the semantics allow (in the order
    of the key (time made, is_grad, micro-batch, source stage), which is unique, so the
    result is deterministic), then every free rank's next compute whose inputs are here."""
    pp, ns, ranks = schedule.pp, schedule.num_stages, schedule.ranks
    pl = schedule.placement
    needs = [[consumes(pp, ns, r, a, pl) for a in acts] for r, acts in enumerate(ranks)]
    makes = [[produces(pp, ns, r, a, pl) for a in acts] for r, acts in enumerate(ranks)]
    ptr = [0] * pp
    # Tensors made but not yet sent: a heap until they exist, then a sorted list.
    future: List[_Pending] = []
    ready: List[_Pending] = []
    times: List[Number] = [0]
    done = 0
    total = sum(len(a) for a in ranks)
    comm = costs.comm
    while times:
        t = heapq.heappop(times)
        while times and times[0] == t:
            heapq.heappop(times)
        while future and future[0][0][0] <= t:
            insort(ready, heapq.heappop(future))
        kept = []
        for item in ready:
            _key, p, src, dst, send, recv = item
            if semantics.can_transfer(t, src, dst):
                semantics.transfer(t, comm, p, src, dst, send, recv)
                if comm:
                    heapq.heappush(times, t + comm)
            else:
                kept.append(item)
        ready = kept
        for r in range(pp):
            i = ptr[r]
            if i >= len(ranks[r]) or not semantics.can_compute(t, r, needs[r][i]):
                continue
            a = ranks[r][i]
            end = t + costs.of(pp, r, a, pl)
            semantics.compute(t, r, a, end)
            ptr[r] += 1
            done += 1
            heapq.heappush(times, end)
            for p in makes[r][i]:
                heapq.heappush(future, _pending(pp, p, end, pl))
    if done < total or future or ready:
        simulate(schedule, costs)  # raises the deadlock error with the waiting chain
        raise schedule_error(schedule, "lowering could not finish the schedule")
    lists = semantics.lists()
    return lists + [[] for _ in range(pp - len(lists))]


_Pending = Tuple[Tuple[Number, int, int, int], Payload, int, int, Action, Action]


def _pending(pp: int, p: Payload, made: Number, placement: str) -> _Pending:
    """A tensor waiting to be sent, with both sides' actions spelled out once."""
    is_grad, s_stage, d_stage, mb = p
    (src, s_chunk) = locate(pp, s_stage, placement)
    (dst, d_chunk) = locate(pp, d_stage, placement)
    send = (SendGrad if is_grad else SendAct)(s_chunk, mb, dst)
    recv = (RecvGrad if is_grad else RecvAct)(d_chunk, mb, src)
    return ((made, int(is_grad), mb, s_stage), p, src, dst, send, recv)


def _with_grad_sync(acts: Sequence[Action]) -> List[Action]:
    """GS<c> right after chunk c's last B or W: with zero bubble the grads are complete
    only after the last W (syncing after the last I would send partial gradients)."""
    last: Dict[int, int] = {}
    for i, a in enumerate(acts):
        for p in computes(a):
            if isinstance(p, WEIGHT_GRAD_KINDS):
                last[p.chunk] = i
    after: Dict[int, List[Action]] = {}
    for c, i in sorted(last.items()):
        after.setdefault(i, []).append(GradSync(c))
    res: List[Action] = []
    for i, a in enumerate(acts):
        res.append(a)
        res += after.get(i, [])
    return res
