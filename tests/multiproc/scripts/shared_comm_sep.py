"""Rank script: the tied-weight groups of a PipelineLayer under sep_degree 2.

Usage: shared_comm_sep.py   (4 ranks: pp2 x sep2)
Builds tiny_gpt's pipeline (embedding tied to the lm head) with the ranks' weights made
different before the tie is synchronised, then prints the ranks of this rank's tie group
as the PipelineLayer built it (Paddle's own construction from 3.1 on, the plugin's
shared_comm_sep unit before), before 3.1 also the ranks a second call of the unit's
construction builds, and whether the tied weight equals the pivot's (rank pipe 0 of the same sep line) after
construction.
"""

import sys

import numpy as np
import paddle
import paddle.distributed as dist
import paddle.distributed.fleet as fleet

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
import paddle_ext  # noqa: E402
from examples.tiny_gpt import pipeline_model  # noqa: E402
from paddle_ext import compat  # noqa: E402
from paddle_ext.patches.shared_comm_sep import NATIVE_FROM  # noqa: E402
from paddle_ext.pipeline.shared_comm import pipe_line_shared_comm  # noqa: E402


def main() -> None:
    paddle_ext.enable()
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 2, "sep_degree": 2}
    strategy.pipeline_configs = {"accumulate_steps": 2, "micro_batch_size": 1}
    fleet.init(is_collective=True, strategy=strategy)
    rank = dist.get_rank()
    paddle.seed(100 + rank)  # every rank initialises its own weights; the tie must equalise them
    layers = pipeline_model(32, 16, 8, blocks=2, pp=2)
    (weight, built), = compat.pipeline_shared_weights(layers)
    group = next(iter(layers.shared_comm.values()))["group"]
    if compat.paddle_version() < NATIVE_FROM:  # the unit's construction; 3.1's layer has other members
        print(f"rank {rank}: plugin's construction {pipe_line_shared_comm(layers)['embed']['ranks']}", flush=True)
    print(f"rank {rank}: tie group built {built}", flush=True)
    pivot = min(built)
    copy = weight.detach().clone()
    dist.broadcast(copy, src=pivot, group=group)
    same = np.array_equal(copy.numpy(), weight.numpy())
    print(f"rank {rank}: tied weight equals rank {pivot}'s: {same}", flush=True)


if __name__ == "__main__":
    main()
