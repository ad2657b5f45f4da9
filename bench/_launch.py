"""Running a benchmark's own file as ranks under paddle.distributed.launch.

Each multi-process bench is one file with two modes: `--mode=launch` (what the user
runs) starts the ranks with `--mode=rank` and reads back what they wrote to `--out`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from typing import Sequence

CPU_ENV = {"OMP_NUM_THREADS": "1", "PADDLE_EXT_NUM_THREADS": "1"}


def add_model_args(p: argparse.ArgumentParser, *, vpp: int, microbatches: int, micro_batch_size: int,
                   hidden: int, seq: int, vocab: int, steps: int) -> None:
    """The pipeline model's shape and the step count, with this bench's defaults."""
    p.add_argument("--vpp", type=int, default=vpp)
    p.add_argument("--microbatches", type=int, default=microbatches)
    p.add_argument("--micro-batch-size", type=int, default=micro_batch_size)
    p.add_argument("--hidden", type=int, default=hidden)
    p.add_argument("--seq", type=int, default=seq)
    p.add_argument("--vocab", type=int, default=vocab)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--out", default="")


def passed_on(a: argparse.Namespace, names: Sequence[str]) -> list[str]:
    """The options `names` (attribute names) as command-line arguments for the ranks."""
    return [f"--{n.replace('_', '-')}={getattr(a, n)}" for n in names]


MODEL_ARGS = ("vpp", "microbatches", "micro_batch_size", "hidden", "seq", "vocab", "steps")


def launch_ranks(script: str, args: Sequence[str], out_name: str, nproc: int = 2, devices: str = "",
                 prefix: str = "bench_", timeout: int = 900) -> str:
    """Runs `script --mode=rank --out=<scratch>/<out_name> args` on `nproc` CPU processes
    (gloo, one thread each) or on `devices` ("0,1": GPUs, NCCL); returns that --out path."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    out = os.path.join(tmp, out_name)
    env = dict(os.environ) if devices else {**os.environ, **CPU_ENV}
    where = ["--devices", devices] if devices else ["--nproc_per_node", str(nproc)]
    subprocess.run([sys.executable, "-m", "paddle.distributed.launch", *where, "--log_dir",
                    os.path.join(tmp, "logs"), os.path.abspath(script), "--mode=rank", f"--out={out}", *args],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
    return out


def init_pipeline(a: argparse.Namespace, pp: int, dp: int = 1, pp_configs: dict | None = None):
    """In a rank: paddle_ext on, fleet initialised for pp x dp with the bench's micro-batching
    (and `pp_configs`); returns fleet's HybridCommunicateGroup."""
    import paddle.distributed.fleet as fleet

    import paddle_ext

    paddle_ext.enable()  # before fleet.init: the CPU/gloo fixes cover its set-up
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": dp, "mp_degree": 1, "pp_degree": pp, **(
        {"pp_configs": pp_configs} if pp_configs else {})}
    strategy.pipeline_configs = {"accumulate_steps": a.microbatches, "micro_batch_size": a.micro_batch_size}
    fleet.init(is_collective=True, strategy=strategy)
    return fleet.get_hybrid_communicate_group()
