"""Executes one rank's lowered schedule (see schedule/lower.py for its contract).

The interpreter owns no model logic: it is given a StageProgram (how to run a
chunk forward, the loss, the micro-batch data) and a transport, and walks the
action list in order, keeping for each (chunk, micro-batch) only what its
backward still needs. Sent activations have their data freed at once (the
autograd graph keeps working without it), so a rank holds no more activations
than the simulator's peak in-flight count for that rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import paddle

from paddle_ext.pipeline.runtime.transport import P2P, PayloadMeta, TensorMeta, as_tuple
from paddle_ext.pipeline.schedule.ir import (
    FB,
    B,
    F,
    GradSync,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
)


class PipelineStepError(RuntimeError):
    """An action failed; names the rank, the action and its schedule position."""


@dataclass
class StageProgram:
    """What the interpreter needs from the model on this rank."""

    rank: int
    pp: int
    vpp: int
    forward: Callable[[Any, int], Any]            # (input payload, chunk) -> output payload
    loss: Callable[[Any, int], paddle.Tensor]      # (last-stage output, mb) -> scaled loss
    first_input: Callable[[int], Any]              # mb -> input payload of global stage 0
    backward_loss: Callable[[paddle.Tensor], None] # runs backward from a loss (scaler aware)
    on_grad_sync: Callable[[int], None] = lambda chunk: None

    def is_first(self, chunk: int) -> bool:
        return chunk == 0 and self.rank == 0

    def is_last(self, chunk: int) -> bool:
        return chunk == self.vpp - 1 and self.rank == self.pp - 1


@dataclass
class _Slot:
    inputs: Any = None
    outputs: Any = None
    loss: Optional[paddle.Tensor] = None
    output_grad_meta: list = field(default_factory=list)
    output_grads: Optional[list] = None
    input_grads: Optional[list] = None


def _requires_grad(payload: Any) -> list[paddle.Tensor]:
    return [t for t in as_tuple(payload) if isinstance(t, paddle.Tensor) and not t.stop_gradient]


def _release(payload: Any) -> None:
    """Frees the data of tensors already sent; their autograd nodes stay usable."""
    for t in as_tuple(payload):
        if isinstance(t, paddle.Tensor) and t._is_initialized():
            t._clear_dataptr()


class Interpreter:
    def __init__(self, program: StageProgram, actions: Sequence[Any], transport: P2P) -> None:
        self.program = program
        self.actions = list(actions)
        self.p2p = transport
        self.slots: dict[tuple[int, int], _Slot] = {}
        self.in_flight = 0  # forwards done whose backward has not run: what the simulator counts
        self.peak_in_flight = 0
        # (position, action, start, end) in wall-clock seconds: ranks on one host share
        # the clock, so their spans line up into one measured timeline.
        self.spans: list[tuple[int, Any, float, float]] = []

    def run(self) -> None:
        total = len(self.actions)
        clock = time.time
        for position, action in enumerate(self.actions):
            try:
                start = clock()
                self._step(action)
                self.spans.append((position, action, start, clock()))
            except PipelineStepError:
                raise
            except Exception as err:
                raise PipelineStepError(
                    f"pipeline rank {self.program.rank}: action {action} (position {position} of "
                    f"{total} in this rank's schedule) failed: {type(err).__name__}: {err}") from err
        if self.slots:
            left = ", ".join(f"{c}.{m}" for c, m in sorted(self.slots))
            raise PipelineStepError(f"pipeline rank {self.program.rank}: schedule ended with work left for {left}")

    def _slot(self, chunk: int, mb: int) -> _Slot:
        return self.slots.setdefault((chunk, mb), _Slot())

    def _step(self, action: Any) -> None:
        if isinstance(action, F):
            self._forward(action.chunk, action.mb)
        elif isinstance(action, B):
            self._backward(action.chunk, action.mb)
        elif isinstance(action, FB):
            self._forward(action.f.chunk, action.f.mb)
            self._backward(action.b.chunk, action.b.mb)
        elif isinstance(action, RecvAct):
            self._slot(action.chunk, action.mb).inputs = self.p2p.recv_activation(("act", action.chunk), action.peer)
        elif isinstance(action, SendAct):
            slot = self.slots[(action.chunk, action.mb)]
            self.p2p.send_activation(("act", action.chunk), slot.outputs, action.peer)
            slot.output_grad_meta = [m for m in PayloadMeta.of(slot.outputs).tensors if not m.stop_gradient]
            _release(slot.outputs)
        elif isinstance(action, RecvGrad):
            slot = self.slots[(action.chunk, action.mb)]
            slot.output_grads = self.p2p.recv_grads(slot.output_grad_meta, action.peer)
        elif isinstance(action, SendGrad):
            slot = self.slots.pop((action.chunk, action.mb))
            self.p2p.send_grads(slot.input_grads, action.peer)
        elif isinstance(action, GradSync):
            self.program.on_grad_sync(action.chunk)
        else:
            raise TypeError(f"unknown action {action!r}")

    def _forward(self, chunk: int, mb: int) -> None:
        prog = self.program
        slot = self._slot(chunk, mb)
        if prog.is_first(chunk):
            slot.inputs = prog.first_input(mb)
        elif slot.inputs is None:
            raise RuntimeError(f"F{chunk}.{mb} has no input: its receive did not run before it")
        outputs = prog.forward(slot.inputs, chunk)
        if prog.is_last(chunk):
            slot.loss = prog.loss(outputs, mb)
            slot.outputs = None
        else:
            slot.outputs = outputs
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def _backward(self, chunk: int, mb: int) -> None:
        prog = self.program
        slot = self.slots[(chunk, mb)]
        self.in_flight -= 1
        if prog.is_last(chunk):
            prog.backward_loss(slot.loss)
        else:
            if slot.output_grads is None:
                raise RuntimeError(f"B{chunk}.{mb} has no output gradient: its receive did not run before it")
            outputs = _requires_grad(slot.outputs)
            paddle.autograd.backward(outputs, slot.output_grads)
        if prog.is_first(chunk):
            self.slots.pop((chunk, mb))
            return
        inputs = _requires_grad(slot.inputs)
        slot.input_grads = [t.grad if t.grad is not None else paddle.zeros_like(t) for t in inputs]
        slot.inputs = slot.outputs = slot.loss = slot.output_grads = None


def input_grad_meta(payload: Any) -> list[TensorMeta]:
    return [m for m in PayloadMeta.of(payload).tensors if not m.stop_gradient]
