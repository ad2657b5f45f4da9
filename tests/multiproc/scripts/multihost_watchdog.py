"""Rank script (two ranks, across emulated hosts in test_multihost_watchdog.py): the comm
watchdog's heartbeat, with a short comm.heartbeat_timeout (PADDLE_EXT_HEARTBEAT_TIMEOUT).

Usage: multihost_watchdog.py DIR [COMPUTE_S|-] [together] [end]
1. slow but alive: rank 0 runs pure Python for COMPUTE_S seconds (the GIL held but
   yielded) while rank 1 waits in an all-reduce (gloo releases the GIL), then rank 1 runs
   matmuls for COMPUTE_S seconds (Paddle's kernels release the GIL) while rank 0 waits:
   nobody may be called lost. Prints "rank R: alive after the slow steps" (with the
   all-reduce checked against its exact value);
2. rank 1 writes DIR/stepping and both loop on all-reduces: the test pulls host 1's cable
   meanwhile, and the watchdog must end both ranks (nothing else does: gloo waits ~30 s).
COMPUTE_S defaults to 3 x the heartbeat timeout. together: in 1, both ranks compute at
once (rank 0 in Python, rank 1 in kernels), neither communicating, then all-reduce
(a long step: gloo's own timeout does not apply); end: stop after 1 (the measurement by
hand of a 60 s step under the default settings).
"""

from __future__ import annotations

import os
import sys
import time

import paddle
import paddle.distributed as dist
import paddle.distributed.fleet as fleet

import paddle_ext


def python_busy(seconds: float) -> None:
    start, n = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        n += sum(i * i for i in range(2000))


def kernel_busy(seconds: float) -> None:
    a = paddle.randn([256, 256])
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        a = paddle.tanh(paddle.matmul(a, a))


def main() -> None:
    directory = sys.argv[1]
    given = sys.argv[2] if len(sys.argv) > 2 else "-"
    busy = float(given) if given != "-" else 3 * float(os.environ["PADDLE_EXT_HEARTBEAT_TIMEOUT"])
    flags = set(sys.argv[3:])
    paddle_ext.enable()
    fleet.init(is_collective=True, strategy=fleet.DistributedStrategy())
    rank = dist.get_rank()
    turns = [(rank, (python_busy, kernel_busy)[rank])] if "together" in flags else \
        [(0, python_busy), (1, kernel_busy)]
    for worker, work in turns:
        if rank == worker:
            work(busy)
        x = paddle.full([4], float(rank + 1))
        dist.all_reduce(x)
        assert x.numpy().tolist() == [3.0] * 4, x.numpy()
    print(f"rank {rank}: alive after the slow steps ({busy:.1f} s each)", flush=True)
    if "end" in flags:
        return
    step = 0
    while True:
        dist.all_reduce(paddle.ones([4]))
        if rank == 1 and step == 0:
            with open(os.path.join(directory, "stepping"), "w"):
                pass
        step += 1
        time.sleep(0.01)


if __name__ == "__main__":
    main()
