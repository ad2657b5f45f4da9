"""reduce_scatter and all_to_all on gloo (the gloo_calc_stream unit; stock Paddle raises
"ProcessGroupGLOO does not support ...") on 3 ranks, against numpy."""

import re

import pytest

from tests.multiproc.launch import launch

pytestmark = pytest.mark.multiprocess

RANKS = 3


def passed(log: str) -> set[str]:
    return set(re.findall(r"rank \d+: (.+) ok", log))


def test_every_form_equals_numpy():
    result = launch("gloo_exchange.py", "values", nproc=RANKS, timeout=180)
    assert result.returncode == 0 and not result.timed_out, result.describe()
    for rank in range(RANKS):
        cases = passed(result.logs[rank])
        assert {"reduce_scatter tensor float32", "reduce_scatter tensor bfloat16", "reduce_scatter list",
                "reduce_scatter tensor max calc_stream", "reduce_scatter tensor async", "reduce_scatter 3-d", "reduce_scatter records no gradient",
                "alltoall list from 2", "alltoall list calc_stream", "alltoall_single even",
                "alltoall_single uneven", "alltoall_single empty pairs",
                "enable after groups warns"} <= cases, (rank, cases)


def test_bad_arguments_raise_on_every_rank_and_leave_the_group_in_step():
    result = launch("gloo_exchange.py", "refusals", nproc=RANKS, timeout=180)
    assert result.returncode == 0 and not result.timed_out, result.describe()
    for rank in range(RANKS):
        assert passed(result.logs[rank]) == {
            "reduce_scatter bad shape on rank 1", "alltoall_single sizes not summing",
            "alltoall_single sizes disagreeing", "group still in step"}, result.describe()
