"""PipelineLayer's recompute_interval on gloo (unit host_recompute): fleet.distributed_model's
train_batch at pp2 and pp2 x vpp2 with dropout, bit for bit the run without recompute, and
recompute_hybrid's partition over two ranks; one launch."""

import re

import pytest

from tests.multiproc.launch import launch

pytestmark = pytest.mark.multiprocess

PAIRS = "1:4,2:4:offload"


def test_recompute_interval_equals_no_recompute_bitwise_with_dropout():
    result = launch("recompute_parity.py", PAIRS, nproc=2, timeout=240)
    assert result.returncode == 0, result.describe()
    for rank in range(2):
        log = result.logs[rank]
        assert f"rank {rank}: all recompute modes passed" in log, result.describe()
        found = re.findall(rf"rank {rank}: pp=2 vpp=(\d) M=4 offload=(\w+): recompute_interval=1 bitwise equal", log)
        assert found == [("1", "False"), ("2", "True")], result.describe()
        assert f"rank {rank}: partition over 2 ranks bitwise equal" in log, result.describe()
