"""dp gradient all-reduce overlapped with the pipeline's backward, on CPU (gloo).

pp2 x dp2 (4 processes, one thread each) on a model whose gradient all-reduce is a
sizeable share of the step: wide MLP blocks (4 * hidden**2 parameters each) on short
sequences. Two engines over the same model and data in one job, overlap off
(pp_configs.dp_comm_overlap = False: the same bucket all-reduces, run after the
schedule) and on, their steps alternating so that both see the same machine load.

Printed (medians over the measured steps; the step time of a step is the slowest
rank's, since the ranks wait for each other):
- step time with overlap on and off, and their ratio;
- communication time C: the bucket all-reduces of one step timed on their own,
  after a barrier (so no rank waits for a late peer), synchronously;
- hidden fraction from step times: median over the step pairs (each step runs off
  and on back to back, alternating which goes first) of (off - on), divided by C;
- hidden fraction from the time train_batch spends after the schedule in the
  reduction (off) or still waiting for it (on), per rank: median over the step pairs
  of (off - on) / C, averaged over the ranks. Both include noise from the dp peers'
  skew (a rank waits there for its slower peer); the machines here are shared, so
  run it more than once.

    python bench/grad_overlap_cpu.py [--hidden 1024] [--blocks 4] [--vpp 2] [--microbatches 4] [--seq 8] [--steps 12] [--gpus 4]

The machine this runs on is small (2 cores for 4 ranks here): compute and the
loopback transfers compete for the same cores, so the figures are a lower bound of
what separate devices and a network give.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench._launch import init_pipeline  # noqa: E402

PP, DP = 2, 2


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--blocks", type=int, default=4, help="transformer blocks in the whole model")
    p.add_argument("--vpp", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument("--seq", type=int, default=8)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--bucket-mb", type=float, default=128.0)
    p.add_argument("--gpus", type=int, default=0, help="run on this many GPUs (NCCL) instead of gloo; needs 4")
    p.add_argument("--mode", choices=["launch", "rank"], default="launch")
    p.add_argument("--out", default="")
    return p.parse_args(argv)


def rank(a) -> None:
    import paddle
    import paddle.distributed as dist
    import paddle.distributed.fleet as fleet

    from examples.tiny_gpt import pattern_batch, pipeline_model
    from paddle_ext.pipeline.engine import PipelineEngine, PipelineSettings
    from paddle_ext.pipeline.grad_sync import GradSyncSettings

    hcg = init_pipeline(a, PP, DP)
    engines = {}
    for overlap in (False, True):
        paddle.seed(0)
        model = pipeline_model(a.vocab, a.hidden, a.seq, blocks=a.blocks, pp=PP, vpp=a.vpp)
        settings = PipelineSettings(a.microbatches, a.micro_batch_size,
                                    grad_sync=GradSyncSettings(dp_overlap=overlap, bucket_mb=a.bucket_mb))
        engine = PipelineEngine(model, hcg, settings)
        opt = fleet.distributed_optimizer(paddle.optimizer.SGD(1e-4, parameters=model.parameters()))
        engines[overlap] = (engine, opt)
    stats = {k: {"step": [], "finish": [], "schedule": []} for k in (False, True)}
    shard = hcg.get_data_parallel_rank()
    rows = a.microbatches * a.micro_batch_size
    for step in range(a.steps + 1):
        ids, labels = pattern_batch(step, DP * rows, a.seq, a.vocab)
        ids, labels = ids[shard * rows:(shard + 1) * rows], labels[shard * rows:(shard + 1) * rows]
        for overlap in ((False, True) if step % 2 == 0 else (True, False)):
            engine, opt = engines[overlap]
            dist.barrier()
            start = time.perf_counter()
            engine.train_batch([ids, labels], opt)
            elapsed = time.perf_counter() - start
            if step:  # the first step of each is warm-up (and teaches the early launch)
                stats[overlap]["step"].append(elapsed)
                stats[overlap]["finish"].append(engine._grad_sync.last.finish_seconds)
                stats[overlap]["schedule"].append(engine.last_step.seconds)
    engine = engines[True][0]
    buckets = engine._grad_sync.buckets
    group = hcg.get_data_parallel_group()
    comm = []
    for _ in range(5):  # the same collectives, on their own
        dist.barrier()
        start = time.perf_counter()
        for b in buckets:
            dist.all_reduce(b.buffer, group=group)
        comm.append(time.perf_counter() - start)
    out = {"step_off": stats[False]["step"], "step_on": stats[True]["step"], "after_off": stats[False]["finish"],
           "after_on": stats[True]["finish"], "sched_off": stats[False]["schedule"],
           "sched_on": stats[True]["schedule"], "comm": statistics.median(comm)}
    out.update(rank=dist.get_rank(), stage=hcg.get_stage_id(), grad_bytes=sum(b.nbytes for b in buckets),
               buckets=len(buckets))
    with open(os.path.join(a.out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(out, f)


def launch(a) -> None:
    env = dict(os.environ) if a.gpus else {**os.environ, "OMP_NUM_THREADS": "1", "PADDLE_EXT_NUM_THREADS": "1"}
    if a.gpus and a.gpus != PP * DP:
        raise SystemExit(f"--gpus must be {PP * DP} (pp={PP} x dp={DP})")
    devices = ["--devices", ",".join(map(str, range(a.gpus)))] if a.gpus else ["--nproc_per_node", str(PP * DP)]
    tmp = tempfile.mkdtemp(prefix="grad_overlap_bench_")
    args = [f"--hidden={a.hidden}", f"--blocks={a.blocks}", f"--vpp={a.vpp}", f"--microbatches={a.microbatches}",
            f"--micro-batch-size={a.micro_batch_size}", f"--seq={a.seq}", f"--vocab={a.vocab}",
            f"--steps={a.steps}", f"--bucket-mb={a.bucket_mb}"]
    me = os.path.abspath(__file__)
    subprocess.run([sys.executable, "-m", "paddle.distributed.launch", *devices,
                    "--log_dir", os.path.join(tmp, "logs"), me, "--mode=rank", f"--out={tmp}", *args],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
    ranks = []
    for path in sorted(glob.glob(os.path.join(tmp, "rank*.json"))):
        with open(path) as f:
            ranks.append(json.load(f))
    backend = f"NCCL on {a.gpus} GPUs" if a.gpus else "gloo, 1 thread per process"
    print(f"grad_overlap_cpu: pp={PP} x dp={DP} on {backend}, vpp={a.vpp} M={a.microbatches} hidden={a.hidden} "
          f"blocks={a.blocks} seq={a.seq} mbs={a.micro_batch_size}, {a.steps} steps")
    ms = lambda x: f"{x * 1e3:.1f} ms"  # noqa: E731
    for r in ranks:
        print(f"rank {r['rank']} (stage {r['stage']}, {r['grad_bytes'] / 2**20:.1f} MiB of gradients in "
              f"{r['buckets']} buckets): all-reduces on their own {ms(r['comm'])}; after the schedule: "
              f"off {ms(statistics.median(r['after_off']))}, on {ms(statistics.median(r['after_on']))}; "
              f"the schedule itself: off {ms(statistics.median(r['sched_off']))}, "
              f"on {ms(statistics.median(r['sched_on']))}")
    steps = len(ranks[0]["step_off"])
    off = [max(r["step_off"][i] for r in ranks) for i in range(steps)]
    on = [max(r["step_on"][i] for r in ranks) for i in range(steps)]
    step_off, step_on = statistics.median(off), statistics.median(on)
    comm = max(r["comm"] for r in ranks)
    by_steps = statistics.median(a - b for a, b in zip(off, on)) / comm
    by_wait = statistics.mean(statistics.median(a - b for a, b in zip(r["after_off"], r["after_on"])) / r["comm"]
                              for r in ranks)
    print(f"step time: overlap off {ms(step_off)}, on {ms(step_on)}: on/off = {step_on / step_off:.3f}")
    print(f"communication C = {ms(comm)} ({comm / step_off:.0%} of the step without overlap); hidden: "
          f"{by_steps:.0%} by step times, {by_wait:.0%} by the wait after the schedule")


def main(argv=None) -> None:
    from bench._timing import print_cpu_math_path

    print_cpu_math_path()
    a = parse_args(argv)
    {"launch": launch, "rank": rank}[a.mode](a)


if __name__ == "__main__":
    main()
