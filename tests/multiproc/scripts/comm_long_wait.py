"""Rank script: rank 0 keeps the others waiting in a barrier for three times
PADDLE_EXT_HANG_TIMEOUT, first inside paddle_ext.comm.long_wait (a checkpoint
write: the job goes on), then outside it (the watchdog must end the job).
"""

import os
import sys
import time

import paddle
import paddle.distributed as dist
import paddle.distributed.fleet as fleet

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
import paddle_ext  # noqa: E402


def main() -> None:
    paddle_ext.enable()
    fleet.init(is_collective=True, strategy=fleet.DistributedStrategy())
    rank, pause = dist.get_rank(), 3 * float(os.environ["PADDLE_EXT_HANG_TIMEOUT"])
    dist.all_reduce(paddle.ones([4]))
    with paddle_ext.comm.long_wait(60):
        if rank == 0:
            time.sleep(pause)  # writing a checkpoint
        dist.barrier()
    print(f"rank {rank}: past the long wait", flush=True)
    if rank == 0:
        time.sleep(pause)
    dist.barrier()
    print(f"rank {rank}: past the unguarded wait", flush=True)


if __name__ == "__main__":
    main()
