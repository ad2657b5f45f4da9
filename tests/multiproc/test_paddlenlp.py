"""PaddleNLP's Trainer trains through paddle_ext's pipeline engine with dp comm overlap.

Real PaddleNLP (2.8.1 on Paddle 2.6.2: ci/paddlenlp.sh installs it with its pins), its
Trainer and a tiny LlamaForCausalLMPipe on 4 gloo ranks, pp2 x dp2, with and without the
`enable_dp_comm_overlap` word of pipeline_parallel_config, which PaddleNLP refuses with
pipeline parallelism and unit paddleformers_overlap lets through while the engine serves,
each also with `enable_delay_scale_loss`, the pairing the refusal's TODO names
(scripts/paddlenlp_trainer.py: configs d, c, ds, cs). Skipped where PaddleNLP is not installed.

Every run against a single-process LlamaForCausalLM with the same weights and data, within
test_paddleformers.py's bounds (trainer_checks: losses 1e-6, parameters after 3 AdamW steps
1e-5; not bitwise: the single process sums the two dp shards' gradients in another order);
and overlap on against off bit for bit: the engine's overlapped dp reduction is the same
all-reduce of the same sums, scaled the same way, as the Trainer's after the backward.
"""

from __future__ import annotations

import pytest

from tests.multiproc.trainer_checks import check_losses_and_params, launch_results

pytest.importorskip("paddlenlp.trainer", reason="PaddleNLP is not installed (ci/paddlenlp.sh)")

pytestmark = pytest.mark.multiprocess

STEPS = 3


@pytest.fixture(scope="module")
def results():
    return launch_results("paddlenlp_trainer.py", nproc=4, timeout=300)


CONFIGS = {"d": "enable_dp_comm_overlap", "c": "", "ds": "enable_dp_comm_overlap enable_delay_scale_loss",
           "cs": "enable_delay_scale_loss"}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_trainer_parity(results, name):
    per_rank = results[name]
    assert sorted(per_rank) == [0, 1, 2, 3], sorted(per_rank)
    for rank, r in per_rank.items():
        check_losses_and_params(rank, r, STEPS)
        assert r["classes"][1] == "PipelineEngine" and "PipelineParallel" in r["classes"], r["classes"]
        assert r["data_parallel_degree"] == 2, r["data_parallel_degree"]
        # the words stay in the arguments, where the Trainer reads them
        assert r["pipeline_parallel_config"] == CONFIGS[name], r["pipeline_parallel_config"]
        assert r["delay_scale_loss"] is ("enable_delay_scale_loss" in CONFIGS[name]), (rank, r["delay_scale_loss"])
        # PaddleNLP's TrainingArguments patched when PaddleNLP loaded after enable() (the import hook)
        assert r["lifted_by"] == "paddleformers_overlap", r["lifted_by"]


@pytest.mark.parametrize("on, off", [("d", "c"), ("ds", "cs")])
def test_dp_overlap_through_the_trainer_is_exact(results, on, off):
    """With the word the engine overlapped the dp reduction and fleet's optimizer reduced
    nothing in its step (the Trainer neither); without it the engine did not, and the
    optimizer did. The same losses and parameters, bit for bit."""
    for rank in results[on]:
        r_on, r_off = results[on][rank], results[off][rank]
        assert (r_on["dp_comm_overlap"], r_on["optimizer_reduces"]) == (True, False), (rank, r_on)
        assert (r_off["dp_comm_overlap"], r_off["optimizer_reduces"]) == (False, True), (rank, r_off)
        assert r_on["losses"] == r_off["losses"]
        assert r_on["digest"] == r_off["digest"], f"rank {rank}: {on} (overlap on) != {off} (off)"
