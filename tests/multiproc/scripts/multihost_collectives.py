"""Rank script: fleet.init and collectives, checked against numpy (float64), on any
number of ranks (across emulated hosts in test_multihost.py, on one host for the
comparison of fleet.init's time).

Prints "rank R: fleet.init S s" (the wall time of fleet.init, which makes the job store's
connection and every group of the hybrid topology: the plugin's private group stores)
and "rank R: CASE ok" per collective: all_reduce over every rank, broadcast from the
last rank, and all_reduce on new groups (two ranks: one of both; more: the even ranks'
and the odd ranks'), a group made after fleet.init through the same private store.

Usage: multihost_collectives.py [pp|dp]   (the hybrid topology fleet.init makes: pp=all
ranks, or dp=all ranks; default dp). pp: then one train_batch of a tiny pipeline model
through fleet.distributed_model, which makes the engine's own groups (a pp job's every
group store), printing "rank R: train_batch ok".
"""

from __future__ import annotations

import sys
import time

import numpy as np
import paddle
import paddle.distributed as dist
import paddle.distributed.fleet as fleet

import paddle_ext

AXIS = sys.argv[1] if len(sys.argv) > 1 else "dp"


def check(name: str, got, want) -> None:
    np.testing.assert_array_equal(np.asarray(got, dtype="float64"), np.asarray(want, dtype="float64"), err_msg=name)
    print(f"rank {dist.get_rank()}: {name} ok", flush=True)


def values(rank: int) -> np.ndarray:
    return (np.arange(6).reshape(2, 3) + 10 * rank).astype("float64")


def main() -> None:
    paddle_ext.enable()
    size = int(paddle.distributed.ParallelEnv().world_size)
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": size if AXIS == "dp" else 1, "mp_degree": 1,
                               "pp_degree": size if AXIS == "pp" else 1}
    if AXIS == "pp":
        strategy.pipeline_configs = {"accumulate_steps": 2, "micro_batch_size": 1}
    start = time.monotonic()
    fleet.init(is_collective=True, strategy=strategy)
    took = time.monotonic() - start
    rank = dist.get_rank()
    print(f"rank {rank}: fleet.init {took:.3f} s", flush=True)

    x = paddle.to_tensor(values(rank).astype("float32"))
    dist.all_reduce(x)
    check("all_reduce", x.numpy(), sum(values(r) for r in range(size)))

    y = paddle.to_tensor(values(rank).astype("float32"))
    dist.broadcast(y, src=size - 1)
    check("broadcast", y.numpy(), values(size - 1))

    # new_group is collective over every rank: each makes every group, and uses its own
    # (two ranks: one group of both; more: the even ranks' and the odd ranks')
    parts = [list(range(size))] if size == 2 else [list(range(0, size, 2)), list(range(1, size, 2))]
    groups = [dist.new_group(members) for members in parts]
    for members, group in zip(parts, groups):
        if rank in members:
            z = paddle.to_tensor(values(rank).astype("float32"))
            dist.all_reduce(z, group=group)
            check(f"new_group {members} all_reduce", z.numpy(), sum(values(r) for r in members))
    if AXIS == "pp":
        train_step(size, rank)
    dist.barrier()
    print(f"rank {rank}: done", flush=True)


def train_step(size: int, rank: int) -> None:
    sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
    from examples.tiny_gpt import batch, pipeline_model

    paddle.seed(0)
    model = fleet.distributed_model(pipeline_model(32, 16, 8, blocks=size, pp=size))
    opt = paddle.optimizer.SGD(0.1, parameters=model.parameters())
    loss = model.train_batch(list(batch(0, 2, 8, 32)), opt)
    assert np.isfinite(float(loss)), loss
    print(f"rank {rank}: train_batch ok", flush=True)


if __name__ == "__main__":
    main()
