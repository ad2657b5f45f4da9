"""User hooks at the pipeline's micro-steps, as fleet's PipelineParallel runs them (Paddle 3.0+).

Paddle's PipelineParallel offers two kinds, and users reach both through its names:

- Callbacks at four locations of every forward and backward micro-step
  (`PipelineParallelMicroStepLocations`: FORWARD_BEGIN, FORWARD_END, BACKWARD_BEGIN,
  BACKWARD_END), called with keyword arguments: input_tensor, output_tensor,
  output_tensor_grad, input_tensor_grad (those the location has) and step_id. The list is
  global (`register_global_pipeline_parallel_hook`, or the model's `register_hook`):
  trainers that never see the wrapped model register there. They run in training and in
  eval_batch alike.
- Numbered hooks (`register_forward_pipeline_parallel_hook(location, hook)` and its
  backward twin): location k's hooks run, with k, at the start of this rank's k-th forward
  (backward) of a training step; there are vpp * accumulate_steps locations, fixed when the
  model is built (`*_pipeline_parallel_hook_capacity`). PaddleFormers' zero-cost
  checkpoint copies the parameters out in those slots. Not in eval_batch. Bubble hooks:
  capacity 0, registering raises ValueError, as Paddle's.

What each argument is, as Paddle passes it: input_tensor is the stage input (the
micro-batch itself on the first stage's forward, None in the first stage's backward);
output_tensor is the chunk's output at FORWARD_END and, on the last stage, the loss at the
backward locations; output_tensor_grad the received output gradients (None on the last
stage); input_tensor_grad the gradients the backward sends back (None on the first
stage); step_id the ordinal of this forward (backward) on this rank in the step (the
micro-batch for 1F1B), None in a 1F1B eval_batch. A tuple payload gives tuples. An
overlapped F&B step (forward_backward_overlap_scheduler with the model's
overlapped_forward_backward) runs the forward's and then the backward's numbered hooks and
no callbacks, as Paddle's. A zero-bubble I is the backward (its W runs no hook). The V
placement runs none of them: Paddle's DualPipeVParallel does not either.

On Paddle 2.6, which has none of this, the same interface is paddle_ext's own (the
callbacks then are this module's global list).
"""

from __future__ import annotations

import enum
from collections import defaultdict
from typing import Any, Callable, Optional

from paddle_ext import compat

__all__ = ["MicroStepHooks", "hook_classes"]


class _Locations(enum.Enum):
    """Paddle 3.x's PipelineParallelMicroStepLocations, for 2.6."""

    FORWARD_BEGIN = "forward_begin"
    FORWARD_END = "forward_end"
    BACKWARD_BEGIN = "backward_begin"
    BACKWARD_END = "backward_end"


class _Callbacks:
    """Paddle 3.x's PipelineParallelMicroStepCallback, for 2.6."""

    def __init__(self) -> None:
        self.hooks: dict[Any, list[Callable]] = {loc: [] for loc in _Locations}

    def register_hook(self, location: Any, hook: Callable) -> None:
        assert location in self.hooks, (f"Invalid location '{location}'. Valid locations are 'forward_begin', "
                                        "'forward_end', 'backward_begin', or 'backward_end'.")
        self.hooks[location].append(hook)

    def on_location(self, location: Any, **kwargs: Any) -> None:
        for hook in self.hooks[location]:
            hook(**kwargs)


class _PipelineHook:
    """Paddle 3.x's PipelineHook (numbered hooks with a capacity), for 2.6."""

    def __init__(self) -> None:
        self.hooks: dict[int, list[Callable]] = defaultdict(list)
        self._hooks_capacity = 0
        self._current_id = 0

    def reset_current_id(self) -> None:
        self._current_id = 0

    def set_hooks_capacity(self, capacity: int) -> None:
        self._hooks_capacity = capacity

    def register_hook(self, hook_id: int, hook: Callable) -> None:
        assert hook_id < self._hooks_capacity, (
            f"hook_id {hook_id} is out of range, maximum capacity is {self._hooks_capacity}.")
        self.hooks[hook_id].append(hook)

    def run_hook(self) -> None:
        assert self._current_id < self._hooks_capacity, (
            f"hook_id {self._current_id} is out of range, maximum capacity is {self._hooks_capacity}.")
        for hook in self.hooks[self._current_id]:
            hook(self._current_id)
        self._current_id += 1

    @property
    def current_id(self) -> int:
        return self._current_id

    @property
    def hooks_capacity(self) -> int:
        return self._hooks_capacity


_OWN_CALLBACKS = _Callbacks()


def hook_classes() -> tuple[type, Any, Any]:
    """(PipelineHook class, the global callbacks, the locations enum): Paddle's where it
    has them (3.0+), else this module's."""
    paddles = compat.pipeline_micro_step_hook_api()
    return paddles if paddles is not None else (_PipelineHook, _OWN_CALLBACKS, _Locations)


def _argument(payload: Any, tensors: Optional[list]) -> Any:
    """Gradients as Paddle hands them to a hook: a tuple for a tuple payload, else the
    one tensor (None when there is none)."""
    if tensors is None:
        return None
    if isinstance(payload, (tuple, list)):
        return tuple(tensors)
    return tensors[0] if tensors else None


class MicroStepHooks:
    """The hooks of one engine: Paddle's state (forward_hooks, backward_hooks, callbacks,
    enabled) and what the interpreter calls at each compute action."""

    def __init__(self, capacity: int) -> None:
        hook_cls, self.callbacks, self.locations = hook_classes()
        self.forward_hooks = hook_cls()
        self.forward_hooks.set_hooks_capacity(capacity)
        self.backward_hooks = hook_cls()
        self.backward_hooks.set_hooks_capacity(capacity)
        self.enabled = True  # Paddle's user_hooks_enabled: numbered hooks in training only
        self.step_ids = True  # False: callbacks get step_id None (1F1B eval_batch)
        self._forwards = self._backwards = 0

    def reset(self) -> None:
        """A step (or an eval_batch) begins."""
        self.forward_hooks.reset_current_id()
        self.backward_hooks.reset_current_id()
        self._forwards = self._backwards = 0

    def check_step_end(self, expected: int) -> None:
        """Paddle's _check_user_hooks_status_at_step_end (where numbered hooks are
        registered: see _run)."""
        if not self.enabled:
            return
        for name, hooks in (("forward", self.forward_hooks), ("backward", self.backward_hooks)):
            if hooks.hooks:
                assert hooks.current_id == expected, (f"{name} hooks status is not correct, current id is "
                                                      f"{hooks.current_id}, expected id is {expected}")

    def _run(self, hooks: Any) -> None:
        """Paddle's run_hook, where any numbered hook is registered. Paddle runs it at every
        micro-step, so a step with more micro-steps than the capacity fails there with no
        hook registered too; the engine takes a changed accumulate_steps (fleet_surface),
        and keeps that unless a hook would be skipped."""
        if self.enabled and hooks.hooks:
            hooks.run_hook()

    def _wants(self, location: str) -> bool:
        return bool(self.callbacks.hooks.get(getattr(self.locations, location)))

    def _call(self, location: str, **kwargs: Any) -> None:
        self.callbacks.on_location(getattr(self.locations, location), **kwargs)

    # --- what the interpreter calls ------------------------------------------------------
    def forward_begin(self, inputs: Any) -> None:
        self._run(self.forward_hooks)
        if self._wants("FORWARD_BEGIN"):
            self._call("FORWARD_BEGIN", input_tensor=inputs, step_id=self._step_id(self._forwards))

    def forward_end(self, inputs: Any, outputs: Any) -> None:
        if self._wants("FORWARD_END"):
            self._call("FORWARD_END", input_tensor=inputs, output_tensor=outputs,
                       step_id=self._step_id(self._forwards))
        self._forwards += 1

    def wants_output_grads(self) -> bool:
        """Whether a backward callback takes output_tensor_grad (the interpreter then has
        the received gradients ready before the backward; they may be in flight)."""
        return self._wants("BACKWARD_BEGIN") or self._wants("BACKWARD_END")

    def backward_begin(self, inputs: Any, outputs: Any, output_grads: Any) -> None:
        self._run(self.backward_hooks)
        if self._wants("BACKWARD_BEGIN"):
            self._call("BACKWARD_BEGIN", input_tensor=inputs, output_tensor=outputs,
                       output_tensor_grad=output_grads, step_id=self._step_id(self._backwards))

    def backward_end(self, inputs: Any, outputs: Any, input_grads: Optional[list], output_grads: Any) -> None:
        if self._wants("BACKWARD_END"):
            self._call("BACKWARD_END", input_tensor=inputs, output_tensor=outputs,
                       input_tensor_grad=_argument(inputs, input_grads), output_tensor_grad=output_grads,
                       step_id=self._step_id(self._backwards))
        self._backwards += 1

    def pair_begin(self) -> None:
        """An overlapped F&B step: the forward's numbered hooks, then the backward's."""
        self._run(self.forward_hooks)
        self._run(self.backward_hooks)
        self._forwards += 1
        self._backwards += 1

    def _step_id(self, ordinal: int) -> Optional[int]:
        return ordinal if self.step_ids else None
