"""paddle_ext.pipeline.micro_step_hooks without processes: Paddle's hook classes where
Paddle has them, its capacity and status checks, and what a changed accumulate_steps
does. The hooks inside a pipeline: tests/multiproc/test_fleet_surface.py."""

import pytest

from paddle_ext import compat
from paddle_ext.pipeline import micro_step_hooks
from paddle_ext.pipeline.micro_step_hooks import MicroStepHooks, hook_classes


def test_paddles_classes_and_global_list_where_paddle_has_them():
    hook_cls, callbacks, locations = hook_classes()
    if compat.pipeline_micro_step_hook_api() is None:  # Paddle 2.6
        assert hook_cls is micro_step_hooks._PipelineHook
    else:
        from paddle.distributed.fleet.meta_parallel import pipeline_parallel

        assert hook_cls is pipeline_parallel.PipelineHook
        assert callbacks is pipeline_parallel.pipeline_parallel_callbacks_
        assert locations is pipeline_parallel.PipelineParallelMicroStepLocations
    assert {loc.value for loc in locations} == {"forward_begin", "forward_end", "backward_begin", "backward_end"}


@pytest.mark.parametrize("own", [False, True])
def test_numbered_hooks_run_in_order_within_the_capacity(monkeypatch, own):
    if own:  # the classes paddle_ext brings for 2.6
        monkeypatch.setattr(compat, "pipeline_micro_step_hook_api", lambda: None)
    hooks = MicroStepHooks(capacity=3)
    ran = []
    hooks.forward_hooks.register_hook(1, ran.append)
    with pytest.raises(AssertionError, match="hook_id 3 is out of range, maximum capacity is 3"):
        hooks.forward_hooks.register_hook(3, ran.append)
    for _ in range(3):
        hooks.forward_begin(None)
        hooks.forward_end(None, None)
    assert ran == [1]
    hooks.check_step_end(3)
    with pytest.raises(AssertionError, match="forward hooks status is not correct, current id is 3, expected id is 4"):
        hooks.check_step_end(4)  # a step that ran fewer forwards than Paddle counts on
    with pytest.raises(AssertionError, match="hook_id 3 is out of range"):
        hooks.forward_begin(None)  # a fourth forward with a hook registered: Paddle's assertion
    hooks.reset()
    hooks.forward_begin(None)
    hooks.forward_begin(None)
    assert ran == [1, 1]


def test_without_numbered_hooks_a_step_may_outgrow_the_capacity():
    """Paddle runs run_hook at every micro-step, registered or not, so its pipeline fails on
    accumulate_steps raised after construction; the engine takes that (fleet_surface) and
    keeps it while no numbered hook is registered."""
    hooks = MicroStepHooks(capacity=2)
    for _ in range(5):
        hooks.forward_begin(None)
        hooks.backward_begin(None, None, None)
        hooks.backward_end(None, None, None, None)
    hooks.check_step_end(5)


def test_eval_runs_callbacks_only_and_1f1b_eval_passes_step_id_none(monkeypatch):
    monkeypatch.setattr(compat, "pipeline_micro_step_hook_api", lambda: None)
    hooks = MicroStepHooks(capacity=1)
    seen = []
    hooks.callbacks.register_hook(hooks.locations.FORWARD_BEGIN, lambda **kw: seen.append(kw))
    hooks.forward_hooks.register_hook(0, lambda i: seen.append(i))
    try:
        hooks.enabled, hooks.step_ids = False, False
        hooks.forward_begin("x")
        hooks.forward_end("x", "y")
        assert seen == [{"input_tensor": "x", "step_id": None}]
        hooks.check_step_end(99)  # disabled: nothing to check, as Paddle's eval
    finally:
        hooks.callbacks.hooks[hooks.locations.FORWARD_BEGIN].clear()
