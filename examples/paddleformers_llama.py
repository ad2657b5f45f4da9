"""A tiny Llama trained by PaddleFormers' own Trainer with pipeline parallelism on 2 CPU ranks.

PaddleFormers' Trainer drives Paddle's PipelineParallel internals (forward_backward_pipeline,
_prepare_training, the overlap flags, ...); with paddle_ext enabled before the
TrainingArguments are made (they set up fleet), fleet.distributed_model returns the
plugin's engine, which offers that surface and runs on gloo. Nothing else changes in the
training script. Needs `pip install .[paddleformers]`.

    python examples/paddleformers_llama.py [--steps 4] [--vpp 2] [--out build/paddleformers]

Run as above it starts its two ranks through paddle.distributed.launch and prints rank
0's log; each rank runs this same file.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PP, VOCAB, HIDDEN, SEQ, LAYERS = 2, 128, 64, 32, 4


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--vpp", type=int, default=1, help="virtual pipeline stages per rank (1 or 2)")
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "paddleformers"))
    parser.add_argument("--timeout", type=float, default=600)
    return parser.parse_args(argv)


def launch(args) -> int:
    sys.path.insert(0, ROOT)
    from examples.pipeline_demo import launch_ranks

    script_args = ["--steps", str(args.steps), "--vpp", str(args.vpp), "--accumulation", str(args.accumulation),
                   "--out", args.out]
    return launch_ranks(__file__, PP, args.out, script_args, args.timeout, "[paddleformers]",
                        lambda line: "global_step" in line or line.startswith("paddle_ext:") or "Error" in line)


class Samples:
    """Token sequences with a learnable pattern (each next token is the previous + 1) and
    a causal start/end-row mask: int32, one row index per column (S: nothing masked
    below the diagonal), which PaddleFormers' pipe decoder tells from a dense mask by
    its dtype."""

    def __init__(self, count: int) -> None:
        import numpy as np

        starts = np.random.RandomState(0).randint(1, VOCAB, size=(count, 1))
        self.ids = (starts + np.arange(SEQ + 1)[None]) % (VOCAB - 1) + 1

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        import numpy as np

        return {"input_ids": self.ids[i, :-1].astype("int64"), "labels": self.ids[i, 1:].astype("int64"),
                "attn_mask_startend_row_indices": np.full([1, SEQ], SEQ, dtype="int32")}


def collate(features: list) -> dict:
    import numpy as np
    import paddle

    return {k: paddle.to_tensor(np.stack([f[k] for f in features])) for k in features[0]}


def train(args) -> None:
    import paddle_ext

    paddle_ext.enable()  # before TrainingArguments: they call fleet.init
    from paddleformers.trainer import Trainer, TrainingArguments
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLMPipe

    training_args = TrainingArguments(
        output_dir=os.path.join(args.out, "checkpoints"), max_steps=args.steps, per_device_train_batch_size=2,
        gradient_accumulation_steps=args.accumulation, learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
        pipeline_model_parallel_size=PP, amp_master_grad=False, disable_tqdm=True, report_to="none",
        # PaddleFormers 1.2.0 with max_grad_norm > 0 under pp reads the unwrapped optimizer's
        # _inner_opt (trainer.py, _wrap_distributed_optimizer) and fails on any device.
        max_grad_norm=0.0,
        dataloader_shuffle=False, do_train=True)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                         num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=2 * SEQ, dtype="float32")
    config._attn_implementation = "eager"
    if args.vpp > 1:
        config.virtual_pipeline_model_parallel_size = args.vpp
    model = LlamaForCausalLMPipe(config)
    trainer = Trainer(model=model, args=training_args, data_collator=collate,
                      train_dataset=Samples(args.steps * args.accumulation * 2))
    trainer.train()
    engine = trainer.model_wrapped
    print(f"paddle_ext: the Trainer drove {type(engine).__mro__[1].__name__} "
          f"(an instance of Paddle's {type(engine).__mro__[3].__name__}), {engine.num_stages} stages, "
          f"{engine.vpp} virtual stage(s) per rank, {engine.accumulate_steps} micro-batches per step", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    if "PADDLE_TRAINER_ID" in os.environ:  # a rank started by paddle.distributed.launch
        train(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
