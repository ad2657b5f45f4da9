"""Rank script: one rank skips one all-reduce; the watchdog must report it.

Usage: comm_skip_allreduce.py SKIP_RANK   (run with PADDLE_EXT_HANG_TIMEOUT set)
Every step all-reduces a "loss" and a "grad norm" from two lines of this file; in
step 1 rank SKIP_RANK skips the grad-norm one. Gloo cannot tell the two apart (same
shape), so the ranks go on out of step until the others wait in an all-reduce that
rank never issues.
"""

import sys

import paddle
import paddle.distributed as dist
import paddle.distributed.fleet as fleet

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
import paddle_ext  # noqa: E402

SKIP = int(sys.argv[1])


def main() -> None:
    paddle_ext.enable()
    strategy = fleet.DistributedStrategy()
    fleet.init(is_collective=True, strategy=strategy)
    loss, norm = paddle.ones([4]), paddle.ones([4])
    for step in range(4):
        dist.all_reduce(loss)
        if not (dist.get_rank() == SKIP and step == 1):
            dist.all_reduce(norm)
    print(f"rank {dist.get_rank()}: finished the loop", flush=True)


if __name__ == "__main__":
    main()
