"""Rank script: PaddleFormers' own Trainer drives paddle_ext's pipeline engine.

Usage: paddleformers_trainer.py CONFIG[,CONFIG...] OUT_DIR

CONFIG: a name of tests/multiproc/trainer_configs.py's records, which say what each run
sets and what the tests expect of it.

CONFIG may name several, comma-separated, for one topology and accumulation count (c,d):
each gets its own Trainer in this process (a second fleet.init in one process keeps the
first strategy's pipeline_configs, so configs with another accumulation count need a
launch of their own). After a config with eval_resume: evaluate() against the reference's
eval loss, and a run saved at step 2 and resumed with resume_from_checkpoint against
the uninterrupted run.

A tiny LlamaForCausalLMPipe (float32, eager attention but in h, a causal start/end-row mask,
fuse_rms_norm at PaddleFormers' default) trains 3 steps through Trainer.train(); its
weights come from a single-process LlamaForCausalLM built with the same seed, which
then trains over the same data in this process by hand (every micro-batch's loss
backward, gradients summed, scaled by 1 / (micro-batches of the step), AdamW as the
Trainer's). Each rank writes OUT_DIR/result.<config>.<rank>.json: the Trainer's logged losses,
the reference's, and per parameter of its stage the max relative difference.
"""

import json
import os
import sys

import numpy as np
import paddle
import paddle.distributed as dist
import paddleformers.nn.pp_model as pf_pp_model

# from this folder: sys.path[0] for a rank (_rank_entry.py) and for paddleformers_split_rows.py
from _trainer_parity import compare, copy_weights, digest, tp_slice
from paddleformers.nn.attention import flashmask_attention as pf_flashmask
from paddleformers.trainer import Trainer, TrainerCallback, TrainingArguments
from paddleformers.transformers import (
    Ernie4_5Config,
    Ernie4_5ForCausalLM,
    Ernie4_5ForCausalLMPipe,
    Gemma3ForCausalLM,
    Gemma3ForCausalLMPipe,
    Gemma3TextConfig,
    GptOssConfig,
    GptOssForCausalLM,
    GptOssForCausalLMPipe,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForCausalLMPipe,
    Phi3Config,
    Phi3ForCausalLM,
    Phi3ForCausalLMPipe,
)

import paddle_ext
from paddle_ext import patches
from paddle_ext.pipeline.v_layer import v_segmented

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
from tests.multiproc.trainer_configs import CONFIGS, SEQ  # noqa: E402

# A user's order: PaddleFormers imported first (its attention interface has taken Paddle's
# flashmask_attention by then: config h), the plugin enabled before TrainingArguments set up
# fleet, so that the plugin's engine serves fleet.distributed_model.
paddle_ext.enable()

VOCAB, HIDDEN, LAYERS, STEPS, LR, SEED = 64, 16, 4, 3, 1e-2, 1234


def counted(fn):
    """fn, counting its calls (the pipe's decoder layers call fleet's recompute by this name)."""
    def call(*args, **kwargs):
        call.calls += 1
        return fn(*args, **kwargs)

    call.calls = 0
    return call


pf_pp_model.recompute = counted(pf_pp_model.recompute)
# AdamW's epsilon, the Trainer's (adam_epsilon) and the reference's, every config. AdamW's
# first update is lr * g / (|g| + eps): its slope in a gradient element is up to lr / eps, so
# at PaddleFormers' default 1e-8 a gradient element near 1e-8 whose last bits differ (a
# summation order changed: tensor parallelism's row-parallel sums put ~1e-6 of the largest
# gradient into every element) moves its parameter by a sizeable part of lr. At 1e-4 such a
# rounding difference (~3e-8 absolute) moves a parameter by at most ~3e-4 * lr, while a
# gradient off by a real factor (a missing scaling) still changes the updates, which a
# scale-invariant AdamW at 1e-8 would hide.
ADAM_EPSILON = 1e-4
# model family -> (config class, single-process class, pipe class, extra config arguments)
MODELS = {
    "llama": (LlamaConfig, LlamaForCausalLM, LlamaForCausalLMPipe, {}),
    # ERNIE 4.5's default pp_seg_method names its decoder class, which the pipe's layers are not
    # (PaddleFormers 1.2.0's PipelineLayer then finds no layer to cut at); the pipe's own name
    "ernie4_5": (Ernie4_5Config, Ernie4_5ForCausalLM, Ernie4_5ForCausalLMPipe,
                 dict(head_dim=HIDDEN // 2, pp_seg_method="layer:DecoderLayer|EmptyLayer")),
    "phi3": (Phi3Config, Phi3ForCausalLM, Phi3ForCausalLMPipe, {}),
    # a mixture of experts: 4 experts, 2 per token; full attention (its sliding layers would
    # need the rows the pipe does not build, as Gemma 3's); the default pp_seg_method finds no
    # layer to cut at, as ERNIE's
    "gptoss": (GptOssConfig, GptOssForCausalLM, GptOssForCausalLMPipe,
               dict(head_dim=HIDDEN // 2, num_experts=4, num_experts_per_tok=2, layer_types=["full_attention"] * LAYERS,
                    pp_seg_method="layer:DecoderLayer|EmptyLayer")),
    # Gemma 3's default sliding window (4096) spans the tests' sequences: its pipe (PaddleFormers
    # 1.2.0's GeneralModelForCausalLMPipe) builds no sliding-window rows, its single-process
    # model does, so a shorter window would compare two different models
    "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM, Gemma3ForCausalLMPipe, dict(head_dim=HIDDEN // 2)),
}
# models whose attention takes the start/end rows as [batch, heads, seq, bounds]
FOUR_DIM_ROWS = {"gemma3", "gptoss"}


def model_classes(config):
    return next(classes for classes in MODELS.values() if isinstance(config, classes[0]))


def model_config(cfg, tp):
    config_cls, _, _, extra = MODELS[cfg.model]
    config = config_cls(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                        num_hidden_layers=LAYERS, num_attention_heads=2, num_key_value_heads=2,
                        max_position_embeddings=4 * SEQ, dtype="float32", **extra)
    config._attn_implementation = cfg.attn
    config.apply_rope_fusion = cfg.rope_fusion
    if cfg.vpp > 1 or cfg.v:
        config.virtual_pipeline_model_parallel_size = 2 if cfg.v else cfg.vpp
    config.tensor_model_parallel_size = tp
    if cfg.sequence_parallel:
        config.sequence_parallel = True
        config.max_sequence_length = SEQ  # the pipe's sequence-parallel reshapes read it
    # PaddleFormers' default, tensor_parallel_output=True, keeps the head's logits split over
    # the vocabulary and takes fleet's ParallelCrossEntropy (its op has no CPU kernel in
    # Paddle: unit parallel_cross_entropy); f gathers the logits (c_concat) for the plain loss.
    config.tensor_parallel_output = not cfg.gathered_logits
    for k, v in cfg.model_config.items():
        setattr(config, k, v)
    return config


class Samples(paddle.io.Dataset):
    """Fixed token sequences (no token 0: LlamaModel's embedding has padding_idx 0,
    the pipe's has none) with labels and a causal start/end-row mask (int32: the pipe
    decoder tells it from a dense mask by its dtype): causal over the whole sequence, or
    over each document of `documents` (bounds): for each key column, the row where its
    document ends (FlashMask's LTS)."""

    def __init__(self, count, documents=(0, SEQ)):
        rng = np.random.RandomState(7)
        self.ids = rng.randint(1, VOCAB, size=(count, SEQ + 1)).astype("int64")
        self.rows = np.zeros([1, SEQ], dtype="int32")
        for start, end in zip(documents[:-1], documents[1:]):
            self.rows[0, start:end] = end

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i, :-1], "labels": self.ids[i, 1:],
                "attn_mask_startend_row_indices": self.rows}


def collate(features):
    """Stacks each key keeping its dtype (the default collator turns the int32 mask into int64)."""
    return {k: paddle.to_tensor(np.stack([f[k] for f in features])) for k in features[0]}


def gradient(param):
    """The gradient the optimizer reads: under amp_master_grad the float32 main_grad."""
    main = getattr(param, "main_grad", None)
    return main if main is not None else param.grad


class LossLog(TrainerCallback):
    """The losses the Trainer logs, and the first step's gradients as the optimizer gets them
    (after the Trainer's 1 / accumulation scaling)."""

    def __init__(self, pipe):
        self.losses, self.grad_norms = [], []
        self.pipe = pipe
        self.first_grads = None

    def on_train_begin(self, args, state, control, **kwargs):
        # Last in line, so that the gradients are read after every other callback's work
        # on them: sequence parallelism's SPGradSyncCallback (added while the Trainer wraps
        # the model) all-reduces the sequence-parallel parameters' gradients there.
        callbacks = self.trainer.callback_handler.callbacks
        callbacks.remove(self)
        callbacks.append(self)

    def on_optimizer_begin(self, args, state, control, **kwargs):
        if self.first_grads is None:
            self.main_grads = sum(getattr(p, "main_grad", None) is not None for p in self.pipe.parameters())
            self.first_grads = {k: (None if gradient(p) is None else gradient(p).numpy().copy())
                                for k, p in paddle.nn.Layer.state_dict(self.pipe).items()}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))
            if "global_norm" in logs:  # PaddleFormers logs it when it clips
                self.grad_norms.append(float(logs["global_norm"]))


def reference_model(config, plain_ops=False):
    """The single-process model: no parallelism, eager attention, unfused rotary embedding;
    plain_ops: Paddle's plain ops for RMSNorm too (fuse_rms_norm off), so that no plugin
    kernel computes the reference."""
    paddle.seed(SEED)
    config_cls, model_cls, _, _ = model_classes(config)
    plain = {"fuse_rms_norm": False} if plain_ops else {}
    ref_config = config_cls(**{**config.to_dict(), "tensor_model_parallel_size": 1, "sequence_parallel": False,
                               "apply_rope_fusion": False, **plain})
    ref_config._attn_implementation = "eager"
    return model_cls(ref_config)


def training_args(name, cfg, out_dir, **extra):
    sharding, tp = cfg.sharding, cfg.tp
    kwargs = dict(
        output_dir=os.path.join(out_dir, f"ckpt-{name}"), per_device_train_batch_size=1,
        per_device_eval_batch_size=1, gradient_accumulation_steps=cfg.acc, max_steps=STEPS,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=cfg.clip, logging_steps=1, save_strategy="no", seed=SEED, dataloader_shuffle=False,
        disable_tqdm=True, report_to="none", pipeline_model_parallel_size=cfg.pp,
        tensor_model_parallel_size=tp, sharding_parallel_size=sharding,
        sharding=cfg.stage if sharding > 1 else "", split_param=cfg.split_param,
        forward_backward_overlap_scheduler=cfg.fb_overlap,
        dp_comm_overlap=cfg.dp_comm_overlap, do_train=True, amp_master_grad=False,
        use_dualpipev=cfg.v, sequence_parallel=cfg.sequence_parallel,
        pp_sharding_comm_overlap=cfg.sharding_overlap,
        adam_epsilon=ADAM_EPSILON,
    )
    kwargs.update(cfg.switches)
    if cfg.amp_master_grad:
        kwargs.update(bf16=True, fp16_opt_level="O2", amp_master_grad=True)
    kwargs.update(extra)
    return TrainingArguments(**kwargs)


def reference_run(config, cfg, dataset, steps, epsilon=ADAM_EPSILON, prepare=None):
    """Parameters and per-step losses of the single-process reference (`prepare`, if
    given, changes the model before training: scripts/paddleformers_split_rows.py)."""
    ref = reference_model(config, plain_ops=cfg.plain_reference)
    if prepare is not None:
        prepare(ref)
    opt = paddle.optimizer.AdamW(LR, parameters=ref.parameters(), weight_decay=0.0,
                                 beta1=0.9, beta2=0.999, epsilon=epsilon)
    ref.grad_norms = []
    replicas = cfg.replicas
    per_step = cfg.acc * replicas
    losses = []
    for step in range(steps):
        total = paddle.zeros([])
        for i in range(step * per_step, (step + 1) * per_step):
            item = dataset[i]
            out = ref(input_ids=paddle.to_tensor(item["input_ids"][None]),
                      labels=paddle.to_tensor(item["labels"][None]),
                      attn_mask_startend_row_indices=paddle.to_tensor(item["attn_mask_startend_row_indices"][None]))
            loss = out[0] if isinstance(out, (tuple, list)) else out.loss
            loss.backward()
            total += loss.detach()
        with paddle.no_grad():  # as the engine's reduction (1 / replicas) and the Trainer (1 / acc) scale
            for p in ref.parameters():
                if p.grad is not None:
                    if replicas > 1:
                        p.grad.scale_(1.0 / replicas)
                    p.grad.scale_(1.0 / cfg.acc)
        if step == 0:  # as the Trainer's optimizer gets them, before clipping
            ref.first_grads = {k: (None if t.grad is None else t.grad.numpy().copy()) for k, t in ref.state_dict().items()}
        if cfg.clip:
            ref.grad_norms.append(clip_as_hybrid_parallel(ref, config, cfg))
        opt.step()
        opt.clear_grad()
        losses.append(float(total.numpy()) / per_step)
    return ref, losses


@paddle.no_grad()
def clip_as_hybrid_parallel(ref, config, cfg):
    """Clips the reference's gradients by their global norm as fleet's HybridParallelClipGrad
    clips a pipeline's (clip / (max(norm, clip) + 1e-6)), returning the norm. A weight tied
    across pipeline stages (the embedding and the head) counts once per stage that holds it:
    Paddle's PipelineLayer marks a SharedLayerDesc's weight `is_firstly_shared` only where
    the parameter's name equals the weight attribute's (`param.name in shared_weight_attr`,
    "embedding_0.w_0" vs "embedding_weight"), so no stage is told to leave it out."""
    params = [p for p in ref.parameters() if p.grad is not None]
    square = sum(float((p.grad.astype("float64") ** 2).sum()) for p in params)
    once = cfg.plugin_pp.get("count_shared_weights_once", False)
    if config.tie_word_embeddings and cfg.pp > 1 and not once:
        square += float((ref.get_input_embeddings().weight.grad.astype("float64") ** 2).sum())
    norm = square ** 0.5
    factor = cfg.clip / (max(norm, cfg.clip) + 1e-6)
    for p in params:
        p.grad.scale_(factor)
    return norm


def unit_offset_weights(pipe):
    """State-dict keys of the weights a model uses as `1 + w` (Gemma 3's RMSNorm, which
    starts them at 0): compared as the scale they give, since after a few Adam steps of
    LR their largest value is about steps * LR, and a max-relative difference of w alone
    divides a rounding difference by that."""
    return {f"{name}.weight" for name, layer in pipe.named_sublayers()
            if any(cls.__name__ == "Gemma3RMSNorm" for cls in type(layer).__mro__)}


def sharding_owned(trainer):
    """Under sharding stage 1 a rank holds the reduced gradient only of the parameters it
    updates (the optimizer's _param2rank); None: every parameter."""
    from paddle.distributed import fleet

    hcg = fleet.get_hybrid_communicate_group()
    if hcg.get_sharding_parallel_world_size() == 1:
        return None
    opt, param2rank = trainer.optimizer, None
    while opt is not None and param2rank is None:
        param2rank = vars(opt).get("_param2rank")
        opt = vars(opt).get("_inner_opt")
    me = hcg.get_sharding_parallel_rank()
    return {name for name, rank in param2rank.items() if rank == me}


def compare_grads(got, want, pipe, mapping, owned=None):
    """Max relative difference of the first step's gradients per parameter of this rank
    (relative to the reference gradient's largest magnitude); with `owned` (parameter
    names), only those."""
    state = paddle.nn.Layer.state_dict(pipe)
    out = {}
    for key, grad in got.items():
        if owned is not None and state[key].name not in owned:
            continue
        ref_grad = want.get(mapping[key])
        if grad is None or ref_grad is None:
            out[key] = None if grad is None and ref_grad is None else -1.0
            continue
        ref_grad = paddle.to_tensor(ref_grad)
        if tuple(ref_grad.shape) != tuple(grad.shape):
            ref_grad = tp_slice(ref_grad, state[key], key)
        ref_grad = ref_grad.numpy().astype(np.float64)
        out[key] = float(np.max(np.abs(grad - ref_grad)) / max(np.max(np.abs(ref_grad)), 1e-30))
    return out


def train(name, cfg, out_dir, dataset, resume=None, max_steps=STEPS, save_steps=None):
    # the plugin's own pp_configs keys, which PaddleFormers' strategy cannot carry: for the
    # process, through enable()'s config (None: back to the defaults)
    paddle_ext.enable({"paddle_ext": {"pp_configs": dict(cfg.plugin_pp)}} if cfg.plugin_pp else None)
    extra = {"max_steps": max_steps}
    if save_steps:
        extra.update(save_strategy="steps", save_steps=save_steps)
    args = training_args(name, cfg, out_dir, **extra)
    config = model_config(cfg, cfg.tp)
    _, model_cls, pipe_cls, _ = model_classes(config)
    if cfg.pp == 1:
        pipe_cls = model_cls
    pipe = (v_segmented(pipe_cls) if cfg.v else pipe_cls)(config)
    mapping = copy_weights(reference_model(config), pipe)
    log = LossLog(pipe)
    trainer = Trainer(model=pipe, args=args, train_dataset=dataset, eval_dataset=dataset, data_collator=collate,
                      callbacks=[log])
    log.trainer = trainer
    trainer.train(resume_from_checkpoint=resume)
    trainer.first_grads = log.first_grads
    trainer.first_main_grads = log.main_grads
    trainer.grad_norms = log.grad_norms
    return trainer, pipe, mapping, log.losses, config


def main():
    names, out_dir = sys.argv[1].split(","), sys.argv[2]
    rank = dist.get_rank()
    for name in names:
        cfg = CONFIGS[name]
        dataset = Samples(cfg.acc * cfg.replicas * STEPS, cfg.documents)
        if cfg.model in FOUR_DIM_ROWS:
            dataset.rows = dataset.rows[..., None]
        recomputed = pf_pp_model.recompute.calls
        trainer, pipe, mapping, losses, config = train(name, cfg, out_dir, dataset)
        recomputed = pf_pp_model.recompute.calls - recomputed
        engine = trainer.model_wrapped
        if cfg.stage == "stage3":  # each rank holds a slice of every parameter: gather them
            engine.get_all_parameters()
        ref, ref_losses = reference_run(config, cfg, dataset, STEPS)
        result = {"config": name, "losses": losses, "ref_losses": ref_losses,
                  "clip": cfg.clip or None, "grad_norms": trainer.grad_norms, "ref_grad_norms": ref.grad_norms,
                  "params": compare(pipe, ref, mapping, unit_offset_weights(pipe)),
                  "digest": digest(pipe),
                  "unit_offset_weights": sorted(unit_offset_weights(pipe)),
                  # stages 2 and 3 and split_param keep the reduced gradients in buffers of
                  # their own, not in the .grad a callback reads: parameters are compared instead
                  "first_grads": None if not cfg.gradient_view else compare_grads(
                      trainer.first_grads, ref.first_grads, pipe, mapping, sharding_owned(trainer)),
                  "classes": [c.__name__ for c in type(engine).__mro__],
                  "sharding_optimizer": sharding_optimizer_state(trainer.optimizer),
                  "recomputed": recomputed,
                  "dp_comm_overlap": getattr(engine, "_dp_comm_overlap", None),
                  "enable_timer": getattr(getattr(engine, "settings", None), "enable_timer", None),
                  "schedule": engine.schedule().kind if hasattr(engine, "schedule") else None,
                  "placement": engine.schedule().placement if hasattr(engine, "schedule") else None,
                  "sharding_comm_overlap": getattr(engine, "_sharding_comm_overlap", None),
                  "attn_implementation": config._attn_implementation,
                  "model": type(pipe).__name__, "rope_fusion": config.apply_rope_fusion,
                  "main_grads": trainer.first_main_grads,
                  "sequence_parallel_params": sum(bool(getattr(p, "sequence_parallel", False))
                                                  for p in pipe.parameters()),
                  "flashmask_unit": patches.series().installed_by(pf_flashmask.flashmask_attention)}
        if cfg.eval_resume:
            result.update(evaluate_and_resume(trainer, cfg, out_dir, dataset, config))
        with open(os.path.join(out_dir, f"result.{name}.{rank}.json"), "w") as f:
            json.dump(result, f)
        print(f"rank {rank}: config {name} done", flush=True)


SHARDING_FLAGS = ("tensor_fusion", "comm_overlap", "_broadcast_overlap", "_all_gather_overlap_forward",
                  "sd_release_grads", "enable_fuse_optimizer_states", "pp_overlap")


def sharding_optimizer_state(optimizer):
    """The stage-1 sharding optimizer in the chain (class, and the switches it runs with), or None."""
    while optimizer is not None:
        if type(optimizer).__name__.startswith("DygraphShardingOptimizer"):
            return {"class": type(optimizer).__name__,
                    **{k: bool(getattr(optimizer, k, False)) for k in SHARDING_FLAGS}}
        optimizer = getattr(optimizer, "_inner_opt", None)
    return None


def evaluate_and_resume(trainer, cfg, out_dir, dataset, config):
    metrics = trainer.evaluate(eval_dataset=Samples(cfg.acc * 2))
    ref, _ = reference_run(config, cfg, dataset, STEPS)
    eval_ref = reference_eval(ref, Samples(cfg.acc * 2))
    final = {k: v.numpy().copy() for k, v in trainer.model.state_dict().items()}
    # a run saved at step 2, then resumed from that checkpoint to step 3
    t2, _, _, _, _ = train("r2", cfg, out_dir, dataset, max_steps=2, save_steps=2)
    ckpt = os.path.join(t2.args.output_dir, "checkpoint-2")
    t3, pipe3, _, _, _ = train("r2", cfg, out_dir, dataset, resume=ckpt)
    resumed = {k: v.numpy() for k, v in pipe3.state_dict().items()}
    diff = max(float(np.max(np.abs(resumed[k].astype(np.float64) - final[k]))) for k in final)
    return {"eval_loss": metrics["eval_loss"], "ref_eval_loss": eval_ref, "resume_max_abs_diff": diff}


@paddle.no_grad()
def reference_eval(ref, data):
    ref.eval()
    losses = []
    for i in range(len(data)):
        item = data[i]
        out = ref(input_ids=paddle.to_tensor(item["input_ids"][None]),
                  labels=paddle.to_tensor(item["labels"][None]),
                  attn_mask_startend_row_indices=paddle.to_tensor(item["attn_mask_startend_row_indices"][None]))
        losses.append(float((out[0] if isinstance(out, (tuple, list)) else out.loss).numpy()))
    return float(np.mean(losses))


if __name__ == "__main__":
    main()
