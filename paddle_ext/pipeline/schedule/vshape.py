"""Generators on the V placement (rank r holds stages r and 2*pp - 1 - r; ir.py).

- ``zb-v`` (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, sail-sg's ZB-V):
  warm-up of chunk-0 forwards, chunk-1 forwards interleaved with them, then a steady
  state F0 I0 W0 F1 I1 W1 and a cool-down whose deferred W's fill the bubbles. Peak
  activations per rank: 2*pp chunk-activations of half a stage each, i.e. 1F1B's pp
  whole-stage activations on rank 0; with unit costs F = I = W the step has no bubble
  beyond the warm-up and cool-down ramps (docs/pipeline_schedules.md has the figure).
- ``dualpipev`` (DeepSeek's DualPipeV, "DualPipe" repository, dualpipev.py): the eight
  phases nF0, nF0F1, nB1W1F1, nF0B1F1B0, nB1F1B0, nB1B0, nWB0, nW. The F&B pairs of
  phases 4 and 5 run as ``F<a>.<i>&B<b>.<j>`` actions in ``dualpipev-overlap`` (for a
  model with ``overlapped_forward_backward``) and as F then B in ``dualpipev``; the
  zero-bubble backwards of phases 3, 6 and 7 are I's whose W's run, oldest first, where
  DualPipeV calls ``WeightGradStore.pop``.

Both are written for a full pipe (``microbatches >= 2*pp``: DualPipeV's own bound;
ZB-V's pattern needs 2*pp - 1). Fewer micro-batches (down to 1) take the full-pipe
schedule and drop the actions of the micro-batches that do not exist: every rank's
list is then a subsequence of a deadlock-free schedule closed under the dependencies of
the micro-batches kept, so it stays deadlock-free and in dependency order.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, List, Tuple

from paddle_ext.pipeline.schedule.ir import FB, Action, B, F, I, Schedule, W

__all__ = ["V_KINDS", "V_MIN_MICROBATCHES", "zb_v", "dualpipev"]

V_KINDS = ("zb-v", "dualpipev")
V_MIN_MICROBATCHES = 1


def _trim(acts: List[Action], microbatches: int) -> Tuple[Action, ...]:
    """Drops every action (or the half of an F&B) of a micro-batch >= microbatches."""
    out: List[Action] = []
    for a in acts:
        if isinstance(a, FB):
            keep = [p for p in (a.f, a.b) if p.mb < microbatches]
            out += [a] if len(keep) == 2 else keep
        elif a.mb < microbatches:  # type: ignore[union-attr]
            out.append(a)
    return tuple(out)


def zb_v(pp: int, microbatches: int) -> Schedule:
    """ZB-V for any microbatches >= 1 (module docstring)."""
    full = max(microbatches, 2 * pp - 1)
    ranks = []
    for r in range(pp):
        acts: List[Action] = []
        f0 = f1 = b0 = b1 = 0
        for _ in range(2 * (pp - r) - 1):       # chunk-0 forwards down the V
            acts.append(F(0, f0))
            f0 += 1
        for _ in range(r):                       # the first chunk-1 forwards come back
            acts += [F(1, f1), F(0, f0)]
            f1 += 1
            f0 += 1
        for _ in range(pp - r):                  # chunk 1 turns round: F1 I1 W1
            acts += [F(1, f1), I(1, b1), W(1, b1)]
            f1 += 1
            b1 += 1
        while f1 < f0 or f0 < full:              # steady state
            if f0 < full:
                acts.append(F(0, f0))
                f0 += 1
            acts += [I(0, b0), W(0, b0), F(1, f1), I(1, b1), W(1, b1)]
            b0 += 1
            f1 += 1
            b1 += 1
        w0, w1 = b0, b1
        for _ in range(r):                       # cool-down: input grads first
            acts += [I(0, b0), I(1, b1)]
            b0 += 1
            b1 += 1
        for _ in range(pp - r):
            acts += [I(0, b0), W(0, w0)]
            b0 += 1
            w0 += 1
        acts += [W(1, m) for m in range(w1, b1)] + [W(0, m) for m in range(w0, b0)]
        ranks.append(_trim(acts, microbatches))
    return Schedule(pp, 2, microbatches, tuple(ranks), "zb-v", "v")


def dualpipev(pp: int, microbatches: int, overlapped: bool = False) -> Schedule:
    """DualPipeV's eight phases for any microbatches >= 1 (module docstring); with
    `overlapped` the pairs of phases 4 and 5 are F&B actions."""
    full = max(microbatches, 2 * pp)
    ranks = []
    for r in range(pp):
        ranks.append(_trim(_DualPipeRank(pp, r, full, overlapped).actions(), microbatches))
    kind = "dualpipev-overlap" if overlapped else "dualpipev"
    return Schedule(pp, 2, microbatches, tuple(ranks), kind, "v")


class _DualPipeRank:
    """One rank's DualPipeV list, built phase by phase with per-chunk counters (each
    chunk runs its forwards and its backwards in micro-batch order) and DualPipeV's
    FIFO of deferred weight gradients."""

    def __init__(self, pp: int, rank: int, microbatches: int, overlapped: bool) -> None:
        self.pp, self.r, self.m, self.overlapped = pp, rank, microbatches, overlapped
        self.fwd = [0, 0]
        self.bwd = [0, 0]
        self.pending: Deque[W] = deque()
        self.acts: List[Action] = []

    def f(self, c: int) -> F:
        a = F(c, self.fwd[c])
        self.fwd[c] += 1
        return a

    def forward(self, c: int) -> None:
        self.acts.append(self.f(c))

    def backward(self, c: int, zero_bubble: bool = False) -> None:
        m = self.bwd[c]
        self.bwd[c] += 1
        if zero_bubble:
            self.acts.append(I(c, m))
            self.pending.append(W(c, m))
        else:
            self.acts.append(B(c, m))

    def weight(self) -> None:
        self.acts.append(self.pending.popleft())

    def forward_backward(self, fc: int, bc: int) -> None:
        f, b = self.f(fc), B(bc, self.bwd[bc])
        self.bwd[bc] += 1
        self.acts += [FB(f, b)] if self.overlapped else [f, b]

    def actions(self) -> List[Action]:
        pp, r = self.pp, self.r
        last = r == pp - 1
        for _ in range(2 * (pp - r - 1)):                # 1: nF0
            self.forward(0)
        for _ in range(r + 1):                           # 2: nF0F1
            self.forward(0)
            self.forward(1)
        for _ in range(pp - r - 1):                      # 3: nB1W1F1 (zero bubble)
            self.backward(1, zero_bubble=True)
            self.weight()
            self.forward(1)
        for i in range(self.m - 2 * pp + r + 1):         # 4: nF0B1F1B0
            if i == 0 and last:  # DualPipeV keeps these two apart on the last rank
                self.forward(0)
                self.backward(1)
            else:
                self.forward_backward(0, 1)
            self.forward_backward(1, 0)
        for _ in range(pp - r - 1):                      # 5: nB1F1B0
            self.backward(1)
            self.forward_backward(1, 0)
        zero_bubble = False                              # 6: nB1B0, second half zero bubble
        for i in range(r + 1):
            if i == (r + 1) // 2 and r % 2 == 1:
                zero_bubble = True
            self.backward(1, zero_bubble)
            if i == (r + 1) // 2 and r % 2 == 0:
                zero_bubble = True
            self.backward(0, zero_bubble)
        for _ in range(pp - r - 1):                      # 7: nWB0 (zero bubble)
            self.weight()
            self.backward(0, zero_bubble=True)
        while self.pending:                              # 8: nW
            self.weight()
        assert self.fwd == [self.m, self.m] and self.bwd == [self.m, self.m]
        return self.acts

