"""fleet's ParallelCrossEntropy on gloo with paddle_ext enabled (unit parallel_cross_entropy):
Paddle registers its op, c_softmax_with_cross_entropy, for GPU and XPU only."""

import pytest

from tests.multiproc.launch import launch

pytestmark = pytest.mark.multiprocess

# The two-rank modes share one launch (a launch's fixed cost, Paddle's import in the launcher
# and each rank, was most of each test's CPU time), in this order: each refusal before another
# mode, which then finds the group in step. Three ranks: a launch of their own.
TWO_RANK_MODES = ("parity-float32", "bad-label", "empty", "bad-rows", "parity-float16", "bad-dtype")


@pytest.fixture(scope="module")
def two_ranks():
    return launch("parallel_cross_entropy.py", ",".join(TWO_RANK_MODES), nproc=2, timeout=240)


@pytest.mark.parametrize("dtype, nproc", [("float32", 2), ("float64", 3), ("float16", 2)])
def test_parallel_cross_entropy_matches_numpy(two_ranks, dtype, nproc):
    result = two_ranks if nproc == 2 else launch("parallel_cross_entropy.py", f"parity-{dtype}", nproc=nproc,
                                                  timeout=150)
    assert result.returncode == 0, result.describe()
    for rank in range(nproc):
        assert f"rank {rank}: parallel cross entropy matches numpy ({dtype})" in result.logs[rank]


def test_no_rows(two_ranks):
    result = two_ranks
    assert result.returncode == 0, result.describe()
    for rank in (0, 1):
        assert f"rank {rank}: no rows, no loss" in result.logs[rank]


def test_label_out_of_range_on_one_rank_raises_on_every_rank(two_ranks):
    result = two_ranks
    assert result.returncode == 0, result.describe()
    assert ("rank 1: ValueError: c_softmax_with_cross_entropy: label[1, 2, 0] = 10 is out of range: labels must "
            "lie in [0, classes) = [0, 10)") in result.logs[1], result.describe()
    assert "or equal ignore_index = -100" in result.logs[1]
    assert "rank 0: ValueError: c_softmax_with_cross_entropy: rank(s) [1] of the group refused" in result.logs[0]
    for rank in (0, 1):
        assert f"rank {rank}: the group goes on" in result.logs[rank]


@pytest.mark.parametrize("mode, message", [
    # ranks holding different row counts: a ValueError listing them
    ("bad-rows", "ValueError: c_softmax_with_cross_entropy: the ranks of the group hold [6, 8] rows of logits "
                 "(in rank order)"),
    # a dtype the GPU kernel lacks: Paddle's error type for an unregistered kernel
    ("bad-dtype", "RuntimeError: c_softmax_with_cross_entropy: logits dtype bfloat16 is not supported: "
                  "Paddle's GPU kernel takes float32, float64, float16"),
])
def test_arguments_refused_on_every_rank(two_ranks, mode, message):
    result = two_ranks
    assert result.returncode == 0, result.describe()
    for rank in (0, 1):
        assert f"rank {rank}: {message}" in result.logs[rank], result.describe()
        # every refusal of the launch left the group in step
        assert result.logs[rank].count(f"rank {rank}: the group goes on") == 3, result.describe()
