"""Paddle's PipelineParallel surface of the engine (pipeline/fleet_surface.py), as trainers
drive it, on gloo: isinstance checks, members the engine does not offer, and
forward_backward_pipeline + the caller's 1/M scaling + the optimizer step bitwise equal
to train_batch, and Paddle's user hooks at the micro-steps (scripts/fleet_surface.py).
Needs no PaddleFormers."""

import pytest

from tests.multiproc.launch import launch

pytestmark = pytest.mark.multiprocess


def test_pipeline_parallel_surface():
    result = launch("fleet_surface.py", nproc=2, timeout=180)
    assert result.returncode == 0, result.describe()
    for rank in range(2):
        log = result.logs[rank]
        assert f"rank {rank}: vpp=2 M=5: forward_backward_pipeline == train_batch bitwise" in log, result.describe()
        assert f"rank {rank}: all surface checks passed" in log, result.describe()
        assert "with count_shared_weights_once = the model's" in log, result.describe()
        assert f"rank {rank}: forward_backward_pipeline(forward_only=True) == eval_batch" in log, result.describe()
        for vpp, m in ((1, 3), (2, 4)):
            assert f"rank {rank}: vpp={vpp} M={m}: user hooks and callbacks as Paddle runs them" in log, \
                result.describe()
            assert f"rank {rank}: vpp={vpp} M={m}: enable_timer lines and profiling records as Paddle's" in log, \
                result.describe()
