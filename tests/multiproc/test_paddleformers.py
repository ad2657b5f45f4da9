"""PaddleFormers' Trainer trains through paddle_ext's pipeline engine (issue 14).

Real PaddleFormers (pip: paddleformers==1.2.0, `pip install .[paddleformers]`), its
Trainer and a tiny LlamaForCausalLMPipe on gloo ranks, against a single-process
LlamaForCausalLM with the same weights and data (scripts/paddleformers_trainer.py).
Skipped where PaddleFormers is not installed; ci/paddleformers.sh installs it. The
configs are named records (trainer_configs.py): what each run sets and what it must show;
the tests below read them, one test per kind of expectation.

Bounds, per config (relative to the largest magnitude of each parameter / the loss):
- losses the Trainer logs: 1e-6 (it logs them rounded to 8 decimals);
- the first step's gradients, as the optimizer gets them: 1e-5 (GRAD_BOUND);
- parameters after 3 AdamW steps: 1e-5 (REL_BOUND), every config. Not bitwise: the
  tied embedding / lm-head gradient is summed across the first and last stage
  (PipelineLayer's shared-weight all-reduce) where the single process accumulates both
  into one gradient in backward order; data parallelism sums each shard's gradients
  before the all-reduce; tensor parallelism (f) splits every row-parallel matmul's inner
  sum (o_proj, down_proj) over 2 ranks, which puts ~1e-6 of each gradient's largest
  element into every first-step gradient (the single process with only those two sums
  split in halves measures the same: 1.2e-6). The rank script's AdamW uses epsilon 1e-4
  (ADAM_EPSILON, the Trainer's adam_epsilon and the reference's, every config): at the
  default 1e-8 a near-zero gradient element whose rounding differs moves its parameter by
  a sizeable part of lr (AdamW's slope is up to lr / eps), 1.3e-4 of the largest parameter
  for f and for that split single process alike.
- dp overlap on (d) and off (c) are bitwise equal (same collectives, same order); so are
  sharding overlap on (j) and off (e), and with split_param on (r: the engine reduce-scatters
  Paddle's FusedCommBuffers) and off (p: the optimizer reduces).
- n and o (sharding stages 2 and 3 without pipeline parallelism) clip too; p and q run
  sharding stage 1 with split_param (PaddleFormers' default), with and without pipeline
  parallelism, r p with sharding overlap. All five are held to the same bounds but for the first step's gradients,
  which those optimizers keep in buffers of their own.
- c, d and f clip gradients by their global norm (max_grad_norm, with the amp_master_grad
  PaddleFormers needs for it with pipeline parallelism): the norm the Trainer logs within
  1e-6 of the single process's, which clips its gradients the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.multiproc.launch import SCRIPTS
from tests.multiproc.trainer_checks import (
    GRAD_BOUND,
    LOSS_BOUND,
    REL_BOUND,
    check_losses_and_params,
    launch_results,
)
from tests.multiproc.trainer_configs import CONFIGS, launch_of

pytest.importorskip("paddleformers.trainer", reason="PaddleFormers is not installed (pip install .[paddleformers])")

pytestmark = pytest.mark.multiprocess


def of(results, name: str) -> dict:
    """Config `name`'s per-rank results, from the launch that runs it."""
    return results(launch_of(name))[name]


@pytest.fixture(scope="module")
def results():
    out = {}

    def run(names) -> dict:
        if names not in out:
            nproc = {CONFIGS[n].ranks for n in names}
            assert len(nproc) == 1, f"one launch, one topology: {names} {nproc}"
            out[names] = launch_results("paddleformers_trainer.py", ",".join(names), nproc=nproc.pop(), timeout=420)
        return out[names]

    return run


def _check_parity(per_rank: dict, gradients: bool = True) -> None:
    for rank, r in per_rank.items():
        if gradients:
            grads = {k: v for k, v in r["first_grads"].items() if v is not None}
            assert grads and len(grads) == len(r["first_grads"]) and min(grads.values()) >= 0, (
                f"rank {rank}: a gradient is missing")
            worst_grad = max(grads.values())
            assert worst_grad <= GRAD_BOUND, (
                f"rank {rank}: first-step gradient of {max(grads, key=grads.get)} differs by {worst_grad:.3g}")
        else:
            assert r["first_grads"] is None, rank
        check_losses_and_params(rank, r, steps=3)


def _check_classes(cfg, classes: list) -> None:
    """Without pipeline parallelism Paddle's own wrapper (cfg.wrapper: TensorParallel,
    GroupShardedStage2 / 3, ShardingParallel); with it fleet's PipelineParallel served by the
    plugin's PipelineEngine, also an instance of cfg.classes_include."""
    if cfg.wrapper is not None:
        assert classes[0] == cfg.wrapper, classes
        return
    assert "PipelineParallel" in classes and classes[1] == "PipelineEngine", classes
    assert set(cfg.classes_include) <= set(classes), (cfg.classes_include, classes)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_trainer_parity(results, name):
    """Every config within the bounds (module docstring), and as its record expects: the
    wrapper classes, the result values of `expect` (schedule, model class, attention, the
    engine's overlap flags...), sequence-parallel parameters where sequence_parallel,
    float32 main_grads or none, the stage 1 sharding optimizer and its switches."""
    cfg, per_rank = CONFIGS[name], of(results, name)
    _check_parity(per_rank, gradients=cfg.gradient_view)
    # Gemma 3's norms scale by 1 + w from w = 0: compared as that scale (compare() in the
    # script); a config's other parameters, and every other config's, as they are
    offset = per_rank[0]["unit_offset_weights"]
    assert bool(offset) == (cfg.model == "gemma3") and all(k.endswith("norm.weight") for k in offset), offset
    _check_classes(cfg, per_rank[0]["classes"])
    for rank, r in per_rank.items():
        assert {k: r[k] for k in cfg.expect} == dict(cfg.expect), (rank, {k: r[k] for k in cfg.expect})
        if cfg.sequence_parallel:  # the norms' weights are sequence-parallel parameters
            assert r["sequence_parallel_params"] > 0, (rank, r["sequence_parallel_params"])
        if cfg.main_grads is not None:
            assert (r["main_grads"] > 0) == cfg.main_grads, (rank, r["main_grads"])
        state = r["sharding_optimizer"]
        if cfg.sharding_optimizer is not None:
            assert state["class"] == cfg.sharding_optimizer, (rank, state)
        if cfg.sharding_switches is not None:
            assert {k for k, on in state.items() if on is True} == cfg.sharding_switches, (rank, state)


@pytest.mark.parametrize("name", [name for name, cfg in CONFIGS.items() if cfg.hybrid_clip])
def test_gradient_clipping_takes_the_global_norm(results, name):
    """max_grad_norm > 0 (PaddleFormers' default is 1.0; here CLIP, below every step's norm, so
    that every step clips) under pipeline parallelism (pp2 x dp2, with and without dp overlap,
    pp2 x tp2, ZB-H1): the global norm fleet's HybridParallelClipGrad takes over the stages and
    the tensor-parallel slices, after the engine's gradient reduction, equals the single
    process's gradients' (the tied embedding / head weight counted once per stage that holds
    it, as Paddle counts it, or once with the plugin's opt-in pp_configs.count_shared_weights_once:
    cs); the parameters of the clipped steps are held to the usual bounds (test_trainer_parity)."""
    for rank, r in of(results, name).items():
        assert len(r["grad_norms"]) == 3 and len(r["ref_grad_norms"]) == 3, (rank, r["grad_norms"])
        for got, want in zip(r["grad_norms"], r["ref_grad_norms"]):
            assert abs(got - want) <= 1e-6 * want, f"rank {rank}: global norms {r['grad_norms']} != {r['ref_grad_norms']}"
        assert min(r["grad_norms"]) > r["clip"], (rank, r["grad_norms"], r["clip"])


@pytest.mark.parametrize("name, base", [(n, base) for n, c in CONFIGS.items() for base in c.bitwise_as])
def test_switches_that_leave_the_numbers_alone(results, name, base):
    """A config whose record says bitwise_as=(base, ...) ends with base's losses and
    parameters, bit for bit: dp overlap (d / c) and sharding overlap (j / e) run the same
    collectives in the same order; the zero-bubble schedules (zb, zbv, zbd) split a backward
    into I and W computing the same gradients in the same order per parameter; PaddleFormers'
    sharding stage 1 switches (t, u / s; v, w, z / q; r, re / p), its other pipeline switches
    (k / a), full recompute (rc / a), main grads under stages 2 / 3 (x / n, y / o) change no
    number; re, resumed with its buffers handed over early, trains as r does."""
    runs, reference = of(results, name), of(results, base)
    for rank, r in runs.items():
        assert r["losses"] == reference[rank]["losses"], (rank, r["losses"], reference[rank]["losses"])
        assert r["digest"] == reference[rank]["digest"], f"rank {rank}: {name} != {base}"


@pytest.mark.parametrize("name, other", [(n, c.norm_below) for n, c in CONFIGS.items() if c.norm_below])
def test_shared_weights_counted_once_in_the_global_norm(results, name, other):
    """cs: c with the plugin's opt-in pp_configs.count_shared_weights_once: the tied embedding /
    head weight enters the clip's global norm from its first stage only, so the norm the
    Trainer logs is the single process's (test_gradient_clipping_takes_the_global_norm), below
    c's, which counts it on both stages as Paddle does."""
    once, twice = of(results, name), of(results, other)
    for rank in once:
        assert all(a < b for a, b in zip(once[rank]["grad_norms"], twice[rank]["grad_norms"])), (
            rank, once[rank]["grad_norms"], twice[rank]["grad_norms"])


@pytest.mark.parametrize("name", [name for name, cfg in CONFIGS.items() if cfg.resume_exact is False])
def test_resume_under_split_param_sharding_overlap_needs_early_comm_buffers(results, name):
    """r resumes from PaddleFormers' default FlexCheckpoint with the optimizer's states lost:
    DygraphShardingOptimizerV2 under pp sharding overlap takes the pipeline's buffers at its
    first step, after the Trainer loaded the checkpoint (PaddleFormers' behaviour, kept with
    the plugin's key off: fleet's code does the same). re, with the opt-in early_comm_buffers,
    resumes bit for bit (test_evaluate_and_resume) and trains as r does."""
    for rank, r in of(results, name).items():
        assert r["resume_max_abs_diff"] > 1e-3, (rank, r["resume_max_abs_diff"])


@pytest.mark.parametrize("name", [name for name, cfg in CONFIGS.items() if cfg.resume_exact])
def test_evaluate_and_resume(results, name):
    """f and m resume under tensor parallelism (f with pipeline parallelism and clipping):
    Paddle's FlexCheckpoint loader exchanges the slices between ranks, staged on the host
    by the host_checkpoint unit; p under sharding with split_param (the optimizer's states
    held in slices of its flat buffers); re with pp sharding overlap besides (its buffers
    the pipeline's, handed over early: early_comm_buffers)."""
    for rank, r in of(results, name).items():
        assert abs(r["eval_loss"] - r["ref_eval_loss"]) <= LOSS_BOUND * r["ref_eval_loss"], (rank, r["eval_loss"])
        assert r["resume_max_abs_diff"] == 0.0, f"rank {rank}: resumed run differs by {r['resume_max_abs_diff']}"


def test_row_parallel_sum_order_alone_needs_the_test_epsilon(tmp_path):
    """Why ADAM_EPSILON: the single-process reference with only its row-parallel sums split
    as tensor parallel 2 splits them (no collective, no engine) gives first-step gradients
    within GRAD_BOUND but, at AdamW's default epsilon, parameters beyond REL_BOUND; at the
    test's epsilon within it (scripts/paddleformers_split_rows.py)."""
    out = tmp_path / "split.json"
    script = os.path.join(SCRIPTS, "paddleformers_split_rows.py")
    proc = subprocess.run([sys.executable, script, str(out)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out) as f:
        res = json.load(f)
    for label in ("default", "test"):
        assert 0 < res[label]["first_grads"] <= GRAD_BOUND, res
    assert res["default"]["params"] > REL_BOUND, res
    assert res["test"]["params"] <= REL_BOUND, res
