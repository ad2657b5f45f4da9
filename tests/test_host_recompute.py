"""Unit host_recompute: Paddle's recompute on a CPU build replays dropout exactly.

Each recompute entry point (fleet.utils.recompute reentrant and not, recompute_sequential,
recompute_hybrid with and without offload) runs a block with two dropouts, one on the
global generator and one in the model-parallel RNG tracker's state, and must give
gradients bit for bit equal to the same step without recompute, and leave both generators
where that step leaves them (the next draws equal). The reference is the plain step;
preserve_rng_state=False shows that the comparison sees a wrong replay."""

import types

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F
import pytest
from paddle.distributed.fleet.layers.mpu.random import MODEL_PARALLEL_RNG, get_rng_state_tracker
from paddle.distributed.fleet.recompute.recompute_hybrid import recompute_hybrid
from paddle.distributed.fleet.utils import recompute
from paddle.incubate.distributed.fleet import recompute_sequential

from paddle_ext import compat, devices, upstream
from paddle_ext.patches import host_recompute, series
from paddle_ext.pipeline.runtime.slots import release as _release

pytestmark = pytest.mark.usefixtures("clean_series")
ONE_RANK = types.SimpleNamespace(nranks=1, rank=0)  # recompute_hybrid's mp_group without model parallelism


class DropoutBlock(nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x):
        h = F.dropout(F.gelu(self.up(x)), 0.5)
        with get_rng_state_tracker().rng_state():  # as fleet's model-parallel layers draw
            h = F.dropout(h, 0.3)
        return self.down(h)


def step(block, run):
    """One forward/backward from fixed seeds: the grads, and draws made after it on the
    global generator and in the tracker's state."""
    paddle.seed(11)
    tracker = get_rng_state_tracker()
    tracker.reset()
    tracker.add(MODEL_PARALLEL_RNG, 2024)
    block.clear_gradients()
    x = paddle.randn([4, 8])
    x.stop_gradient = False
    out = run(block, x)
    (out[0] if isinstance(out, tuple) else out).square().sum().backward()
    with tracker.rng_state():
        tracker_draw = paddle.rand([6])
    return {"up.weight": block.up.weight.grad.numpy().copy(), "down.weight": block.down.weight.grad.numpy().copy(),
            "x": x.grad.numpy().copy(), "next draw": paddle.rand([6]).numpy(), "next tracker draw": tracker_draw.numpy()}


RUNS = {
    "reentrant": lambda block, x: recompute(block, x),
    "non-reentrant": lambda block, x: recompute(block, x, use_reentrant=False),
    "sequential": lambda block, x: recompute_sequential({"segments": 1}, nn.Sequential(block), x),
    "hybrid": lambda block, x: recompute_hybrid({"mp_group": ONE_RANK}, block, x),
    "hybrid offload": lambda block, x: recompute_hybrid({"mp_group": ONE_RANK, "offload": True}, block, x),
}


@pytest.mark.parametrize("name", list(RUNS))
def test_recompute_replays_dropout_bitwise_and_leaves_the_generators_as_without(clean_series, name):
    clean_series.enable()
    paddle.seed(0)
    block = DropoutBlock()
    want = step(block, lambda b, x: b(x))
    got = step(block, RUNS[name])
    for key in want:
        assert np.array_equal(got[key], want[key]), f"{name}: {key} differs from the step without recompute"


def test_without_rng_replay_the_comparison_fails(clean_series):
    clean_series.enable()
    paddle.seed(0)
    block = DropoutBlock()
    want = step(block, lambda b, x: b(x))
    got = step(block, lambda b, x: recompute(b, x, preserve_rng_state=False))
    assert not np.array_equal(got["up.weight"], want["up.weight"])
    assert not np.array_equal(got["next draw"], want["next draw"])


def test_stock_paddle_refuses_the_cpu_where_the_unit_applies(clean_series):
    block = DropoutBlock()
    with pytest.raises(AssertionError, match="Recompute with RNG is not support current device: cpu"):
        step(block, RUNS["hybrid"])
    refusing = {name for _, name, _ in compat.recompute_cpu_refusals()}
    assert "forward" in refusing  # recompute_hybrid: 2.6 to 3.3
    if "_recompute_without_reentrant" in refusing:  # 2.6
        with pytest.raises(RuntimeError, match="not support current device: cpu"):
            step(block, RUNS["non-reentrant"])
    else:
        step(block, RUNS["non-reentrant"])


def test_the_copies_run_paddles_code_and_see_its_module_as_it_is(clean_series):
    clean_series.enable()
    assert series().verify() == []
    assert series().installed_by(vars(upstream.hybrid_recompute_layer())["forward"]) == "host_recompute"
    layer = upstream.hybrid_recompute_layer()
    copy = layer.forward
    assert copy.__code__ is copy.__wrapped__.__code__
    module = upstream.recompute_modules()[1]
    seen = []
    original = module.get_rng_state_tracker
    module.get_rng_state_tracker = lambda: seen.append("forward") or original()
    try:
        step(DropoutBlock(), RUNS["hybrid"])
    finally:
        module.get_rng_state_tracker = original
    assert seen == ["forward"]  # the copied forward read the module's current binding


def test_gpu_builds_are_left_to_paddle(monkeypatch):
    monkeypatch.setattr(devices, "device_build", lambda: "cuda")
    assert "cuda build" in host_recompute.UNIT.unavailable()


def test_a_sent_output_that_a_recompute_passed_through_keeps_its_data(clean_series):
    """The engine frees a stage's outputs once sent; recompute_hybrid's PyLayer returns an
    input it passes through (position ids, a mask) as an output marked modified in place
    (inplace_version 1), and its backward recomputes from that input. As fleet's
    PipelineParallel._release_output, such an output keeps its data (freed: "Tensor has
    not been initialized" in the recompute's backward)."""
    clean_series.enable()
    linear = nn.Linear(8, 8)
    hidden = paddle.randn([2, 8])
    hidden.stop_gradient = False
    ids = paddle.arange(2, dtype="int64")
    out, passed = recompute_hybrid({"mp_group": ONE_RANK}, lambda h, i: (F.dropout(linear(h), 0.5), i), hidden, ids)
    assert passed is ids and passed.inplace_version == 1
    _release((out, passed))
    assert not out._is_initialized() and passed._is_initialized()
    paddle.autograd.backward([out], [paddle.ones_like(hidden)])
    assert hidden.grad is not None and linear.weight.grad is not None
