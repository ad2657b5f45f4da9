"""Pipeline efficiency on CPU: pp=2 ranks on gloo against one process.

Measured efficiency = single-process step time / (pp * pipelined step time),
both measured in this run on the same model and micro-batches, each process
with one thread. Predicted efficiency = single-process step time / (pp *
predicted step time), where the predicted step time is the simulator's makespan
for the same schedule fed with the F, B and transfer times measured in the
pipelined run, plus the measured time train_batch spends outside the schedule
(optimizer step, tied-weight all-reduce, loss broadcast). Both use the same
costs, so their ratio (predicted / measured step time) says how faithfully the
runtime executes the schedule; the per-action slowdown of two ranks sharing two
cores' caches and memory is in both. The compute-only efficiency the simulator
gives for those costs is printed too. Target: measured >= 90% of predicted.

    python bench/pipeline_cpu.py [--vpp 1] [--microbatches 8] [--hidden 512] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench._launch import (  # noqa: E402
    CPU_ENV,
    MODEL_ARGS,
    add_model_args,
    init_pipeline,
    launch_ranks,
    passed_on,
)

PP = 2


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    add_model_args(p, vpp=1, microbatches=8, micro_batch_size=4, hidden=512, seq=128, vocab=1024, steps=5)
    p.add_argument("--mode", choices=["launch", "single", "rank"], default="launch")
    return p.parse_args(argv)


def model_args(a):
    return a.vocab, a.hidden, a.seq, PP * a.vpp


def single(a) -> None:
    import paddle

    from examples.tiny_gpt import Reference, pattern_batch

    model = Reference(*model_args(a))
    opt = paddle.optimizer.AdamW(1e-3, parameters=model.parameters())
    m, mbs, times = a.microbatches, a.micro_batch_size, []
    for step in range(a.steps + 1):
        ids, labels = pattern_batch(step, m * mbs, a.seq, a.vocab)
        start = time.perf_counter()
        for mb in range(m):
            (model(ids[mb * mbs:(mb + 1) * mbs], labels[mb * mbs:(mb + 1) * mbs]) / m).backward()
        model.tie_grads()
        opt.step()
        opt.clear_grad()
        times.append(time.perf_counter() - start)
    with open(a.out, "w") as f:
        json.dump({"step": statistics.median(times[1:])}, f)


def rank(a) -> None:
    import paddle
    import paddle.distributed as dist
    import paddle.distributed.fleet as fleet

    from examples.tiny_gpt import pattern_batch, pipeline_model
    from paddle_ext.pipeline.schedule import simulate
    from paddle_ext.pipeline.timeline import measured_costs

    init_pipeline(a, PP)
    model = fleet.distributed_model(pipeline_model(*model_args(a), pp=PP, vpp=a.vpp))
    opt = paddle.optimizer.AdamW(1e-3, parameters=model.parameters())
    times, spans, outside = [], [], []
    for step in range(a.steps + 1):
        ids, labels = pattern_batch(step, a.microbatches * a.micro_batch_size, a.seq, a.vocab)
        dist.barrier()
        start = time.perf_counter()
        model.train_batch([ids, labels], opt)
        times.append(time.perf_counter() - start)
        spans.append(model.last_step.spans)
        outside.append(times[-1] - model.last_step.seconds)
    gathered: list = []
    dist.all_gather_object(gathered, spans, group=model.pp_group)
    if dist.get_rank() != 0:
        return
    schedule = model.schedule()
    predictions = []
    for step in range(1, a.steps + 1):
        per_rank = [g[step] for g in gathered]
        sim = simulate(schedule, measured_costs(schedule, per_rank))
        predictions.append((float(sim.makespan) + outside[step], float(sum(sim.busy)) / (PP * float(sim.makespan))))
    with open(a.out, "w") as f:
        json.dump({"step": statistics.median(times[1:]),
                   "predicted_step": statistics.median(p[0] for p in predictions),
                   "schedule_efficiency": statistics.median(p[1] for p in predictions)}, f)


def launch(a) -> None:
    common = passed_on(a, MODEL_ARGS)
    pipe_out = launch_ranks(__file__, common, "pipe.json", nproc=PP, prefix="pipeline_bench_", timeout=600)
    single_out = os.path.join(os.path.dirname(pipe_out), "single.json")
    subprocess.run([sys.executable, os.path.abspath(__file__), "--mode=single", f"--out={single_out}", *common],
                   env={**os.environ, **CPU_ENV}, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=600)
    with open(single_out) as f:
        t_single = json.load(f)["step"]
    with open(pipe_out) as f:
        pipe = json.load(f)
    measured = t_single / (PP * pipe["step"])
    predicted = t_single / (PP * pipe["predicted_step"])
    print(f"pipeline_cpu: pp={PP} vpp={a.vpp} M={a.microbatches} hidden={a.hidden} seq={a.seq}, 1 thread per process")
    print(f"reference single process: {t_single * 1e3:.1f} ms/step; pipelined: {pipe['step'] * 1e3:.1f} ms/step, "
          f"simulator's prediction {pipe['predicted_step'] * 1e3:.1f} ms/step")
    print(f"efficiency measured {measured:.1%}, predicted {predicted:.1%} (the schedule alone: "
          f"{pipe['schedule_efficiency']:.1%}): measured/predicted = {measured / predicted:.2f} (target >= 0.90)")


def main(argv=None) -> None:
    from bench._timing import print_cpu_math_path

    print_cpu_math_path()
    a = parse_args(argv)
    {"launch": launch, "single": single, "rank": rank}[a.mode](a)


if __name__ == "__main__":
    main()
