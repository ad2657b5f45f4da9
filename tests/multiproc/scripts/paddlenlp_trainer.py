"""Rank script: PaddleNLP's own Trainer drives paddle_ext's pipeline engine (Paddle 2.6.2).

Usage: paddlenlp_trainer.py OUT_DIR   (4 ranks: pp2 x dp2)

PaddleNLP 2.8.1's Trainer trains a tiny LlamaForCausalLMPipe (float32, built from a config:
no weights or tokenizer downloaded) for 3 steps of 4 micro-batches, once per config in this
process, each config a pipeline_parallel_config string:
  d   "enable_dp_comm_overlap", which PaddleNLP's TrainingArguments refuse with pipeline
      parallelism ("overlap has accuracy issue") and unit paddleformers_overlap lets through
      while the plugin's engine serves: the engine all-reduces the dp gradients during the
      backward (the optimizer's own reduction switched off), the Trainer reduces none;
  c   "": the Trainer all-reduces the gradients after the backward;
  ds  d with "enable_delay_scale_loss", the pairing the refusal's TODO names: the pipeline
      leaves the loss unscaled and the Trainer scales the reduced gradients by 1 / 4;
  cs  c with "enable_delay_scale_loss".
d runs first, so that its TrainingArguments set fleet up through the lifted refusal.
PaddleNLP skips its strategy set-up once the parallel context exists (a second
TrainingArguments in one process keeps the first one's strategy), so for each later config
the script sets the two pp_configs keys its words decide to what PaddleNLP would have set
in that config's own job.

The pipe's weights come from a single-process LlamaForCausalLM built with the same seed,
which then trains over the same data in this process by hand (every sample's loss backward,
gradients summed, scaled by 1 / (dp * micro-batches), AdamW as the Trainer's). Each rank
writes OUT_DIR/result.<config>.<rank>.json: the Trainer's logged losses, the reference's, per
parameter of its stage the max relative difference (_trainer_parity.compare), a digest of
its parameters' bytes, the engine's classes and its overlap switch.
"""

import json
import os
import sys

import numpy as np
import paddle
import paddle.distributed as dist

import paddle_ext

# The plugin first, PaddleNLP after it: its TrainingArguments are patched by the unit's
# import hook when PaddleNLP loads (test_paddleformers.py's script covers the other order).
paddle_ext.enable()

from _trainer_parity import compare, copy_weights, digest  # noqa: E402
from paddlenlp.trainer import Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from paddlenlp.trainer.training_args import TrainingArguments as _Args  # noqa: E402
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, LlamaForCausalLMPipe  # noqa: E402

from paddle_ext import patches, upstream  # noqa: E402

VOCAB, HIDDEN, SEQ, LAYERS, STEPS, ACC, DP, LR, SEED = 64, 16, 8, 4, 3, 4, 2, 1e-2, 1234
ADAM_EPSILON = 1e-4  # as paddleformers_trainer.py's, for the reason given there

CONFIGS = {"d": "enable_dp_comm_overlap", "c": "", "ds": "enable_dp_comm_overlap enable_delay_scale_loss",
           "cs": "enable_delay_scale_loss"}


def model_config():
    return LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4 * SEQ,
                       use_flash_attention=False, use_fused_rms_norm=False, dtype="float32")


class Samples(paddle.io.Dataset):
    """Fixed token sequences and their next tokens (PaddleNLP's default pipeline input
    function takes input_ids and labels); no token 0 (the reference's embedding pads it)."""

    def __init__(self, count):
        self.ids = np.random.RandomState(7).randint(1, VOCAB, size=(count, SEQ + 1)).astype("int64")

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i, :-1], "labels": self.ids[i, 1:]}


class InOrder(Trainer):
    """PaddleNLP's Trainer, its sampler unshuffled (it always shuffles): step s takes samples
    s * DP * ACC to (s + 1) * DP * ACC - 1 over the dp ranks, the reference's order."""

    def _get_train_sampler(self):
        return paddle.io.DistributedBatchSampler(self.train_dataset, batch_size=self.args.per_device_train_batch_size,
                                                 shuffle=False, num_replicas=self.args.dataset_world_size,
                                                 rank=self.args.dataset_rank)


class LossLog(TrainerCallback):
    def __init__(self):
        self.losses = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def reference_run(config, dataset):
    """The single-process model's parameters and per-step mean losses."""
    paddle.seed(SEED)
    ref = LlamaForCausalLM(config)
    opt = paddle.optimizer.AdamW(LR, parameters=ref.parameters(), weight_decay=0.0, epsilon=ADAM_EPSILON)
    per_step, losses = ACC * DP, []
    for step in range(STEPS):
        total = paddle.zeros([])
        for i in range(step * per_step, (step + 1) * per_step):
            item = dataset[i]
            loss = ref(input_ids=paddle.to_tensor(item["input_ids"][None]),
                       labels=paddle.to_tensor(item["labels"][None]))[0]
            loss.backward()
            total += loss.detach()
        with paddle.no_grad():  # the dp mean, then the Trainer's 1 / accumulation
            for p in ref.parameters():
                if p.grad is not None:
                    p.grad.scale_(1.0 / DP)
                    p.grad.scale_(1.0 / ACC)
        opt.step()
        opt.clear_grad()
        losses.append(float(total.numpy()) / per_step)
    return ref, losses


def train(name, out_dir, dataset):
    args = TrainingArguments(
        output_dir=os.path.join(out_dir, f"ckpt-{name}"), per_device_train_batch_size=1, per_device_eval_batch_size=ACC,
        gradient_accumulation_steps=ACC, max_steps=STEPS, learning_rate=LR, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=0.0, adam_epsilon=ADAM_EPSILON, logging_steps=1,
        save_strategy="no", seed=SEED, disable_tqdm=True, report_to="none", do_train=True,
        pipeline_parallel_degree=2, pipeline_parallel_config=CONFIGS[name])
    if name != next(iter(CONFIGS)):  # this config's own job's strategy (module docstring)
        words = CONFIGS[name].split(" ")
        upstream.fleet_strategy().hybrid_configs = {"pp_configs": {
            "dp_comm_overlap": "enable_dp_comm_overlap" in words, "delay_scale_loss": "enable_delay_scale_loss" in words}}
    config = model_config()
    pipe = LlamaForCausalLMPipe(config)
    paddle.seed(SEED)
    mapping = copy_weights(LlamaForCausalLM(config), pipe)
    log = LossLog()
    trainer = InOrder(model=pipe, args=args, train_dataset=dataset, callbacks=[log])
    trainer.train()
    return trainer, pipe, mapping, log.losses, config, args


def optimizer_reduces(optimizer):
    """Whether fleet's HybridParallelOptimizer in the chain all-reduces the dp gradients in
    its step (the engine switches that off where it reduces them itself)."""
    while optimizer is not None and "_dp_enable" not in vars(optimizer):
        optimizer = vars(optimizer).get("_inner_opt")
    return None if optimizer is None else bool(optimizer._dp_enable)


def main():
    out_dir = sys.argv[1]
    rank = dist.get_rank()
    dataset = Samples(ACC * DP * STEPS)
    for name in CONFIGS:
        trainer, pipe, mapping, losses, config, args = train(name, out_dir, dataset)
        engine = trainer.model_wrapped
        ref, ref_losses = reference_run(config, dataset)
        out = dict(config=name, losses=losses, ref_losses=ref_losses, params=compare(pipe, ref, mapping),
                   digest=digest(pipe), pipeline_parallel_config=args.pipeline_parallel_config,
                   data_parallel_degree=args.data_parallel_degree,
                   classes=[c.__name__ for c in type(engine).__mro__],
                   dp_comm_overlap=getattr(engine, "_dp_comm_overlap", None),
                   delay_scale_loss=getattr(engine, "_delay_scale_loss", None),
                   optimizer_reduces=optimizer_reduces(trainer.optimizer),
                   lifted_by=patches.series().installed_by(_Args.__post_init__))
        with open(os.path.join(out_dir, f"result.{name}.{rank}.json"), "w") as f:
            json.dump(out, f)
        print(f"rank {rank}: config {name} done", flush=True)


if __name__ == "__main__":
    main()
