"""One process: what tensor parallelism's summation order alone does to the Trainer parity.

Usage: paddleformers_split_rows.py OUT_JSON

Trains the single-process reference of paddleformers_trainer.py (config f's model, data and
schedule) twice: as it is, and with every row-parallel matmul (o_proj, down_proj) summed as
two halves of its inner dimension, the order tensor parallel 2 sums them in (each rank's
partial product, then the all-reduce). No collective, no plugin engine: any difference is
rounding. Writes, for AdamW's epsilon at PaddleFormers' default (1e-8) and at the rank
script's ADAM_EPSILON, the max relative difference of the first step's gradients, of the
losses and of the parameters after 3 steps (per parameter, relative to its largest
magnitude), the measures tests/multiproc/test_paddleformers.py bounds.
"""

import json
import os
import sys

import numpy as np
import paddle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paddleformers_trainer as trainer_script  # noqa: E402

DEFAULT_EPSILON = 1e-8  # TrainingArguments.adam_epsilon's default


def split_row_parallel(model):
    """o_proj and down_proj compute x[..., :h] @ W[:h] + x[..., h:] @ W[h:]."""
    for name, layer in model.named_sublayers():
        if name.endswith(("o_proj", "down_proj")):
            def forward(x, layer=layer):
                w = layer.weight
                half = w.shape[0] // 2
                y = paddle.matmul(x[..., :half], w[:half]) + paddle.matmul(x[..., half:], w[half:])
                return y if layer.bias is None else y + layer.bias
            layer.forward = forward


def run(epsilon, prepare):
    cfg = trainer_script.CONFIGS["f"]
    config = trainer_script.model_config(cfg, 1)
    dataset = trainer_script.Samples(cfg.acc * trainer_script.STEPS)
    ref, losses = trainer_script.reference_run(config, cfg, dataset, trainer_script.STEPS, epsilon, prepare)
    params = {k: v.numpy().astype(np.float64) for k, v in ref.state_dict().items()}
    return ref.first_grads, params, losses


def relative(got, want):
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def main():
    out = {}
    for label, epsilon in (("default", DEFAULT_EPSILON), ("test", trainer_script.ADAM_EPSILON)):
        grads, params, losses = run(epsilon, None)
        split_grads, split_params, split_losses = run(epsilon, split_row_parallel)
        out[label] = {
            "epsilon": epsilon,
            "first_grads": max(relative(split_grads[k], g) for k, g in grads.items() if g is not None),
            "losses": max(abs(a - b) / abs(b) for a, b in zip(split_losses, losses)),
            "params": max(relative(split_params[k], p) for k, p in params.items()),
        }
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
