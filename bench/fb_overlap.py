"""The forward/backward overlap scheduler on CPU: predicted gain against measured step times.

pp=2 ranks on gloo (one thread each), examples/overlap_gpt.py (attention and MLP nodes,
its overlapped_forward_backward interleaving them), the same micro-batches in every run:

  plain          the interleaved schedule, no overlap
  overlap        forward_backward_overlap_scheduler: steady-state F&B steps
  overlap+async  the same with overlap_p2p_comm (communication threads)

Printed: the median step time of each, and the simulator's prediction for the same
schedules with the F, B and transfer costs measured in the plain run, (a) with an F&B
that costs 0.7 * (F + B) (what a GPU reaches when one micro-batch's communication or
memory-bound kernels hide behind the other's compute), and (b) with the F&B cost
measured here. On a CPU with one thread per rank the two halves of an F&B share one
core, so (b) is close to 1: the measured times should follow (b), not (a).

    python bench/fb_overlap.py [--vpp 2] [--microbatches 8] [--hidden 256] [--steps 5]
    python bench/fb_overlap.py --gpus 0,1 --hidden 2048 --seq 1024   # two GPUs, NCCL

Every run also prints the last step's loss of each mode: they must be equal (bit for
bit on CPU; on GPUs too unless a kernel accumulates with atomics).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench._launch import MODEL_ARGS, add_model_args, init_pipeline, launch_ranks, passed_on  # noqa: E402

PP = 2
MODES = ("plain", "overlap", "overlap+async")
RATIO = 0.7


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p, vpp=2, microbatches=8, micro_batch_size=4, hidden=256, seq=128, vocab=1024, steps=5)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--gpus", default="", help="e.g. 0,1: run the ranks on these GPUs (NCCL) "
                   "instead of CPU processes on gloo")
    p.add_argument("--mode", choices=["launch", "rank"], default="launch")
    return p.parse_args(argv)


def rank(a) -> None:
    import paddle
    import paddle.distributed as dist

    from examples.overlap_gpt import overlap_model
    from examples.tiny_gpt import pattern_batch
    from paddle_ext.pipeline.engine import PipelineEngine, PipelineSettings

    hcg = init_pipeline(a, PP)
    results = {}
    for mode in MODES:
        paddle.seed(0)
        model = overlap_model(a.vocab, a.hidden, a.seq, blocks=PP * a.vpp, pp=PP, vpp=a.vpp, heads=a.heads)
        settings = PipelineSettings(a.microbatches, a.micro_batch_size, fb_overlap=mode != "plain",
                                    overlap_p2p=mode == "overlap+async")
        engine = PipelineEngine(model, hcg, settings)
        opt = paddle.optimizer.AdamW(1e-3, parameters=model.parameters())
        times = []
        for step in range(a.steps + 1):
            ids, labels = pattern_batch(step, a.microbatches * a.micro_batch_size, a.seq, a.vocab)
            dist.barrier()
            start = time.perf_counter()
            loss = engine.train_batch([ids, labels], opt)
            loss = float(loss)  # waits for the device
            times.append(time.perf_counter() - start)
        spans = engine.last_step.spans
        gathered: list = []
        dist.all_gather_object(gathered, [(p, str(act), s, e) for p, act, s, e in spans], group=engine.pp_group)
        results[mode] = {"step": statistics.median(times[1:]), "spans": gathered, "loss": loss,
                         "schedule": engine.schedule().to_text()}
    if dist.get_rank() == 0:
        with open(a.out, "w") as fh:
            json.dump(results, fh)


def report(a, results) -> None:
    from paddle_ext.pipeline.schedule import FB, Costs, Schedule, parse_action, simulate, stage_of
    from paddle_ext.pipeline.timeline import measured_costs

    def spans_of(mode):
        return [[(p, parse_action(act), s, e) for p, act, s, e in row] for row in results[mode]["spans"]]

    plain = Schedule.from_text(results["plain"]["schedule"])
    over = Schedule.from_text(results["overlap"]["schedule"])
    threaded = Schedule.from_text(results["overlap+async"]["schedule"])
    costs = measured_costs(plain, spans_of("plain"))
    base = simulate(plain, costs).makespan
    # Each F&B step against its own F's and B's stage costs, measured in the same run.
    own = measured_costs(over, spans_of("overlap")).per_stage
    ratios = [(e - s) / (own[stage_of(PP, r, act.f.chunk)][0] + own[stage_of(PP, r, act.b.chunk)][1])
              for r, row in enumerate(spans_of("overlap")) for _p, act, s, e in row if isinstance(act, FB)]
    measured_ratio = statistics.median(ratios)

    def predicted(schedule, ratio, threads=False):
        c = Costs(costs.forward, costs.backward, costs.comm, overlap_ratio=ratio, per_stage=costs.per_stage)
        return simulate(schedule, c, async_p2p=threads).makespan

    t_plain = results["plain"]["step"]
    where = f"GPUs {a.gpus}, NCCL" if a.gpus else "gloo, 1 thread per rank"
    print(f"fb_overlap: pp={PP} vpp={a.vpp} M={a.microbatches} hidden={a.hidden} seq={a.seq} "
          f"micro_batch={a.micro_batch_size}, {where}")
    losses = {mode: results[mode]["loss"] for mode in MODES}
    print("last step's loss: " + ", ".join(f"{mode} {loss!r}" for mode, loss in losses.items())
          + (" (equal)" if len(set(losses.values())) == 1 else " (DIFFERENT)"))
    print(f"measured costs (plain run): F {costs.forward * 1e3:.2f} ms, B {costs.backward * 1e3:.2f} ms, "
          f"transfer {costs.comm * 1e3:.2f} ms per chunk and micro-batch; measured F&B = "
          f"{measured_ratio:.2f} x (F + B)")
    print(f"{'':16}{'measured step':>15}{'gain':>8}{'predicted, F&B=0.7(F+B)':>26}{'gain':>8}"
          f"{'predicted, F&B measured':>26}{'gain':>8}")
    for mode, schedule, threads in (("plain", plain, False), ("overlap", over, False),
                                    ("overlap+async", threaded, True)):
        t = results[mode]["step"]
        p07 = base if mode == "plain" else predicted(schedule, RATIO, threads)
        pm = base if mode == "plain" else predicted(schedule, measured_ratio, threads)
        print(f"{mode:16}{t * 1e3:12.1f} ms{1 - t / t_plain:8.1%}{p07 * 1e3:23.1f} ms{1 - p07 / base:8.1%}"
              f"{pm * 1e3:23.1f} ms{1 - pm / base:8.1%}")
    print("(predictions: the simulator on each run's own schedule with the plain run's measured costs; "
          "steps add the optimizer and loss broadcast, which the schedule does not contain)")


def launch(a) -> None:
    out = launch_ranks(__file__, passed_on(a, (*MODEL_ARGS, "heads")), "results.json", nproc=PP, devices=a.gpus,
                       prefix="fb_overlap_bench_")
    with open(out) as fh:
        report(a, json.load(fh))


def main(argv=None) -> None:
    from bench._timing import print_cpu_math_path

    print_cpu_math_path()
    a = parse_args(argv)
    (rank if a.mode == "rank" else launch)(a)


if __name__ == "__main__":
    main()
