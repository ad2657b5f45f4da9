"""Rank script: Paddle's group_sharded_parallel (sharding stage 2 "os_g" / stage 3 "p_g_os")
on gloo with paddle_ext enabled (unit host_sharding; stock Paddle asserts a GPU).

Usage: group_sharded.py LEVEL
Every rank trains a small MLP 3 steps on its own batch, AdamW with the gradients clipped
by their global norm (below every step's norm, so every step clips); the same steps in
this process without sharding, over all ranks' batches with the loss averaged over the
ranks (what the group's gradient averaging computes), are the reference. Prints the
largest relative parameter difference; "bad-level" checks Paddle's refusal of a level.
"""

import sys

import numpy as np
import paddle
import paddle.distributed as dist

import paddle_ext

STEPS, CLIP, LR = 3, 0.05, 0.05


def make_model():
    paddle.seed(7)
    return paddle.nn.Sequential(paddle.nn.Linear(6, 16), paddle.nn.Tanh(), paddle.nn.Linear(16, 4))


def batch(rank, step):
    rng = np.random.default_rng(100 * step + rank)
    return (paddle.to_tensor(rng.standard_normal([5, 6]).astype("float32")),
            paddle.to_tensor(rng.standard_normal([5, 4]).astype("float32")))


def optimizer(model):
    return paddle.optimizer.AdamW(LR, parameters=model.parameters(), weight_decay=0.01,
                                  grad_clip=paddle.nn.ClipGradByGlobalNorm(CLIP))


def loss_of(model, x, y):
    return ((model(x) - y) ** 2).mean()


def reference(nranks):
    model = make_model()
    opt = optimizer(model)
    norms = []
    for step in range(STEPS):
        loss = sum(loss_of(model, *batch(rank, step)) for rank in range(nranks)) / nranks
        loss.backward()
        norms.append(float(paddle.sqrt(sum((p.grad ** 2).sum() for p in model.parameters()))))
        opt.step()
        opt.clear_grad()
    return model, norms


def main(level):
    paddle_ext.enable()
    dist.init_parallel_env()
    rank, nranks = dist.get_rank(), dist.get_world_size()
    from paddle.distributed.sharding import group_sharded_parallel

    model = make_model()
    if level == "bad-level":
        try:
            group_sharded_parallel(model, optimizer(model), "p_g")
        except AssertionError as err:
            print(f"rank {rank}: AssertionError: {err}", flush=True)
        return
    sharded, opt, _ = group_sharded_parallel(model, optimizer(model), level)
    print(f"rank {rank}: {type(sharded).__name__} {type(opt).__name__}", flush=True)
    for step in range(STEPS):
        loss_of(sharded, *batch(rank, step)).backward()
        opt.step()
        opt.clear_grad()
    if level == "p_g_os":
        sharded.get_all_parameters()
    ref, norms = reference(nranks)
    assert min(norms) > CLIP, norms  # every step clipped
    worst = 0.0
    for got, want in zip(model.state_dict().values(), ref.state_dict().values()):
        want = want.numpy().astype("float64")
        worst = max(worst, float(np.max(np.abs(got.numpy() - want)) / np.max(np.abs(want))))
    print(f"rank {rank}: {level} parameters after {STEPS} clipped steps differ by {worst:.3g}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
