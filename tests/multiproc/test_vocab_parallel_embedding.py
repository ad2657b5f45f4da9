"""fleet's VocabParallelEmbedding and TensorParallel wrapper (mp_degree=2) on gloo with
paddle_ext enabled."""

import pytest

from tests.multiproc.launch import launch

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def passing_modes():
    """The modes that end well share one launch (its fixed cost, Paddle's import in the
    launcher and each rank, was most of each test's CPU time)."""
    return launch("vocab_parallel_embedding.py", "parity,tp-inputs,parity-float64", nproc=2, timeout=200)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_vocab_parallel_embedding_equals_full_table(passing_modes, dtype):
    result = passing_modes
    assert result.returncode == 0, result.describe()
    for rank in (0, 1):
        assert f"rank {rank}: vocab-parallel embedding matches the full table ({dtype})" in result.logs[rank]


def test_out_of_range_id_on_one_rank_ends_every_rank_with_the_message():
    result = launch("vocab_parallel_embedding.py", "bad-id", nproc=2, timeout=150)
    assert not result.timed_out, result.describe()
    assert result.returncode != 0, result.describe()
    assert result.elapsed < 60, result.describe()
    assert "ids[1, 3] = 13 is out of range" in result.logs[1], result.describe()
    assert "[0, vocab_size) = [0, 10)" in result.logs[1]
    assert "matches the full table" not in result.all_text()


def test_tensor_parallel_wrapper_gives_every_rank_the_first_ranks_inputs(passing_modes):
    """fleet's TensorParallel broadcasts the inputs over the model-parallel group (stock
    Paddle asserts a GPU there; the gloo_calc_stream unit's CPU path)."""
    result = passing_modes
    assert result.returncode == 0, result.describe()
    for rank in (0, 1):
        assert f"rank {rank}: tensor-parallel inputs are rank 0's" in result.logs[rank]
