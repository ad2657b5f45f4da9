"""Paddle's group_sharded_parallel (sharding stages 2 and 3) on gloo with paddle_ext
enabled (unit host_sharding): stock Paddle asserts a GPU, XPU or custom device."""

import re

import pytest

from tests.multiproc.launch import launch

pytestmark = pytest.mark.multiprocess


@pytest.mark.parametrize("level, model_class, optimizer_class", [
    ("os_g", "GroupShardedStage2", "GroupShardedOptimizerStage2"),
    ("p_g_os", "GroupShardedStage3", "AdamW"),
])
def test_group_sharded_training_matches_one_process(level, model_class, optimizer_class):
    result = launch("group_sharded.py", level, nproc=2, timeout=150)
    assert result.returncode == 0, result.describe()
    for rank in (0, 1):
        assert f"rank {rank}: {model_class} {optimizer_class}" in result.logs[rank], result.describe()
        found = re.search(rf"rank {rank}: {level} parameters after 3 clipped steps differ by (\S+)", result.logs[rank])
        assert found, result.describe()
        assert float(found.group(1)) <= 1e-6, found.group(0)


def test_a_level_paddle_refuses_is_refused_as_paddle_refuses_it():
    result = launch("group_sharded.py", "bad-level", nproc=2, timeout=150)
    assert result.returncode == 0, result.describe()
    for rank in (0, 1):
        assert f"rank {rank}: AssertionError: The level must be os, os_g or p_g_os." in result.logs[rank]
