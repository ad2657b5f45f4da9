"""Paddle's recompute on a CPU build, its RNG replay included.

A recompute saves the random state at its forward and sets it again around the
recomputation in the backward, so that dropout draws the same masks twice and the
gradients equal those of a run without recompute; after the recomputation the state
in force before it comes back, so later draws match too. Paddle does this through
`paddle.get_rng_state()` / `set_rng_state()` (the current device's generators: on a
CPU build the CPU generator) and the model-parallel tracker's
`get_states_tracker()` / `set_states_tracker()`, which follow the current device
as well. What refuses the CPU is a device check in front of that:

- `_HPRecomputeFunction.forward` (recompute_hybrid: PipelineLayer's
  `recompute_interval`, MoE layers) asserts "Recompute with RNG is not support current
  device: cpu" on every release from 2.6 to 3.3;
- 2.6's `_recompute_without_reentrant` (`fleet.utils.recompute(...,
  use_reentrant=False)`) raises "Recompute with RNG perserve is not support current
  device: cpu" (3.x saves `paddle.get_rng_state()` on CPU there itself).

Both checks accept a custom device type and save `paddle.get_rng_state()` for it,
which on a CPU build is exactly the CPU generator's state. `cpu_accepting(function)`
is a copy of such a function (the same code object, defaults and closure) that reads
its global `paddle` through a view in which `paddle.device.get_all_custom_device_type()`
also names 'cpu': nothing else of Paddle's code changes, and every other global
is read from Paddle's module as it is at the call (a later rebinding there is seen).

`host_backward(backward)`: recompute_hybrid's `offload` copies the saved inputs to the
host (`.cpu()`, as Paddle's own recompute does for offloaded inputs on CPU) and
`partition` keeps each model-parallel rank's slice of them; the backward brings them
back with `.cuda()` (and gathers the slices of a GPU copy over the group). On a CPU
build the host is where they belong: for the length of such a backward `Tensor.cuda`
answers the tensor itself (host_checkpoint.cuda_stays_on_host), so the gather runs on
gloo. A backward without offload or partition runs untouched.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable

from paddle_ext.host_checkpoint import cuda_stays_on_host


class _DeviceView:
    """paddle.device, whose get_all_custom_device_type() also names 'cpu'."""

    def __init__(self, device: types.ModuleType) -> None:
        self._device = device

    def get_all_custom_device_type(self) -> list[str]:
        return [*(self._device.get_all_custom_device_type() or []), "cpu"]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._device, name)


class _PaddleView:
    """The paddle module as recompute's device check reads it: `device` is the view above,
    every other attribute paddle's own."""

    def __init__(self, paddle: types.ModuleType) -> None:
        self._paddle = paddle
        self.device = _DeviceView(paddle.device)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._paddle, name)


class _Globals(dict):
    """A function's globals: its own few entries (the paddle view), else its module's
    live namespace. A function whose globals are not exactly a dict reads each global
    through __getitem__ (CPython's slow path), which falls back to __missing__ here."""

    def __init__(self, module_globals: dict, overrides: dict) -> None:
        super().__init__(overrides)
        self["__builtins__"] = module_globals.get("__builtins__", __builtins__)
        self._module_globals = module_globals

    def __missing__(self, name: str) -> Any:
        return self._module_globals[name]


def cpu_accepting(function: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of Paddle's `function` whose device check accepts the CPU as it accepts a
    custom device (see the module's docstring); `__wrapped__` is the original."""
    import paddle

    code_globals = _Globals(function.__globals__, {"paddle": _PaddleView(paddle)})
    copy = types.FunctionType(function.__code__, code_globals, function.__name__, function.__defaults__,
                              function.__closure__)
    copy.__kwdefaults__ = function.__kwdefaults__
    functools.update_wrapper(copy, function)
    return copy


def host_backward(backward: Callable[..., Any]) -> Callable[..., Any]:
    """recompute_hybrid's backward with its offloaded or partitioned inputs brought back
    on the host (see the module's docstring)."""

    @functools.wraps(backward)
    def wrapper(ctx: Any, *grads: Any) -> Any:
        if not (ctx.offload or ctx.partition):
            return backward(ctx, *grads)
        with cuda_stays_on_host():
            return backward(ctx, *grads)

    return wrapper
