"""A PipelineLayer with a tied weight under sep_degree 2 (patches/shared_comm_sep.py):
Paddle 2.6 and 3.0 built its groups with the sep halves' member lists mismatched and
failed in the constructor; the unit builds one group per pipe line, as Paddle 3.1 does."""

import pytest

from paddle_ext import compat
from paddle_ext.patches.shared_comm_sep import NATIVE_FROM
from tests.multiproc.launch import launch

pytestmark = pytest.mark.multiprocess

# pp2 x sep2 in fleet's axis order (data, pipe, sharding, sep, model): rank = 2 * pipe + sep
PIPE_LINES = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}


def test_tied_weight_groups_follow_the_pipe_lines_and_synchronise_the_tie():
    result = launch("shared_comm_sep.py", nproc=4, timeout=180)
    assert result.returncode == 0, result.describe()
    for rank, line in PIPE_LINES.items():
        log = result.logs[rank]
        assert f"rank {rank}: tie group built {line}" in log, result.describe()
        if compat.paddle_version() < NATIVE_FROM:
            assert f"rank {rank}: plugin's construction {line}" in log, result.describe()
        assert f"rank {rank}: tied weight equals rank {line[0]}'s: True" in log, result.describe()
