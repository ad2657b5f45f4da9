"""Executes one rank's lowered schedule (see schedule/lower.py for its contract).

The interpreter owns no model logic: it is given a StageProgram (how to run a
chunk forward, the loss, the micro-batch data) and a transport, and walks the
action list in order, keeping for each (chunk, micro-batch) only what its
backward still needs. Sent activations have their data freed at once (the
autograd graph keeps working without it), so a rank holds no more activations
than the simulator's peak in-flight count for that rank.

Two ways to run a chunk:

- plain: the StageProgram's `forward`, then autograd over the whole chunk;
- schedule nodes (the forward/backward overlap scheduler, upstream #71995): the
  chunk is a ScheduleChunk (`schedule_chunk`), the loss a loss node
  (`loss_node`), and an `F..&B..` step calls the model's
  `overlapped_forward_backward` with upstream's arguments. Without that method an
  F&B runs as its F then its B.

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

V placement (zb-v, dualpipev; `StageProgram.placement == "v"`): rank r runs stages r
(chunk 0) and 2*pp-1-r (chunk 1), so rank 0 also runs the last stage (the loss), and
on the last rank chunk 0's output is chunk 1's input with no transfer (a local
hand-over: F1.m takes F0.m's output detached, B0.m takes B1.m's input gradients).

Two ways to communicate: in list order on this thread (blocking send/recv), or
with `async_links` on communication threads (async_p2p.py), one per directed
link, that run the transfers in the list's order while this thread computes.

Forward-only lists (schedule kinds forward / forward-v: the engine's eval_batch) run the
same way with no backward: a (chunk, mb) is let go as soon as its output is sent, handed
over, or given to the loss stage's `loss` callback (which computes the losses or keeps
the outputs), and the transfers use their own channels (`channel`), whose payload
headers are not training's.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import paddle

from paddle_ext.pipeline.runtime.async_p2p import CommThread, CommThreadError
from paddle_ext.pipeline.runtime.transport import P2P, PayloadMeta, TensorMeta, as_tuple
from paddle_ext.pipeline.schedule.ir import (
    FB,
    B,
    Comm,
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
    # Schedule nodes (all three or none): chunk -> ScheduleChunk; mb -> loss node with
    # labels and scale set; the loss a loss node computed (detached) -> recorded.
    schedule_chunk: Optional[Callable[[int], Any]] = None
    loss_node: Optional[Callable[[int], Any]] = None
    # (loss, the chunk's outputs, mb): the loss stage's outputs let the engine compute the
    # other loss functions of a PipelineLayer with several (pipeline/losses.py)
    record_loss: Callable[[paddle.Tensor, Any, int], None] = lambda loss, outputs, mb: None
    # The model's overlapped_forward_backward (bound), used for F&B steps in node mode.
    overlapped_forward_backward: Optional[Callable[..., Any]] = None
    scaler: Any = None
    # Zero-bubble schedules: the rank's WeightGradStore (runtime/split_backward.py).
    split: Any = None
    # The schedule's placement of stages on ranks (schedule/ir.py): interleaved or v.
    placement: str = "interleaved"
    # Paddle's user hooks at each forward and backward (pipeline/micro_step_hooks.py).
    micro_steps: Any = None

    def is_first(self, chunk: int) -> bool:
        return chunk == 0 and self.rank == 0

    def is_last(self, chunk: int) -> bool:
        if self.placement == "v":
            return chunk == 1 and self.rank == 0
        return chunk == self.vpp - 1 and self.rank == self.pp - 1

    def hands_over(self, chunk: int) -> bool:
        """V placement, last rank: chunk 1's input is chunk 0's output on this rank."""
        return self.placement == "v" and self.rank == self.pp - 1 and chunk == 1

    @property
    def uses_nodes(self) -> bool:
        return self.schedule_chunk is not None


@dataclass
class _Slot:
    inputs: Any = None
    outputs: Any = None
    loss: Optional[paddle.Tensor] = None
    output_grad_meta: list = field(default_factory=list)
    output_is_tuple: bool = False
    output_grads: Optional[list] = None
    input_grads: Optional[list] = None
    chunk: Any = None      # node mode: the ScheduleChunk that ran the forward
    loss_node: Any = None  # node mode, last stage: the loss node


def _requires_grad(payload: Any) -> list[paddle.Tensor]:
    return [t for t in as_tuple(payload) if isinstance(t, paddle.Tensor) and not t.stop_gradient]


def _release(payload: Any) -> None:
    """Frees the data of tensors already sent; their autograd nodes stay usable. As
    fleet's PipelineParallel._release_output, not a tensor modified in place
    (inplace_version > 0) unless marked `pp_can_free`: a PyLayer's output that is one of
    its inputs counts so (a tensor a recompute segment passes through, position ids, say),
    and the recompute's backward reads it again."""
    for t in as_tuple(payload):
        if isinstance(t, paddle.Tensor) and t._is_initialized() and (
                t.inplace_version == 0 or getattr(t, "pp_can_free", False)):
            t._clear_dataptr()


def _detached(payload: Any) -> Any:
    """A local hand-over's input: the producing chunk's outputs cut from its graph (as
    a receive would give them), keeping which of them need a gradient."""
    def cut(t: Any) -> Any:
        if not isinstance(t, paddle.Tensor):
            return t
        out = t.detach()
        out.stop_gradient = t.stop_gradient
        return out
    if isinstance(payload, (tuple, list)):
        return type(payload)(cut(t) for t in payload)
    return cut(payload)


def _input_grads(inputs: Any, grads: Any) -> list[paddle.Tensor]:
    """The gradients to send back for the inputs that need one, from a node backward's
    tuple (one entry per input, None where there is none)."""
    grads = as_tuple(grads)
    inputs = as_tuple(inputs)
    if len(grads) != len(inputs):
        raise ValueError(f"the backward returned {len(grads)} input gradients for {len(inputs)} "
                         "stage inputs")
    return [g if g is not None else paddle.zeros_like(t)
            for t, g in zip(inputs, grads) if isinstance(t, paddle.Tensor) and not t.stop_gradient]


class P2PAsyncHandle:
    """What `overlapped_forward_backward` gets as `p2p_async_handle` with
    overlap_p2p_comm (upstream's P2PAsyncHandle interface):

    - forward_handle_wait(): the forward's input is there (already, here: it is an
      argument of the call);
    - forward_async_comm(output_tensor): the forward's output may be sent now, while
      the backward half computes;
    - backward_handle_wait(): wait until the backward's output gradients
      (`backward_input_grads`, received into while the forward ran) are complete;
      call it before the first backward node reads them;
    - backward_async_comm(input_tensor_grad): the backward's input gradients may be
      sent now.
    """

    def __init__(self, forward_wait: Callable[[], None], forward_send: Callable[[Any], None],
                 backward_wait: Callable[[], None], backward_send: Callable[[Any], None]) -> None:
        self._forward_wait, self._forward_send = forward_wait, forward_send
        self._backward_wait, self._backward_send = backward_wait, backward_send
        self.forward_waited = self.forward_sent = False
        self.backward_waited = self.backward_sent = False

    def forward_handle_wait(self) -> None:
        self._forward_wait()
        self.forward_waited = True

    def forward_async_comm(self, output_tensor: Any) -> None:
        self._forward_send(output_tensor)
        self.forward_sent = True

    def backward_handle_wait(self) -> None:
        self._backward_wait()
        self.backward_waited = True

    def backward_async_comm(self, input_tensor_grad: Any) -> None:
        self._backward_send(input_tensor_grad)
        self.backward_sent = True

    # The spelling in #71995's description of the feature.
    backwatd_async_comm = backward_async_comm


class Interpreter:
    def __init__(self, program: StageProgram, actions: Sequence[Any], transport: P2P,
                 async_links: Optional[tuple[P2P, P2P]] = None, channel: str = "act") -> None:
        """async_links: (to, from) transports over this rank's one-way link groups; given,
        the transfers run on communication threads (async_p2p.py). channel: the name of
        this run's activation channels (their payload headers are cached per name)."""
        self.program = program
        self.actions = list(actions)
        self.channel = channel
        # No backward anywhere: an evaluation list (module docstring, Schedule.forward_only).
        self.forward_only = all(type(p) is F for a in self.actions for p in computes(a))
        self.p2p = transport
        self.async_links = async_links
        self.comm: Optional[CommThread] = None
        self.slots: dict[tuple[int, int], _Slot] = {}
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
        # the clock, so their spans line up into one measured timeline. With async_p2p
        # a transfer's span runs from when the thread posted it to when it finished, and a
        # compute's span leaves out the time it waited for a receive still in flight (its
        # start moves later by that much; `waited` sums those waits), so busy time is compute.
        self.spans: list[tuple[int, Any, float, float]] = []
        self.waited = 0.0

    def run(self) -> None:
        total = len(self.actions)
        clock = time.time
        if self.async_links is not None:
            send_p2p, recv_p2p = self.async_links
            self.comm = CommThread(send_p2p, recv_p2p, self.actions, self.program.rank, _release,
                                   clock, channel=self.channel).start()
        for position, action in enumerate(self.actions):
            if self.comm is not None and isinstance(action, Comm):
                continue  # the communication thread does it
            try:
                start = clock()
                waited = self.comm.waited if self.comm is not None else 0.0
                self._step(action)
                if self.comm is not None:
                    waited = self.comm.waited - waited
                    self.waited += waited
                    start += waited
                self.spans.append((position, action, start, clock()))
            except PipelineStepError:
                self._abort()
                raise
            except CommThreadError as err:
                self._abort()
                raise PipelineStepError(str(err)) from err
            except Exception as err:
                self._abort()
                raise PipelineStepError(
                    f"pipeline rank {self.program.rank}: action {action} (position {position} of "
                    f"{total} in this rank's schedule) failed: {type(err).__name__}: {err}") from err
        if self.comm is not None:
            try:
                self.comm.finish()
            except CommThreadError as err:
                raise PipelineStepError(str(err)) from err
            self.spans = sorted(self.spans + self.comm.events, key=lambda s: s[0])
        if self.slots:
            left = ", ".join(f"{c}.{m}" for c, m in sorted(self.slots))
            raise PipelineStepError(f"pipeline rank {self.program.rank}: schedule ended with work left for {left}")

    def _abort(self) -> None:
        if self.comm is not None:
            self.comm.abort()

    def _slot(self, chunk: int, mb: int) -> _Slot:
        return self.slots.setdefault((chunk, mb), _Slot())

    def _step(self, action: Any) -> None:
        if isinstance(action, F):
            self._forward(action.chunk, action.mb)
        elif isinstance(action, B):
            self._backward(action.chunk, action.mb)
        elif isinstance(action, I):
            self._input_backward(action.chunk, action.mb)
        elif isinstance(action, W):
            self._weight_backward(action.chunk, action.mb)
        elif isinstance(action, FB):
            self._forward_backward(action.f, action.b)
        elif isinstance(action, RecvAct):
            self._slot(action.chunk, action.mb).inputs = self.p2p.recv_activation(
                (self.channel, action.chunk), action.peer, str(action))
        elif isinstance(action, SendAct):
            slot = self.slots[(action.chunk, action.mb)]
            self.p2p.send_activation((self.channel, action.chunk), slot.outputs, action.peer, str(action))
            meta = PayloadMeta.of(slot.outputs)
            slot.output_grad_meta = [m for m in meta.tensors if not m.stop_gradient]
            slot.output_is_tuple = meta.is_tuple
            _release(slot.outputs)
            if self.forward_only:  # nothing else reads it
                self.slots.pop((action.chunk, action.mb))
        elif isinstance(action, RecvGrad):
            slot = self.slots[(action.chunk, action.mb)]
            slot.output_grads = self.p2p.recv_grads(slot.output_grad_meta, action.peer, str(action))
        elif isinstance(action, SendGrad):
            slot = self.slots.pop((action.chunk, action.mb))
            self.p2p.send_grads(slot.input_grads, action.peer, str(action))
        elif isinstance(action, GradSync):
            self.program.on_grad_sync(action.chunk)
        else:
            raise TypeError(f"unknown action {action!r}")

    # --- inputs and outputs, on this thread or through the communication thread ----------
    def _forward_input(self, chunk: int, mb: int) -> Any:
        prog, slot = self.program, self._slot(chunk, mb)
        if prog.is_first(chunk):
            slot.inputs = prog.first_input(mb)
        elif prog.hands_over(chunk):
            slot.inputs = _detached(self.slots[(0, mb)].outputs)
            if self.forward_only:  # chunk 0's output had no other reader
                self.slots.pop((0, mb))
        elif self.comm is not None:
            slot.inputs = self.comm.activation(chunk, mb)
        elif slot.inputs is None:
            raise RuntimeError(f"F{chunk}.{mb} has no input: its receive did not run before it")
        return slot.inputs

    def _output_grads(self, chunk: int, mb: int) -> list:
        slot = self.slots[(chunk, mb)]
        if self.program.hands_over(chunk + 1):
            if slot.output_grads is None:
                raise RuntimeError(f"B{chunk}.{mb} has no output gradient: chunk 1's backward of "
                                   f"micro-batch {mb} did not run before it (local hand-over)")
        elif self.comm is not None:
            slot.output_grads = self.comm.grads(chunk, mb)
        elif slot.output_grads is None:
            raise RuntimeError(f"B{chunk}.{mb} has no output gradient: its receive did not run before it")
        return slot.output_grads

    def _forward_done(self, chunk: int, mb: int, outputs: Any) -> None:
        slot = self.slots[(chunk, mb)]
        slot.outputs = outputs
        sent = self.comm is not None and self.comm.has(SendAct, chunk, mb)
        if sent:
            meta = self.comm.publish_activation(chunk, mb, outputs)
            slot.output_grad_meta = [m for m in meta.tensors if not m.stop_gradient]
            slot.output_is_tuple = meta.is_tuple
        if self.forward_only:
            # Let go unless a blocking SA or the V's local hand-over still reads the output.
            if outputs is None or sent:
                self.slots.pop((chunk, mb))
            return
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def _backward_done(self, chunk: int, mb: int, input_grads: Optional[list]) -> None:
        slot = self.slots[(chunk, mb)]
        if self.program.is_first(chunk):
            self.slots.pop((chunk, mb))
            return
        slot.input_grads = input_grads
        slot.inputs = slot.outputs = slot.loss = slot.output_grads = None
        slot.chunk = slot.loss_node = None
        if self.program.hands_over(chunk):  # to chunk 0 on this rank, no transfer
            self.slots.pop((chunk, mb))
            self.slots[(0, mb)].output_grads = input_grads
            return
        if self.comm is not None:
            self.slots.pop((chunk, mb))
            self.comm.publish_grads(chunk, mb, input_grads)

    # --- compute ----------------------------------------------------------------------
    def _capture(self, chunk: int, mb: int) -> contextlib.AbstractContextManager:
        """The split's capture for the forward of a (chunk, mb) whose backward is a split
        I (its parameter matmuls' dW deferred to W); else nothing."""
        split = self.program.split
        if split is not None and (chunk, mb) in self._split_keys:
            return split.capture(chunk, mb)
        return contextlib.nullcontext()

    def _forward(self, chunk: int, mb: int) -> None:
        prog, hooks = self.program, self.program.micro_steps
        inputs = self._forward_input(chunk, mb)
        slot = self.slots[(chunk, mb)]
        if hooks is not None:
            hooks.forward_begin(inputs)
        if prog.uses_nodes:
            slot.chunk = prog.schedule_chunk(chunk)
        with self._capture(chunk, mb):
            outputs = slot.chunk.forward(inputs) if prog.uses_nodes else prog.forward(inputs, chunk)
        if hooks is not None:
            hooks.forward_end(inputs, outputs)
        if prog.is_last(chunk):
            if prog.uses_nodes:
                slot.loss_node = prog.loss_node(mb)
                slot.loss = slot.loss_node.forward(outputs)
                prog.record_loss(slot.loss, outputs, mb)
            else:
                slot.loss = prog.loss(outputs, mb)
            outputs = None
        self._forward_done(chunk, mb, outputs)

    def _backward(self, chunk: int, mb: int) -> None:
        self.in_flight -= 1
        self._hooked_backward(chunk, mb, lambda: self._whole_backward(chunk, mb))

    def _hooked_backward(self, chunk: int, mb: int, run: Callable[[], Optional[list]]) -> None:
        """`run` (a backward of (chunk, mb) returning the input gradients it sends) between
        the user hooks' backward locations (micro_step_hooks.py), given hooks."""
        prog, hooks = self.program, self.program.micro_steps
        if hooks is None:
            run()
            return
        slot = self.slots[(chunk, mb)]
        inputs = None if prog.is_first(chunk) else slot.inputs  # as Paddle: no stage input on the first
        outputs = slot.loss if prog.is_last(chunk) else slot.outputs
        output_grads = None
        if hooks.wants_output_grads() and not prog.is_last(chunk):
            output_grads = self._grads_argument(chunk, mb, self._output_grads(chunk, mb))
        hooks.backward_begin(inputs, outputs, output_grads)
        input_grads = run()
        hooks.backward_end(inputs, outputs, input_grads, output_grads)

    def _whole_backward(self, chunk: int, mb: int) -> Optional[list]:
        """The backward of (chunk, mb) as the chunk ran: through its schedule nodes in node
        mode, else autograd over the chunk; returns the input gradients it sends. Inside
        `split.input_backward` it is an I."""
        if self.program.uses_nodes:
            return self._node_backward(chunk, mb)
        return self._plain_backward(chunk, mb)

    def _node_backward(self, chunk: int, mb: int) -> Optional[list]:
        """The loss node's backward on the last stage (else the received output gradients),
        then the chunk's nodes in reverse; then the input gradients to send."""
        prog, slot = self.program, self.slots[(chunk, mb)]
        if prog.is_last(chunk):
            grads = slot.loss_node.backward(scaler=prog.scaler)
        else:
            grads = self._grads_argument(chunk, mb, self._output_grads(chunk, mb))
        input_grads = slot.chunk.backward(grads)
        input_grads = None if prog.is_first(chunk) else _input_grads(slot.inputs, input_grads)
        self._backward_done(chunk, mb, input_grads)
        return input_grads

    def _plain_backward(self, chunk: int, mb: int) -> Optional[list]:
        """Autograd over the chunk from the loss or the received output gradients; then
        the input gradients to send."""
        prog, slot = self.program, self.slots[(chunk, mb)]
        if prog.is_last(chunk):
            prog.backward_loss(slot.loss)
        else:
            output_grads = self._output_grads(chunk, mb)
            paddle.autograd.backward(_requires_grad(slot.outputs), output_grads)
        input_grads = None
        if not prog.is_first(chunk):
            input_grads = [t.grad if t.grad is not None else paddle.zeros_like(t)
                           for t in _requires_grad(slot.inputs)]
        self._backward_done(chunk, mb, input_grads)
        return input_grads

    def _input_backward(self, chunk: int, mb: int) -> None:
        """I(chunk, mb): the backward with the deferrable weight gradients recorded for W."""
        prog = self.program
        if prog.split is None:
            raise RuntimeError(f"I{chunk}.{mb}: zero-bubble actions need the engine's split backward")
        self.in_flight -= 1
        if (chunk, mb) in self._fused:  # its W, next, has nothing left to do
            self._hooked_backward(chunk, mb, lambda: self._whole_backward(chunk, mb))
            return
        sent: list = []
        self._hooked_backward(chunk, mb, lambda: prog.split.input_backward(
            chunk, mb, lambda: sent.append(self._whole_backward(chunk, mb))) or sent[0])

    def _weight_backward(self, chunk: int, mb: int) -> None:
        """W(chunk, mb): the weight gradients its I deferred."""
        if self.program.split is None:
            raise RuntimeError(f"W{chunk}.{mb}: zero-bubble actions need the engine's split backward")
        if (chunk, mb) not in self._fused:
            self.program.split.weight_backward(chunk, mb)

    def _grads_argument(self, chunk: int, mb: int, grads: list) -> Any:
        """Output gradients as upstream hands them to a node backward: a tuple for a tuple
        payload, the tensor itself for a single one."""
        return tuple(grads) if self.slots[(chunk, mb)].output_is_tuple else grads[0]

    def _forward_backward(self, f: F, b: B) -> None:
        prog = self.program
        method = prog.overlapped_forward_backward
        if not prog.uses_nodes or method is None:
            self._forward(f.chunk, f.mb)
            self._backward(b.chunk, b.mb)
            return
        forward_inputs = self._forward_input(f.chunk, f.mb)
        if prog.micro_steps is not None:  # as Paddle's overlapped step: numbered hooks only
            prog.micro_steps.pair_begin()
        fslot, bslot = self.slots[(f.chunk, f.mb)], self.slots[(b.chunk, b.mb)]
        forward_chunk = prog.schedule_chunk(f.chunk)
        forward_loss_fn_node = prog.loss_node(f.mb) if prog.is_last(f.chunk) else None
        backward_loss_fn_node = bslot.loss_node if prog.is_last(b.chunk) else None
        handle = None
        grads_pending = False
        if prog.is_last(b.chunk):
            backward_input_grads = None
        elif (self.comm is not None and not prog.hands_over(b.chunk + 1)
              and not self.comm.grads_done(b.chunk, b.mb)):
            # Upstream's contract: the buffers are filled once backward_handle_wait() returns.
            grads_pending = True
            backward_input_grads = self._grads_argument(b.chunk, b.mb,
                                                        self.comm.grad_buffers(b.chunk, b.mb))
        else:
            backward_input_grads = self._grads_argument(b.chunk, b.mb, self._output_grads(b.chunk, b.mb))
        if self.comm is not None:
            handle = self._handle(f, b)
        # The forward half's parameter matmuls are split when its backward is an I; the
        # capture leaves the backward half's (another chunk's weights) alone.
        with self._capture(f.chunk, f.mb):
            forward_outputs, forward_loss, backward_grads = method(
                forward_chunk, forward_inputs, forward_loss_fn_node, bslot.chunk, backward_loss_fn_node,
                backward_input_grads, prog.scaler, p2p_async_handle=handle)
        if grads_pending and not handle.backward_waited:
            raise RuntimeError(
                "overlapped_forward_backward got a p2p_async_handle and returned without calling "
                "backward_handle_wait(): with overlap_p2p_comm the output gradients are still being "
                "received while it runs; call it before the first backward node")
        # The forward half.
        fslot.chunk = forward_chunk
        if prog.is_last(f.chunk):
            if forward_loss is None:
                raise RuntimeError("overlapped_forward_backward returned forward_loss None on the last "
                                   "stage: it must return forward_loss_fn_node.forward(outputs)")
            fslot.loss_node, fslot.loss = forward_loss_fn_node, forward_loss
            prog.record_loss(forward_loss, forward_outputs, f.mb)
            forward_outputs = None
        self._forward_done(f.chunk, f.mb, forward_outputs)
        # The backward half: its activation is freed after the forward made its own.
        self.in_flight -= 1
        if self.comm is not None and grads_pending:
            self.comm.grads(b.chunk, b.mb)  # done already (backward_handle_wait); re-raise errors
        input_grads = None if prog.is_first(b.chunk) else _input_grads(bslot.inputs, backward_grads)
        self._backward_done(b.chunk, b.mb, input_grads)

    def _handle(self, f: F, b: B) -> P2PAsyncHandle:
        prog, comm = self.program, self.comm
        assert comm is not None

        def forward_send(output_tensor: Any) -> None:
            if not prog.is_last(f.chunk) and comm.has(SendAct, f.chunk, f.mb):
                comm.publish_activation(f.chunk, f.mb, output_tensor)

        def backward_wait() -> None:
            if not prog.is_last(b.chunk) and not prog.hands_over(b.chunk + 1):  # a local hand-over has them
                comm.grads(b.chunk, b.mb)

        def backward_send(input_tensor_grad: Any) -> None:
            if not prog.is_first(b.chunk) and not prog.hands_over(b.chunk):
                grads = _input_grads(self.slots[(b.chunk, b.mb)].inputs, input_tensor_grad)
                comm.publish_grads(b.chunk, b.mb, grads)

        return P2PAsyncHandle(lambda: None, forward_send, backward_wait, backward_send)


def input_grad_meta(payload: Any) -> list[TensorMeta]:
    return [m for m in PayloadMeta.of(payload).tensors if not m.stop_gradient]
