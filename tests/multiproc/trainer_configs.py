"""PaddleFormers' Trainer runs of test_paddleformers.py as named records: what each run
sets (TrainingArguments, the model, the plugin's pp_configs) and what the tests expect of
its results. scripts/paddleformers_trainer.py reads the first part by name,
test_paddleformers.py the second; neither branches on a config's name. Pure Python: the
test imports it without Paddle, a rank script from the checkout (sys.path).

Every run trains a tiny model of the family `model` (LlamaForCausalLMPipe by default) 3
steps through Trainer.train() against a single-process model with the same weights and
data; the bounds (trainer_checks) hold for every config, the expectations below on top.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Mapping, Optional, Tuple

SEQ = 8  # the rank script's sequence length: the documents' bounds below
# max_grad_norm of the configs that clip: below every step's global norm here (1.6 to 3.3),
# so that every step clips.
CLIP = 0.5
RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}


@dataclass(frozen=True)
class TrainerConfig:
    """One Trainer run (`about`: what it shows) and its expectations."""

    name: str
    about: str
    acc: int  # gradient_accumulation_steps: micro-batches per step and replica
    # -- the run: TrainingArguments
    pp: int = 2
    vpp: int = 1  # virtual stages (the model config's virtual_pipeline_model_parallel_size)
    v: bool = False  # use_dualpipev: the pipe V-segmented (paddle_ext.pipeline.v_layer.v_segmented)
    dp: int = 1
    tp: int = 1
    sequence_parallel: bool = False
    gathered_logits: bool = False  # tensor_parallel_output=False: the head's logits gathered (c_concat)
    sharding: int = 1
    stage: str = "stage1"
    split_param: bool = False
    sharding_overlap: bool = False  # pp_sharding_comm_overlap
    dp_comm_overlap: bool = False
    fb_overlap: bool = False  # forward_backward_overlap_scheduler
    clip: float = 0.0  # max_grad_norm
    master_grad: bool = False  # amp_master_grad where nothing else asks for it
    switches: Mapping[str, bool] = field(default_factory=dict)  # more TrainingArguments, as given
    plugin_pp: Mapping[str, Any] = field(default_factory=dict)  # the plugin's pp_configs, via enable()
    # -- the run: the model and the data
    model: str = "llama"  # family: the rank script's MODELS
    attn: str = "eager"  # the pipe's _attn_implementation
    rope_fusion: bool = False  # apply_rope_fusion
    documents: Tuple[int, ...] = (0, SEQ)  # bounds of the documents of each sample
    model_config: Mapping[str, Any] = field(default_factory=dict)  # set on the model config
    plain_reference: bool = False  # the reference with Paddle's plain RMSNorm (fuse_rms_norm off)
    eval_resume: bool = False  # then evaluate(), and a run saved at step 2 and resumed
    # -- expectations
    expect: Mapping[str, Any] = field(default_factory=dict)  # result key -> value on every rank
    wrapper: Optional[str] = None  # without pipeline parallelism: the model's wrapper class
    classes_include: Tuple[str, ...] = ()  # classes the wrapped model is also an instance of
    bitwise_as: Tuple[str, ...] = ()  # configs whose losses and parameters it equals bit for bit
    main_grads: Optional[bool] = None  # float32 main_grads at the first step (True) or none (False)
    resume_exact: Optional[bool] = None  # the resumed run equals the uninterrupted one (or not)
    norm_below: Optional[str] = None  # its clipped global norms are below this config's
    sharding_optimizer: Optional[str] = None  # the stage 1 sharding optimizer's class
    sharding_switches: Optional[FrozenSet[str]] = None  # the switches it runs with (the rest off)

    @property
    def ranks(self) -> int:
        return self.pp * self.dp * self.tp * self.sharding

    @property
    def replicas(self) -> int:
        """Data-parallel replicas: a step takes acc micro-batches per replica."""
        return self.dp * self.sharding

    @property
    def amp_master_grad(self) -> bool:
        """PaddleFormers wants amp_master_grad (with bf16) for sharding overlap and
        split_param, and clips under pipeline parallelism only with it."""
        return self.sharding_overlap or self.split_param or self.master_grad or (self.clip > 0 and self.pp > 1)

    @property
    def gradient_view(self) -> bool:
        """Whether a callback reads the reduced gradients in .grad: sharding stages 2 and 3
        and split_param keep them in buffers of their own (the parameters are the check)."""
        return self.stage not in ("stage2", "stage3") and not self.split_param

    @property
    def hybrid_clip(self) -> bool:
        """Clipped by fleet's HybridParallelClipGrad (pipeline parallelism), whose global
        norm the Trainer logs."""
        return self.clip > 0 and self.pp > 1


_SWITCHES_K = {"pp_release_grads": True, "overlap_p2p_comm": True, "clear_every_step_cache": True,
               "best_unbalanced_scheduler": True, "offload_queue": True, "variable_seq_lengths": True,
               "pp_sync_param": True, "pp_sync_moment": True, "timer": True}
_RELEASE = {"pp_release_grads": True, "sd_release_grads": True, "fuse_optimizer_states": True}
_V1, _V2 = "DygraphShardingOptimizer", "DygraphShardingOptimizerV2"

RECORDS = (
    TrainerConfig("a", "pp2 1F1B, accumulation 4; evaluate() against the reference's eval loss, and the resume",
                  acc=4, eval_resume=True, resume_exact=True, expect={"recomputed": 0, "enable_timer": False}),
    TrainerConfig("a1", "pp2 1F1B, accumulation 1 (the Trainer's default: fewer micro-batches than stages, "
                  "which fleet's PipelineParallel takes)", acc=1),
    TrainerConfig("b", "pp2 vpp2, accumulation 5, forward_backward_overlap_scheduler", acc=5, vpp=2,
                  fb_overlap=True, classes_include=("PipelineParallelWithInterleave",)),
    TrainerConfig("c", "pp2 x dp2, gradients clipped by their global norm (max_grad_norm = CLIP, with the "
                  "amp_master_grad PaddleFormers needs for it with pipeline parallelism)", acc=4, dp=2, clip=CLIP,
                  expect={"dp_comm_overlap": False}),
    TrainerConfig("d", "c with dp_comm_overlap: the same collectives in the same order", acc=4, dp=2,
                  dp_comm_overlap=True, clip=CLIP, expect={"dp_comm_overlap": True}, bitwise_as=("c",)),
    TrainerConfig("e", "pp2 x sharding2 stage 1", acc=4, sharding=2,
                  expect={"sharding_comm_overlap": False}, main_grads=False),
    TrainerConfig("f", "pp2 x tensor parallel 2, the head's logits gathered (c_concat) for the plain cross "
                  "entropy, gradients clipped as in c; evaluate() and the resume as a's (FlexCheckpoint "
                  "exchanging the slices, staged on the host: unit host_checkpoint)", acc=4, tp=2,
                  gathered_logits=True, clip=CLIP, eval_resume=True, resume_exact=True),
    TrainerConfig("g", "pp2 use_dualpipev, accumulation 5: the Trainer's use_dualpipev on the plugin's DualPipeV, "
                  "the pipe V-segmented", acc=5, v=True, expect={"schedule": "dualpipev", "placement": "v"}),
    TrainerConfig("h", "pp2 1F1B, the pipe's attention PaddleFormers' flashmask (the plugin's FlashMask kernel, "
                  "its module's name imported before enable()) over samples of two documents; the reference's "
                  "eager attention with the mask PaddleFormers builds from the same rows", acc=4,
                  attn="flashmask", documents=(0, 3, SEQ),
                  expect={"attn_implementation": "flashmask", "flashmask_unit": "flash_attention"}),
    TrainerConfig("i", "pp2 x tensor parallel 2 with sequence_parallel: a reduce-scatter after each row-parallel "
                  "linear (gloo's, unit gloo_calc_stream); the logits split over the vocabulary (fleet's "
                  "ParallelCrossEntropy, unit parallel_cross_entropy); the norms' weights sequence-parallel "
                  "parameters", acc=4, tp=2, sequence_parallel=True),
    TrainerConfig("j", "e with pp_sharding_comm_overlap (amp_master_grad, bf16 O2, whose casts Paddle skips on "
                  "CPU: float32 compute, float32 main_grads): e's parameters bit for bit", acc=4, sharding=2,
                  sharding_overlap=True, expect={"sharding_comm_overlap": True}, main_grads=True,
                  bitwise_as=("e",)),
    TrainerConfig("k", "a with every other pipeline switch of PaddleFormers' TrainingArguments on; its timer "
                  "reaches the engine as pp_configs enable_timer", acc=4, switches=_SWITCHES_K,
                  expect={"enable_timer": True}, bitwise_as=("a",)),
    TrainerConfig("l", "ERNIE 4.5 (dense) with the fused ops a GPU user turns on (flashmask over two documents, "
                  "fused rotary, fused RMSNorm), served on CPU by the plugin; the reference runs none of them",
                  acc=4, model="ernie4_5", attn="flashmask", rope_fusion=True, documents=(0, 5, SEQ),
                  plain_reference=True,
                  expect={"model": "Ernie4_5ForCausalLMPipe", "attn_implementation": "flashmask",
                          "rope_fusion": True, "flashmask_unit": "flash_attention"}),
    TrainerConfig("m", "tensor parallel 2 without pipeline parallelism: fleet's TensorParallel wrapper (its input "
                  "broadcast on CPU: unit gloo_calc_stream); evaluate() and the resume, resharding the slices "
                  "over gloo (unit host_checkpoint)", acc=4, tp=2, pp=1, eval_resume=True, resume_exact=True,
                  wrapper="TensorParallel"),
    TrainerConfig("n", "sharding stage 2 without pipeline parallelism (GroupShardedStage2, unit host_sharding), "
                  "gradients clipped", acc=4, sharding=2, pp=1, stage="stage2", clip=CLIP,
                  wrapper="GroupShardedStage2", main_grads=False),
    TrainerConfig("o", "n with stage 3 (every rank a slice of each parameter, gathered before the comparison)",
                  acc=4, sharding=2, pp=1, stage="stage3", clip=CLIP, wrapper="GroupShardedStage3",
                  main_grads=False),
    TrainerConfig("x", "n with amp_master_grad (bf16, no number changed on CPU): float32 main_grads, which stage "
                  "2 takes", acc=4, sharding=2, pp=1, stage="stage2", clip=CLIP, master_grad=True,
                  wrapper="GroupShardedStage2", main_grads=True, bitwise_as=("n",)),
    TrainerConfig("y", "o with amp_master_grad", acc=4, sharding=2, pp=1, stage="stage3", clip=CLIP,
                  master_grad=True, wrapper="GroupShardedStage3", main_grads=True, bitwise_as=("o",)),
    TrainerConfig("p", "pp2 x sharding2 stage 1 with split_param (PaddleFormers' default: "
                  "DygraphShardingOptimizerV2 reduce-scatters, the engine reduces none); evaluate() and the "
                  "resume, the optimizer's slices resharded", acc=4, sharding=2, split_param=True,
                  eval_resume=True, resume_exact=True, expect={"sharding_comm_overlap": False},
                  sharding_optimizer=_V2),
    TrainerConfig("ph", "a with Phi-3 (fused qkv and gate-up projections, untied head)", acc=4, model="phi3",
                  expect={"model": "Phi3ForCausalLMPipe"}),
    TrainerConfig("gm", "a with Gemma 3 (scaled embedding, tied head, q/k norms, sliding-window layers whose "
                  "window spans the sequence; its norms scale by 1 + w)", acc=4, model="gemma3",
                  expect={"model": "Gemma3ForCausalLMPipe"}),
    TrainerConfig("go", "a with GPT-OSS (a mixture of 4 experts, 2 per token, in every layer)", acc=4,
                  model="gptoss", expect={"model": "GptOssForCausalLMPipe"}),
    TrainerConfig("rc", "a with every decoder layer recomputed in its backward (recompute_granularity full): "
                  "fleet's recompute for each layer's forward of every micro-batch (2 layers a stage x 4 "
                  "micro-batches x 3 steps)", acc=4, model_config=RECOMPUTE, expect={"recomputed": 2 * 4 * 3},
                  bitwise_as=("a",)),
    TrainerConfig("zb", "a on ZB-H1 (pp_configs.schedule_mode through enable(), which TrainingArguments cannot "
                  "name): a backward split into I and W computes the same gradients in the same order",
                  acc=4, plugin_pp={"schedule_mode": "ZBH1"}, expect={"schedule": "zb-h1"}, bitwise_as=("a",)),
    TrainerConfig("zbv", "b's shape on interleaved ZB (vpp2, 5 micro-batches)", acc=5, vpp=2,
                  plugin_pp={"schedule_mode": "ZBVPP"}, expect={"schedule": "interleaved-zb"}, bitwise_as=("b",)),
    TrainerConfig("zbd", "d on ZB-H1 (pp2 x dp2, dp overlap, clipping)", acc=4, dp=2, dp_comm_overlap=True,
                  clip=CLIP, plugin_pp={"schedule_mode": "ZBH1"}, expect={"schedule": "zb-h1"}, bitwise_as=("d",)),
    TrainerConfig("cs", "c with the plugin's opt-in count_shared_weights_once: the tied embedding / head weight "
                  "enters the clip's global norm from its first stage only (the single process's norm), below "
                  "c's, which counts it on both stages as Paddle does", acc=4, dp=2, clip=CLIP,
                  plugin_pp={"count_shared_weights_once": True}, norm_below="c"),
    TrainerConfig("q", "sharding stage 1 with split_param without pipeline parallelism", acc=4, sharding=2, pp=1,
                  split_param=True, wrapper="ShardingParallel", sharding_optimizer=_V2),
    TrainerConfig("r", "p with pp_sharding_comm_overlap: the optimizer takes the engine's buckets (Paddle's "
                  "FusedCommBuffers), reduce-scattered during the backward; with pp_release_grads, "
                  "sd_release_grads and fuse_optimizer_states. Its resume from the default FlexCheckpoint "
                  "loses the optimizer's states (the buffers handed over at the first step, after the load, as "
                  "in fleet's code)", acc=4, sharding=2, split_param=True, sharding_overlap=True,
                  eval_resume=True, switches=_RELEASE, resume_exact=False, expect={"sharding_comm_overlap": True},
                  sharding_optimizer=_V2,
                  sharding_switches=frozenset({"pp_overlap", "sd_release_grads", "enable_fuse_optimizer_states"}),
                  bitwise_as=("p",)),
    TrainerConfig("re", "r with the plugin's opt-in early_comm_buffers: the optimizer holds the pipeline's buffers "
                  "before the checkpoint is loaded, so the resume restores its states", acc=4, sharding=2,
                  split_param=True, sharding_overlap=True, eval_resume=True, switches=_RELEASE,
                  plugin_pp={"early_comm_buffers": True}, resume_exact=True, sharding_optimizer=_V2,
                  sharding_switches=frozenset({"pp_overlap", "sd_release_grads", "enable_fuse_optimizer_states"}),
                  bitwise_as=("p", "r")),
    TrainerConfig("s", "sharding stage 1 without pipeline parallelism (DygraphShardingOptimizer in fleet's "
                  "ShardingParallel)", acc=4, sharding=2, pp=1, wrapper="ShardingParallel", sharding_optimizer=_V1),
    TrainerConfig("t", "s with stage1_tensor_fusion and stage1_overlap", acc=4, sharding=2, pp=1,
                  switches={"stage1_tensor_fusion": True, "stage1_overlap": True}, wrapper="ShardingParallel",
                  sharding_optimizer=_V1, sharding_switches=frozenset({"tensor_fusion", "comm_overlap"}),
                  bitwise_as=("s",)),
    TrainerConfig("u", "s with stage1_broadcast_overlap", acc=4, sharding=2, pp=1,
                  switches={"stage1_broadcast_overlap": True}, wrapper="ShardingParallel", sharding_optimizer=_V1,
                  sharding_switches=frozenset({"_broadcast_overlap"}), bitwise_as=("s",)),
    TrainerConfig("v", "q with stage1_overlap (the optimizer's own reduce-scatter hooks)", acc=4, sharding=2, pp=1,
                  split_param=True, switches={"stage1_overlap": True}, wrapper="ShardingParallel",
                  sharding_optimizer=_V2, sharding_switches=frozenset({"comm_overlap"}), bitwise_as=("q",)),
    TrainerConfig("w", "q with stage1_allgather_overlap", acc=4, sharding=2, pp=1, split_param=True,
                  switches={"stage1_allgather_overlap": True}, wrapper="ShardingParallel", sharding_optimizer=_V2,
                  sharding_switches=frozenset({"_all_gather_overlap_forward"}), bitwise_as=("q",)),
    TrainerConfig("z", "q with sd_release_grads and fuse_optimizer_states (the optimizer's FusionStorage, unit "
                  "host_sharding)", acc=4, sharding=2, pp=1, split_param=True,
                  switches={"sd_release_grads": True, "fuse_optimizer_states": True}, wrapper="ShardingParallel",
                  sharding_optimizer=_V2,
                  sharding_switches=frozenset({"sd_release_grads", "enable_fuse_optimizer_states"}),
                  bitwise_as=("q",)),
)
CONFIGS: Dict[str, TrainerConfig] = {c.name: c for c in RECORDS}

# One launch per topology and strategy; configs that differ only in the plugin's own
# pp_configs (zb, zbd, cs, re: set through enable() per config), or only in the model (ph, gm,
# go), share their base's. zbv does not: PaddleFormers' TrainingArguments skip fleet.init once
# the parallel context exists, so a second Trainer in one process keeps the first one's
# strategy, here b's forward_backward_overlap_scheduler (fleet.init itself takes a second
# strategy, measured); nor do configs with another accumulation count.
LAUNCHES: Tuple[Tuple[str, ...], ...] = (
    ("a", "zb", "ph", "gm", "go"), ("a1",), ("b",), ("zbv",), ("c", "d", "zbd", "cs"), ("f",), ("g",), ("h",),
    ("i",), ("e",), ("j",), ("k",), ("l",), ("m",), ("n", "x"), ("o", "y"), ("p",), ("q",), ("r", "re"), ("s",),
    ("t",), ("u",), ("v",), ("w",), ("z",), ("rc",))


def launch_of(name: str) -> Tuple[str, ...]:
    """The launch that runs config `name`."""
    return next(names for names in LAUNCHES if name in names)
