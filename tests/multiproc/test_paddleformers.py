"""PaddleFormers' Trainer trains through paddle_ext's pipeline engine (issue 14).

Real PaddleFormers (pip: paddleformers==1.2.0, `pip install .[paddleformers]`), its
Trainer and a tiny LlamaForCausalLMPipe on gloo ranks, against a single-process
LlamaForCausalLM with the same weights and data (scripts/paddleformers_trainer.py).
Skipped where PaddleFormers is not installed; ci/paddleformers.sh installs it.

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

pytest.importorskip("paddleformers.trainer", reason="PaddleFormers is not installed (pip install .[paddleformers])")

pytestmark = pytest.mark.multiprocess

# one launch per topology and strategy; configs that differ only in the plugin's own
# pp_configs (zb, zbd, cs, re: set through enable() per config), or only in the model (ph, gm, go), share
# their base's (zbv does not: PaddleFormers' TrainingArguments skip fleet.init once the parallel
# context exists, so a second Trainer in one process keeps the first one's strategy, here b's
# forward_backward_overlap_scheduler; fleet.init itself takes a second strategy, measured)
LAUNCHES = {"a,zb,ph,gm,go": 2, "a1": 2, "b": 2, "zbv": 2, "c,d,zbd,cs": 4, "f": 4, "g": 2, "h": 2, "i": 4, "e": 4, "j": 4, "k": 2, "l": 2, "m": 2,
            "n,x": 2, "o,y": 2, "p": 4, "q": 2, "r,re": 4, "s": 2, "t": 2, "u": 2, "v": 2, "w": 2, "z": 2, "rc": 2}
# Sharding stages 2 and 3, and stage 1 with split_param, keep the reduced gradients in
# buffers of their own, not in the .grad a callback reads: for them the parameters are the check.
# sharding stage 1 without pipeline parallelism: fleet's ShardingParallel wrapper
STAGE1_WITHOUT_PP = ("q", "s", "t", "u", "v", "w", "z")
NO_GRADIENT_VIEW = {"n", "o", "p", "q", "r", "re", "v", "w", "x", "y", "z"}


def of(results, name: str) -> dict:
    """Config `name`'s per-rank results, from the launch that runs it."""
    return results(next(k for k in LAUNCHES if name in k.split(",")))[name]


@pytest.fixture(scope="module")
def results():
    out = {}

    def run(names: str) -> dict:
        if names not in out:
            out[names] = launch_results("paddleformers_trainer.py", names, nproc=LAUNCHES[names], timeout=420)
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


CONFIGS = [name for launch_names in LAUNCHES for name in launch_names.split(",")]


@pytest.mark.parametrize("name", CONFIGS)
def test_trainer_parity(results, name):
    per_rank = of(results, name)
    _check_parity(per_rank, gradients=name not in NO_GRADIENT_VIEW)
    # Gemma 3's norms scale by 1 + w from w = 0: compared as that scale (compare() in the
    # script); a config's other parameters, and every other config's, as they are
    offset = per_rank[0]["unit_offset_weights"]
    assert bool(offset) == (name == "gm") and all(k.endswith("norm.weight") for k in offset), offset
    classes = per_rank[0]["classes"]
    if name == "m":  # no pipeline: fleet's own TensorParallel wrapper, on CPU
        assert classes[0] == "TensorParallel", classes
        return
    if name in ("n", "o", "x", "y", *STAGE1_WITHOUT_PP):  # no pipeline: Paddle's sharding wrappers
        wrapper = {"n": "GroupShardedStage2", "o": "GroupShardedStage3"}
        assert classes[0] == wrapper.get({"x": "n", "y": "o"}.get(name, name), "ShardingParallel"), classes
        return
    assert "PipelineParallel" in classes and classes[1] == "PipelineEngine"
    if name == "b":
        assert "PipelineParallelWithInterleave" in classes
    if name == "g":  # the Trainer's use_dualpipev: the plugin's DualPipeV on the V-segmented pipe
        assert [per_rank[0]["schedule"], per_rank[0]["placement"]] == ["dualpipev", "v"], per_rank[0]
    if name == "i":  # sequence parallelism: the norms' weights are sequence-parallel parameters
        assert all(r["sequence_parallel_params"] > 0 for r in per_rank.values()), per_rank
    if name == "l":  # ERNIE 4.5 with the fused ops on: flashmask, fused rope, fused RMSNorm (its default)
        for r in per_rank.values():
            assert [r["model"], r["attn_implementation"], r["rope_fusion"]] == [
                "Ernie4_5ForCausalLMPipe", "flashmask", True], r
    if name in ("ph", "gm", "go"):  # other model families on the same engine
        want = {"ph": "Phi3ForCausalLMPipe", "gm": "Gemma3ForCausalLMPipe", "go": "GptOssForCausalLMPipe"}[name]
        assert all(r["model"] == want for r in per_rank.values()), per_rank[0]["model"]
    if name in ("h", "l"):  # PaddleFormers' flashmask attention, its module's name imported before enable()
        for r in per_rank.values():
            assert [r["attn_implementation"], r["flashmask_unit"]] == ["flashmask", "flash_attention"], r


@pytest.mark.parametrize("name", ["c", "d", "f", "zbd", "cs"])
def test_gradient_clipping_takes_the_global_norm(results, name):
    """max_grad_norm > 0 (PaddleFormers' default is 1.0; here CLIP, below every step's norm, so
    that every step clips) at pp2 x dp2, with and without dp overlap, and pp2 x tp2: the
    global norm fleet's HybridParallelClipGrad takes over the stages and the tensor-parallel
    slices, after the engine's gradient reduction, equals the single process's gradients'
    (the tied embedding / head weight counted once per stage that holds it, as Paddle counts
    it, or once with the plugin's opt-in pp_configs.count_shared_weights_once: cs); the
    parameters of the clipped steps are held to the usual bounds (test_trainer_parity)."""
    for rank, r in of(results, name).items():
        assert len(r["grad_norms"]) == 3 and len(r["ref_grad_norms"]) == 3, (rank, r["grad_norms"])
        for got, want in zip(r["grad_norms"], r["ref_grad_norms"]):
            assert abs(got - want) <= 1e-6 * want, f"rank {rank}: global norms {r['grad_norms']} != {r['ref_grad_norms']}"
        assert min(r["grad_norms"]) > r["clip"], (rank, r["grad_norms"], r["clip"])


def test_dp_overlap_through_the_trainer_is_exact(results):
    both = {"c": of(results, "c"), "d": of(results, "d")}
    for rank in both["d"]:
        assert both["d"][rank]["dp_comm_overlap"] and not both["c"][rank]["dp_comm_overlap"]
        assert both["d"][rank]["losses"] == both["c"][rank]["losses"]
        assert both["d"][rank]["digest"] == both["c"][rank]["digest"], f"rank {rank}: overlap on != off"


def test_sharding_overlap_through_the_trainer_is_exact(results):
    """j: pp_sharding_comm_overlap (with the amp_master_grad PaddleFormers requires for it)
    against e without: the same parameters, bit for bit. Launches of their own: a second
    fleet.init in one process keeps the first strategy's pipeline configs (overlap off)."""
    both = {"e": of(results, "e"), "j": of(results, "j")}
    for rank in both["j"]:
        assert both["j"][rank]["sharding_comm_overlap"] and not both["e"][rank]["sharding_comm_overlap"]
        assert both["j"][rank]["main_grads"] > 0 and both["e"][rank]["main_grads"] == 0, rank
        assert both["j"][rank]["losses"] == both["e"][rank]["losses"]
        assert both["j"][rank]["digest"] == both["e"][rank]["digest"], f"rank {rank}: overlap on != off"


def test_split_param_sharding_overlap_through_the_trainer(results):
    """r: p (split_param, PaddleFormers' default) with pp_sharding_comm_overlap: the engine
    overlaps, reduce-scattering Paddle's FusedCommBuffers, which DygraphShardingOptimizerV2
    takes (bit for bit p: test_sharding_stage1_switches_leave_the_numbers_alone)."""
    both = {"p": of(results, "p"), "r": of(results, "r")}
    for rank in both["r"]:
        assert both["r"][rank]["sharding_comm_overlap"] and not both["p"][rank]["sharding_comm_overlap"]


# config -> (the config it must equal bit for bit, its sharding optimizer, the switches that
# optimizer must run with): PaddleFormers' sharding stage 1 switches
STAGE1_SWITCHES = {
    "t": ("s", "DygraphShardingOptimizer", {"tensor_fusion", "comm_overlap"}),
    "u": ("s", "DygraphShardingOptimizer", {"_broadcast_overlap"}),
    "v": ("q", "DygraphShardingOptimizerV2", {"comm_overlap"}),
    "w": ("q", "DygraphShardingOptimizerV2", {"_all_gather_overlap_forward"}),
    "z": ("q", "DygraphShardingOptimizerV2", {"sd_release_grads", "enable_fuse_optimizer_states"}),
    "r": ("p", "DygraphShardingOptimizerV2", {"pp_overlap", "sd_release_grads", "enable_fuse_optimizer_states"}),
    "re": ("p", "DygraphShardingOptimizerV2", {"pp_overlap", "sd_release_grads", "enable_fuse_optimizer_states"}),
}


@pytest.mark.parametrize("name", sorted(STAGE1_SWITCHES))
def test_sharding_stage1_switches_leave_the_numbers_alone(results, name):
    """PaddleFormers' sharding stage 1 switches (stage1_tensor_fusion with stage1_overlap,
    stage1_broadcast_overlap; with split_param stage1_overlap, stage1_allgather_overlap,
    sd_release_grads with fuse_optimizer_states, and at pp2 pp_sharding_comm_overlap with
    both releases): each runs on CPU with the optimizer switched as asked (the optimizer's
    fused state storage needed the host_sharding unit), and ends with the parameters of the
    same run without them, bit for bit."""
    base, cls, flags = STAGE1_SWITCHES[name]
    both = {base: of(results, base), name: of(results, name)}
    for rank, r in both[name].items():
        state = r["sharding_optimizer"]
        assert state["class"] == cls and {k for k, on in state.items() if on is True} == flags, (rank, state)
        assert both[base][rank]["sharding_optimizer"]["class"] == cls
        assert r["losses"] == both[base][rank]["losses"]
        assert r["digest"] == both[base][rank]["digest"], f"rank {rank}: {name} != {base}"


@pytest.mark.parametrize("plain, master", [("n", "x"), ("o", "y")])
def test_group_sharding_with_main_grads_is_exact(results, plain, master):
    """x / y: n / o (sharding stage 2 / 3) with amp_master_grad, a bf16 user's setting: the
    gradients accumulate in float32 main_grads (MixPrecisionLayer) and the stages take them;
    the same parameters as without, bit for bit."""
    both = results(f"{plain},{master}")
    for rank in both[master]:
        assert both[master][rank]["main_grads"] > 0 and both[plain][rank]["main_grads"] == 0, rank
        assert both[master][rank]["losses"] == both[plain][rank]["losses"]
        assert both[master][rank]["digest"] == both[plain][rank]["digest"], f"rank {rank}: main grads changed it"


def test_recompute_through_the_pipe_leaves_the_numbers_alone(results):
    """rc: a with every decoder layer recomputed in its backward (PaddleFormers'
    recompute_granularity "full"): fleet's recompute ran for every layer's forward of every
    micro-batch (4 layers over the 2 stages, 4 micro-batches, 3 steps), and the losses and
    parameters are a's, bit for bit."""
    a, rc = of(results, "a"), of(results, "rc")
    for rank in rc:
        assert rc[rank]["recomputed"] == 2 * 4 * 3 and a[rank]["recomputed"] == 0, (rank, rc[rank]["recomputed"])
        assert rc[rank]["losses"] == a[rank]["losses"]
        assert rc[rank]["digest"] == a[rank]["digest"], f"rank {rank}: recompute changed the parameters"


@pytest.mark.parametrize("name, base, kind", [("zb", "a", "zb-h1"), ("zbv", "b", "interleaved-zb"),
                                              ("zbd", "d", "zb-h1")])
def test_zero_bubble_through_the_trainer(results, name, base, kind):
    """The plugin's zero-bubble schedules, which PaddleFormers' TrainingArguments cannot name:
    pp_configs.schedule_mode set for the process through paddle_ext.enable()'s config. ZB-H1
    (zb, and zbd at pp2 x dp2 with dp overlap and clipping) and interleaved ZB (zbv, vpp2 over
    5 micro-batches) run as the engine's schedule and end with the parameters and losses of
    1F1B / VPP (a, d / b), bit for bit: a backward split into I and W computes the same
    gradients, in the same order per parameter."""
    runs, reference = of(results, name), of(results, base)
    for rank, r in runs.items():
        assert r["schedule"] == kind, (rank, r["schedule"])
        assert r["losses"] == reference[rank]["losses"]
        assert r["digest"] == reference[rank]["digest"], f"rank {rank}: {name} != {base}"


def test_shared_weights_counted_once_in_the_global_norm(results):
    """cs: c with the plugin's opt-in pp_configs.count_shared_weights_once: the tied embedding /
    head weight enters the clip's global norm from its first stage only, so the norm the
    Trainer logs is the single process's (test_gradient_clipping_takes_the_global_norm), below
    c's, which counts it on both stages as Paddle does."""
    c, cs = of(results, "c"), of(results, "cs")
    for rank in cs:
        assert all(once < twice for once, twice in zip(cs[rank]["grad_norms"], c[rank]["grad_norms"])), (
            rank, cs[rank]["grad_norms"], c[rank]["grad_norms"])


def test_every_pipeline_switch_leaves_the_numbers_alone(results):
    """k: PaddleFormers' other pipeline switches on (release grads, overlap_p2p_comm, ...)
    against a with them off: the same losses and parameters, bit for bit. Its `timer`
    reaches the engine as pp_configs enable_timer (the per-step timer line)."""
    a, k = of(results, "a"), of(results, "k")
    for rank in k:
        assert (k[rank]["enable_timer"], a[rank]["enable_timer"]) == (True, False), rank
        assert k[rank]["losses"] == a[rank]["losses"]
        assert k[rank]["digest"] == a[rank]["digest"], f"rank {rank}: the switches changed the parameters"


def test_resume_under_split_param_sharding_overlap_needs_early_comm_buffers(results):
    """r resumes from PaddleFormers' default FlexCheckpoint with the optimizer's states lost:
    DygraphShardingOptimizerV2 under pp sharding overlap takes the pipeline's buffers at its
    first step, after the Trainer loaded the checkpoint (PaddleFormers' behaviour, kept with
    the plugin's key off: fleet's code does the same). re, with the opt-in early_comm_buffers,
    resumes bit for bit (test_evaluate_and_resume) and trains as r does."""
    r, re = of(results, "r"), of(results, "re")
    for rank in r:
        assert r[rank]["resume_max_abs_diff"] > 1e-3, (rank, r[rank]["resume_max_abs_diff"])
        assert re[rank]["digest"] == r[rank]["digest"] and re[rank]["losses"] == r[rank]["losses"], rank


@pytest.mark.parametrize("name", ["a", "f", "m", "p", "re"])
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
