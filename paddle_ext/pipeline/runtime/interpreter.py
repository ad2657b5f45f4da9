"""Executes one rank's lowered schedule (see schedule/lower.py for its contract).

The interpreter owns no model logic: it is given a StageProgram (how to run a
chunk forward, the loss, the micro-batch data) and its links, and walks the
action list in order, keeping for each (chunk, micro-batch) only what its
backward still needs. Sent activations have their data freed at once (the
autograd graph keeps working without it), so a rank holds no more activations
than the simulator's peak in-flight count for that rank.

The interpreter is one dispatch per action type over three parts it is given, each
with one class per way it can work, so that no method here asks which way:

- the chunk runner (chunks.py): PlainChunks (the PipelineLayer's forward, autograd over
  the chunk) or NodeChunks (node_mode.py: upstream's schedule nodes, the
  forward/backward overlap scheduler #71995), whose overlapped F&B pair is a function
  it registers for FB actions (`Interpreter.register`, as torch.distributed.pipelining's
  register_custom_function); without one an F&B runs as its F then its B;
- the links (links.py): BlockingLinks (transfers in list order on this thread) or
  EagerLinks (sent once made, received once needed: over TCP streams by this thread,
  stream_exchange.py, or on communication threads, async_p2p.py);
- the slots (slots.py): what each (chunk, mb) keeps between its forward and its
  backward, and the StageLayout (which global stages this rank's chunks are).

Zero-bubble schedules split a backward into I (input gradients, sent upstream)
and W (the weight gradients, later): with `split` (a WeightGradStore,
split_backward.py) the forwards of the (chunk, mb)s that have an I run under its capture,
and I / W run through it; B stays a whole backward. Both ways to run a chunk split:
in node mode a lone F runs its chunk's nodes captured, an F&B step runs the model's
`overlapped_forward_backward` under the capture of its forward half, and I runs the
node backward (loss node, then the chunk's nodes) inside `split.input_backward`. That
capture covers only the forward half's matmuls because WeightGradStore splits a
matmul only when its weight belongs to the keyed chunk alone: the backward half is
another chunk (always so in DualPipeV's pairs: F0&B1, F1&B0), so a matmul it runs in
Python (a recompute, a PyLayer's backward) stays Paddle's. A pair whose halves are
the same chunk (a hand-made schedule) would not be told apart that way: the forward
of such a pair is not captured, and its I then computes every gradient, its W none.
This is DeepSeek's DualPipe: whole backwards inside the overlapped pairs, zero
bubble (I, W) in the other phases.

V placement (zb-v, dualpipev; `StageLayout.placement == "v"`): rank r runs stages r
(chunk 0) and 2*pp-1-r (chunk 1), so rank 0 also runs the last stage (the loss), and
on the last rank chunk 0's output is chunk 1's input with no transfer (a local
hand-over: F1.m takes F0.m's output detached, B0.m takes B1.m's input gradients).

Forward-only lists (schedule kinds forward / forward-v: the engine's eval_batch) run the
same way with no backward: a (chunk, mb) is let go as soon as its output is sent, handed
over, or given to the loss stage's `loss` callback (which computes the losses or keeps
the outputs), and the transfers use their own channels (the links' `channel`), whose
payload headers are not training's.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from paddle_ext.pipeline.runtime.async_p2p import CommThreadError
from paddle_ext.pipeline.runtime.chunks import ChunkRunner
from paddle_ext.pipeline.runtime.links import BlockingLinks, Links
from paddle_ext.pipeline.runtime.slots import Slots, StageLayout, detached
from paddle_ext.pipeline.schedule.ir import (
    FB,
    B,
    F,
    GradSync,
    I,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
    W,
    computes,
)

__all__ = ["Interpreter", "PipelineStepError", "StageProgram", "no_grad_sync"]


class PipelineStepError(RuntimeError):
    """An action failed; names the rank, the action and its schedule position."""


def no_grad_sync(chunk: int) -> None:
    """A StageProgram's on_grad_sync where no dp / sharding reduction runs."""


@dataclass(frozen=True)
class StageProgram:
    """What the interpreter needs from the model on this rank, built whole by the engine."""

    layout: StageLayout
    chunks: ChunkRunner                            # how a chunk runs: chunks.py / node_mode.py
    first_input: Callable[[int], Any]              # mb -> input payload of global stage 0
    on_grad_sync: Callable[[int], None] = no_grad_sync  # GradSync(chunk): its gradients are final
    split: Any = None        # zero-bubble schedules: the rank's WeightGradStore (split_backward.py)
    micro_steps: Any = None  # Paddle's user hooks at each forward and backward (micro_step_hooks.py)


class Interpreter:
    def __init__(self, program: StageProgram, actions: Sequence[Any], links: Optional[Links] = None) -> None:
        """links: how this run's transfers go (links.py); None: a list without transfers."""
        self.program = program
        self.layout = program.layout
        self.actions = list(actions)
        self.links = links if links is not None else BlockingLinks(None)
        # No backward anywhere: an evaluation list (module docstring, Schedule.forward_only).
        self.slots = Slots(forward_only=all(type(p) is F for a in self.actions for p in computes(a)))
        # An I directly followed by its own W is a plain backward (the same sums, and
        # Paddle's fused matmul_grad: a W later re-reads x and dY from memory); the other
        # I's forwards run split.
        self._fused = {(a.chunk, a.mb) for a, nxt in zip(self.actions, self.actions[1:])
                       if isinstance(a, I) and nxt == W(a.chunk, a.mb)}
        self._split_keys = {(a.chunk, a.mb) for a in self.actions if isinstance(a, I)} - self._fused
        # The forward of an F&B whose backward half is the same chunk cannot be captured
        # alone (module docstring): its I runs whole.
        self._split_keys -= {(a.f.chunk, a.f.mb) for a in self.actions
                             if isinstance(a, FB) and a.f.chunk == a.b.chunk}
        self.in_flight = 0  # forwards done whose backward has not run: what the simulator counts
        self.peak_in_flight = 0
        # (position, action, start, end) in wall-clock seconds: ranks on one host share
        # the clock, so their spans line up into one measured timeline. With threaded links
        # a transfer's span runs from when the thread posted it to when it finished, and a
        # compute's span leaves out the time it waited for a receive still in flight (its
        # start moves later by that much; `waited` sums those waits), so busy time is compute.
        self.spans: list[tuple[int, Any, float, float]] = []
        self.waited = 0.0
        self._functions: dict[type, Callable[[Any], None]] = {
            F: lambda a: self._forward(a.chunk, a.mb),
            B: lambda a: self._backward(a.chunk, a.mb),
            I: lambda a: self._input_backward(a.chunk, a.mb),
            W: lambda a: self._weight_backward(a.chunk, a.mb),
            FB: self._forward_then_backward,
            GradSync: lambda a: program.on_grad_sync(a.chunk),
            **{kind: self.links.transfer for kind in (RecvAct, SendAct, RecvGrad, SendGrad)}}
        for kind, function in program.chunks.actions.items():
            self.register(kind, function)

    def register(self, kind: type, function: Callable[[Interpreter, Any], None]) -> None:
        """Runs actions of type `kind` with function(interpreter, action) instead (node
        mode's overlapped F&B pair: node_mode.OverlappedPair)."""
        self._functions[kind] = functools.partial(function, self)

    def run(self) -> None:
        clock = time.time
        self.links.start(self.actions, self.layout, self.slots)
        for position, action in enumerate(self.actions):
            if not self.links.runs_here(action):
                continue  # a communication thread does it
            try:
                start, waited = clock(), self.links.waited
                self._function(action)(action)
                waited = self.links.waited - waited
                self.waited += waited
                self.spans.append((position, action, start + waited, clock()))
            except PipelineStepError:
                self.links.abort()
                raise
            except Exception as err:
                self.links.abort()
                raise self._step_error(err, action, position) from err
        try:
            self.spans = self.links.finish(self.spans)
        except CommThreadError as err:
            raise PipelineStepError(str(err)) from err
        if self.slots:
            raise PipelineStepError(f"pipeline rank {self.layout.rank}: schedule ended with work left for "
                                    f"{self.slots.left()}")

    def _function(self, action: Any) -> Callable[[Any], None]:
        try:
            return self._functions[type(action)]
        except KeyError:
            raise TypeError(f"unknown action {action!r}") from None

    def _step_error(self, err: Exception, action: Any, position: int) -> PipelineStepError:
        """The error naming the rank, the action and its position (a communication
        thread's error names its own transfer already)."""
        if isinstance(err, CommThreadError):
            return PipelineStepError(str(err))
        return PipelineStepError(
            f"pipeline rank {self.layout.rank}: action {action} (position {position} of "
            f"{len(self.actions)} in this rank's schedule) failed: {type(err).__name__}: {err}")

    # --- a (chunk, mb)'s inputs and outputs ------------------------------------------
    def forward_input(self, chunk: int, mb: int) -> Any:
        """F(chunk, mb)'s input: the micro-batch, a local hand-over, or a receive."""
        layout, slot = self.layout, self.slots.at(chunk, mb)
        if layout.is_first(chunk):
            slot.inputs = self.program.first_input(mb)
        elif layout.hands_over(chunk):
            slot.inputs = detached(self.slots[(0, mb)].outputs)
            if self.slots.forward_only:  # chunk 0's output had no other reader
                self.slots.pop((0, mb))
        else:
            slot.inputs = self.links.forward_input(chunk, mb)
        return slot.inputs

    def output_grads(self, chunk: int, mb: int) -> list:
        """B(chunk, mb)'s output gradients: from chunk 1's backward on this rank (a local
        hand-over) or a receive."""
        slot = self.slots[(chunk, mb)]
        if not self.layout.hands_over(chunk + 1):
            slot.output_grads = self.links.output_grads(chunk, mb)
        elif slot.output_grads is None:
            raise RuntimeError(f"B{chunk}.{mb} has no output gradient: chunk 1's backward of "
                               f"micro-batch {mb} did not run before it (local hand-over)")
        return slot.output_grads

    def forward_done(self, chunk: int, mb: int, outputs: Any) -> None:
        """F(chunk, mb) made `outputs` (None on the loss stage)."""
        self.slots[(chunk, mb)].outputs = outputs
        sent = self.links.output_made(chunk, mb, outputs)
        if self.slots.forward_only:
            # Let go unless a blocking SA or the V's local hand-over still reads the output.
            if outputs is None or sent:
                self.slots.pop((chunk, mb))
            return
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def backward_begins(self) -> None:
        self.in_flight -= 1

    def backward_done(self, chunk: int, mb: int, input_grads: Optional[list]) -> None:
        """B(chunk, mb) made the input gradients to send (None on the first stage)."""
        slot = self.slots[(chunk, mb)]
        if self.layout.is_first(chunk):
            self.slots.pop((chunk, mb))
            return
        slot.input_grads = input_grads
        slot.forget_forward()
        if self.layout.hands_over(chunk):  # to chunk 0 on this rank, no transfer
            self.slots.pop((chunk, mb))
            self.slots[(0, mb)].output_grads = input_grads
        elif self.links.input_grads_made(chunk, mb, input_grads):
            self.slots.pop((chunk, mb))

    # --- compute ----------------------------------------------------------------------
    def capture(self, chunk: int, mb: int) -> contextlib.AbstractContextManager:
        """The split's capture for the forward of a (chunk, mb) whose backward is a split
        I (its parameter matmuls' dW deferred to W); else nothing."""
        split = self.program.split
        if split is not None and (chunk, mb) in self._split_keys:
            return split.capture(chunk, mb)
        return contextlib.nullcontext()

    def _forward(self, chunk: int, mb: int) -> None:
        hooks, chunks = self.program.micro_steps, self.program.chunks
        inputs = self.forward_input(chunk, mb)
        slot = self.slots[(chunk, mb)]
        if hooks is not None:
            hooks.forward_begin(inputs)
        with self.capture(chunk, mb):
            outputs = chunks.forward(slot, chunk, inputs)
        if hooks is not None:
            hooks.forward_end(inputs, outputs)
        if self.layout.is_last(chunk):
            slot.loss = chunks.loss(slot, outputs, mb)
            outputs = None
        self.forward_done(chunk, mb, outputs)

    def _forward_then_backward(self, pair: FB) -> None:
        """FB(f, b) without a registered pair function: F, then B."""
        self._forward(pair.f.chunk, pair.f.mb)
        self._backward(pair.b.chunk, pair.b.mb)

    def _backward(self, chunk: int, mb: int) -> None:
        self.backward_begins()
        self._hooked_backward(chunk, mb, lambda: self._whole_backward(chunk, mb))

    def _whole_backward(self, chunk: int, mb: int) -> Optional[list]:
        """The backward of (chunk, mb) as the chunk ran (the chunk runner's); returns the
        input gradients it sends. Inside `split.input_backward` it is an I."""
        input_grads = self.program.chunks.backward(self.slots[(chunk, mb)], chunk, self.layout,
                                                   lambda: self.output_grads(chunk, mb))
        self.backward_done(chunk, mb, input_grads)
        return input_grads

    def _hooked_backward(self, chunk: int, mb: int, run: Callable[[], Optional[list]]) -> None:
        """`run` (a backward of (chunk, mb) returning the input gradients it sends) between
        the user hooks' backward locations (micro_step_hooks.py), given hooks."""
        layout, hooks = self.layout, self.program.micro_steps
        if hooks is None:
            run()
            return
        slot = self.slots[(chunk, mb)]
        inputs = None if layout.is_first(chunk) else slot.inputs  # as Paddle: no stage input on the first
        outputs = slot.loss if layout.is_last(chunk) else slot.outputs
        output_grads = None
        if hooks.wants_output_grads() and not layout.is_last(chunk):
            output_grads = slot.as_payload(self.output_grads(chunk, mb))
        hooks.backward_begin(inputs, outputs, output_grads)
        input_grads = run()
        hooks.backward_end(inputs, outputs, input_grads, output_grads)

    def _input_backward(self, chunk: int, mb: int) -> None:
        """I(chunk, mb): the backward with the deferrable weight gradients recorded for W."""
        split = self._split(f"I{chunk}.{mb}")
        self.backward_begins()
        if (chunk, mb) in self._fused:  # its W, next, has nothing left to do
            self._hooked_backward(chunk, mb, lambda: self._whole_backward(chunk, mb))
            return
        sent: list = []
        self._hooked_backward(chunk, mb, lambda: split.input_backward(
            chunk, mb, lambda: sent.append(self._whole_backward(chunk, mb))) or sent[0])

    def _weight_backward(self, chunk: int, mb: int) -> None:
        """W(chunk, mb): the weight gradients its I deferred."""
        split = self._split(f"W{chunk}.{mb}")
        if (chunk, mb) not in self._fused:
            split.weight_backward(chunk, mb)

    def _split(self, what: str) -> Any:
        if self.program.split is None:
            raise RuntimeError(f"{what}: zero-bubble actions need the engine's split backward")
        return self.program.split
