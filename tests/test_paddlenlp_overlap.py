"""Unit paddleformers_overlap for PaddleNLP: its TrainingArguments refuse the word
`enable_dp_comm_overlap` of pipeline_parallel_config with pipeline parallelism ("overlap has
accuracy issue"); the unit lifts that refusal only while paddle_ext's engine serves fleet's
models, and only where the word means dp overlap alone.

PaddleNLP's set-up runs as on rank 0 of 4 (pp2 x dp2): paddle.distributed's world size is 4,
no parallel context exists yet, and fleet.init records the strategy it is given (stored as
fleet's own, which the engine reads) instead of starting a job. The training job itself is
tests/multiproc/test_paddlenlp.py's."""

from __future__ import annotations

import copy
import tempfile

import pytest

import paddle_ext
from paddle_ext import trainer_overlap as impl
from paddle_ext import upstream

training_args = pytest.importorskip("paddlenlp.trainer.training_args", reason="PaddleNLP is not installed")


@pytest.fixture(autouse=True)
def clean():
    paddle_ext.disable()
    yield
    paddle_ext.disable()


@pytest.fixture
def four_ranks(monkeypatch):
    """Installs the fake 4-rank world; call it after enable() (monkeypatch then restores
    what the plugin had in place, and the clean fixture's disable() Paddle's own).
    Returns the strategies fleet.init was given, as they were then."""
    import paddle.distributed as dist
    import paddle.distributed.fleet as fleet
    from paddle.distributed.parallel import parallel_helper

    given = []

    def init(is_collective=False, strategy=None, **kwargs):
        given.append(copy.deepcopy(strategy))
        fleet.fleet._user_defined_strategy = strategy

    def install():
        monkeypatch.setattr(dist, "get_world_size", lambda *a: 4)
        monkeypatch.setattr(fleet, "init", init)
        monkeypatch.setattr(parallel_helper, "_is_parallel_ctx_initialized", lambda: False)
        monkeypatch.setattr(fleet.fleet, "_user_defined_strategy", None, raising=False)
        return given

    return install


def make_args(words: str, **extra):
    return training_args.TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="paddle_ext_nlp_args_"), local_rank=0, do_train=True,
        pipeline_parallel_degree=2, pipeline_parallel_config=words, **extra)


def pp_config(strategy, key):
    return getattr(strategy.hybrid_configs["pp_configs"], key)


def test_refused_without_the_plugin(four_ranks):
    four_ranks()
    with pytest.raises(ValueError, match=impl.REFUSAL):
        make_args("enable_dp_comm_overlap")


def test_refused_while_the_engine_does_not_serve(monkeypatch, four_ranks):
    monkeypatch.setenv("PADDLE_EXT_PATCHES", "pipeline_engine=off")
    paddle_ext.enable()
    assert {n: s for n, _, s, _ in paddle_ext.patch_table()}["paddleformers_overlap"] == "applied"
    assert not impl.engine_serves()
    four_ranks()
    with pytest.raises(ValueError, match=impl.REFUSAL):
        make_args("enable_dp_comm_overlap")


def test_lifted_while_the_engine_serves(four_ranks):
    """The arguments keep the word (the Trainer reads it: it then leaves the dp reduction to
    the engine); PaddleNLP set fleet up with the key off and every other word as it reads
    them; fleet's strategy, which the engine reads, has it on afterwards."""
    paddle_ext.enable()
    assert impl.engine_serves()
    given = four_ranks()
    args = make_args("enable_dp_comm_overlap enable_delay_scale_loss")
    assert args.pipeline_parallel_config == "enable_dp_comm_overlap enable_delay_scale_loss"
    assert (args.pipeline_parallel_degree, args.data_parallel_degree) == (2, 2)
    assert len(given) == 1
    assert (pp_config(given[0], "dp_comm_overlap"), pp_config(given[0], "delay_scale_loss")) == (False, True)
    strategy = upstream.fleet_strategy()
    assert (pp_config(strategy, "dp_comm_overlap"), pp_config(strategy, "delay_scale_loss")) == (True, True)
    assert strategy.hybrid_configs["dp_degree"] == 2 and strategy.hybrid_configs["pp_degree"] == 2


@pytest.mark.parametrize("words, extra, error", [
    # PaddleNLP reads either word as one comm-overlap request: beside dp alone the sharding
    # word means dp overlap too, and its Trainer, which reads only the dp word, would
    # all-reduce what the engine reduced: the refusal stays
    ("enable_sharding_comm_overlap", {}, impl.REFUSAL),
    # with sharding asked for the dp word means sharding overlap (dp degree 1 here), which
    # PaddleNLP checks itself: the word stays, and PaddleNLP decides as without the plugin
    ("enable_dp_comm_overlap", dict(sharding="stage1", sharding_parallel_degree=2),
     "`amp_master_grad` must be True"),
    # auto parallel (no fleet.distributed_model, so no engine) knows no such word
    ("enable_dp_comm_overlap", dict(enable_auto_parallel=True, gradient_accumulation_steps=2),
     "unknown pipeline mode config enable_dp_comm_overlap"),
])
def test_kept_where_the_word_means_more(four_ranks, words, extra, error):
    four_ranks()
    with pytest.raises((ValueError, AssertionError), match=error) as without:
        make_args(words, **extra)
    paddle_ext.enable()
    assert impl.engine_serves()
    with pytest.raises(without.type, match=error) as with_plugin:
        make_args(words, **extra)
    assert str(with_plugin.value) == str(without.value)
