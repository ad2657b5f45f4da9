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

--kinds runs several schedules in one run (each its own launch, the same
single-process reference), e.g. `--kinds 1f1b,zb-h1` or, with --vpp 2,
`--kinds interleaved,interleaved-zb`; each row prints the measured step time, the
measured bubble (1 - busy / (pp * makespan) of the recorded spans) and the
simulator's for the measured costs, and the step time relative to the first kind;
--repeats launches each kind that many times in ABBA order and averages.
The kinds go through pp_configs.schedule_mode, as a user selects them (dualpipev:
pp_configs.use_dualpipev). The V kinds (zb-v, dualpipev) run on the same blocks built as a
use_dualpipev PipelineLayer (Paddle 3.3+; two chunks per rank in a V); 1f1b and zb-h1 run
with one chunk per rank and the interleaved kinds with --vpp (at least 2 when the run
mixes them with V kinds), so every kind of one run trains the same model:
pp * max(vpp, 2) blocks when a V kind is in the run, else pp * vpp.

--p2p picks where the transfers run, each path its own launch in the same ABBA order:
`default` (no pp_configs key: the engine's choice, TCP streams on gloo),
`blocking` (overlap_p2p_comm False: send/recv on the compute thread, the old default),
`streams` (overlap_p2p_comm True: TCP streams driven by the compute thread), `threads`
(overlap_p2p_comm True with PADDLE_EXT_PP_TRANSFERS=threads: communication threads over
one-way gloo groups, the path before issue 41). Each row then also prints, per rank and step, the
compute thread's time outside compute (transfers, waits in blocking ones or for a
receive still in flight, bubble) beside the simulator's compute-only bubble for the
measured costs, and the median F / B (I / W) per chunk and micro-batch.
--micro-batch-sizes 4,1 runs everything at each size in turn (the bench's and one 4x
smaller), each with its own single-process reference.

    python bench/pipeline_cpu.py [--pp 2] [--vpp 1] [--microbatches 8] [--hidden 512] [--steps 5]
                                 [--kinds 1f1b,interleaved,zb-h1,zb-v,dualpipev --vpp 2]
                                 [--p2p default,blocking] [--micro-batch-sizes 4,1]
"""

from __future__ import annotations

import argparse
import dataclasses
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

MODES = {"": "", "1f1b": "1F1B", "interleaved": "VPP", "zb-h1": "ZBH1", "interleaved-zb": "ZBVPP", "zb-v": "ZBV",
         "dualpipev": ""}
V_KINDS = ("zb-v", "dualpipev")
ONE_CHUNK = ("1f1b", "zb-h1")
P2P_PATHS = {"default": None, "blocking": False, "streams": True, "threads": True}  # -> overlap_p2p_comm
P2P_WAYS = {"streams": "streams", "threads": "threads"}  # -> PADDLE_EXT_PP_TRANSFERS (transfer_paths.py)


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    add_model_args(p, vpp=1, microbatches=8, micro_batch_size=4, hidden=512, seq=128, vocab=1024, steps=5)
    p.add_argument("--mode", choices=["launch", "single", "rank"], default="launch")
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--kind", default="", choices=sorted(MODES))
    p.add_argument("--kinds", default="", help="comma-separated schedule kinds (launch mode)")
    p.add_argument("--repeats", type=int, default=2, help="launches per kind, in ABBA order (launch mode)")
    p.add_argument("--blocks", type=int, default=0, help="transformer blocks (default: see the module docstring)")
    p.add_argument("--p2p", default="default",
                   help="comma-separated p2p paths, each its own launch: default (no pp_configs key), "
                        "blocking (overlap_p2p_comm False: send/recv on the compute thread), streams, threads "
                        "(overlap_p2p_comm True)")
    p.add_argument("--micro-batch-sizes", default="",
                   help="comma-separated micro-batch sizes to run one after another in this run "
                        "(e.g. 4,1: the bench's size and one 4x smaller); default: --micro-batch-size")
    return p.parse_args(argv)


def model_args(a):
    return a.vocab, a.hidden, a.seq, a.blocks or a.pp * a.vpp


def kind_vpp(kind: str, vpp: int) -> int:
    """Chunks per rank a kind runs with in this bench (V kinds: 2, in a V)."""
    return 1 if kind in ONE_CHUNK else 2 if kind in V_KINDS else vpp


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

    from examples.tiny_gpt import pattern_batch, pipeline_model, v_pipeline_model
    from paddle_ext.pipeline.schedule import simulate
    from paddle_ext.pipeline.schedule.ir import Comm
    from paddle_ext.pipeline.timeline import (
        busy_share,
        measured_costs,
        measured_result,
        replayed_costs,
    )

    PP = a.pp
    configs = {"use_dualpipev": True} if a.kind == "dualpipev" else {"schedule_mode": MODES[a.kind]} if a.kind else {}
    if P2P_PATHS[a.p2p] is not None:
        configs["overlap_p2p_comm"] = P2P_PATHS[a.p2p]
    if a.p2p in P2P_WAYS:
        os.environ["PADDLE_EXT_PP_TRANSFERS"] = P2P_WAYS[a.p2p]
    init_pipeline(a, PP, pp_configs=configs or None)
    layers = (v_pipeline_model(*model_args(a), pp=PP) if a.kind in V_KINDS
              else pipeline_model(*model_args(a), pp=PP, vpp=a.vpp))
    model = fleet.distributed_model(layers)
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
    threaded = bool(model._overlap_p2p_comm)  # Paddle's attribute: the path this engine took
    predictions = []
    for step in range(1, a.steps + 1):
        per_rank = [g[step] for g in gathered]
        costs = measured_costs(schedule, per_rank)
        sim = simulate(schedule, costs, async_p2p=threaded)
        replay = simulate(schedule, replayed_costs(schedule, per_rank), async_p2p=threaded)
        real = measured_result(schedule, per_rank)
        # The compute-only bubble the simulator predicts for these costs (transfers free),
        # per rank, mean over ranks: what no transfer path can remove.
        ideal = simulate(schedule.compute_only(), dataclasses.replace(costs, comm=0))
        bubble = statistics.mean(float(ideal.makespan) - float(b) for b in ideal.busy)
        # The compute thread's time outside compute in the step (transfers, the waits
        # inside blocking ones, waits for a communication thread, bubble), per rank.
        off = statistics.mean(float(real.makespan) - float(b) for b in real.busy)
        # transfers and the waits inside them (a blocking send/recv's span), per rank, mean over ranks
        comm = statistics.mean(sum(end - start for _, act, start, end in spans if isinstance(act, Comm))
                               for spans in per_rank)
        predictions.append((float(sim.makespan) + outside[step], float(sum(sim.busy)) / (PP * float(sim.makespan)),
                            1 - float(sum(real.busy)) / (PP * float(real.makespan)), comm, off, bubble,
                            outside[step], costs.forward, costs.backward, costs.input_grad or 0.0,
                            costs.weight_grad or 0.0, float(replay.makespan) + outside[step],
                            busy_share(real, min(PP, os.cpu_count() or 1)),
                            {str(k): list(v) for k, v in sorted(costs.per_stage.items())}))
    with open(a.out, "w") as f:
        json.dump({"step": statistics.median(times[1:]),
                   "predicted_step": statistics.median(p[0] for p in predictions),
                   "schedule_efficiency": statistics.median(p[1] for p in predictions),
                   "measured_bubble": statistics.median(p[2] for p in predictions),
                   "comm_and_wait": statistics.median(p[3] for p in predictions),
                   "off_compute": statistics.median(p[4] for p in predictions),
                   "ideal_bubble": statistics.median(p[5] for p in predictions),
                   "outside": statistics.median(p[6] for p in predictions),
                   "costs": [statistics.median(p[k] for p in predictions) for k in (7, 8, 9, 10)],
                   "replayed_step": statistics.median(p[11] for p in predictions),
                   "cores_saturated": statistics.median(p[12] for p in predictions),
                   "per_stage": {k: [statistics.median(p[13][k][i] for p in predictions)
                                     for i in range(len(v))] for k, v in predictions[0][13].items()},
                   "kind": f"{schedule.kind} {model._transfers.name}"}, f)


def launch(a) -> None:
    kinds = [k.strip() for k in a.kinds.split(",") if k.strip()] or [a.kind]
    unknown = [k for k in kinds if k not in MODES]
    if unknown:
        raise SystemExit(f"--kinds: unknown kind(s) {unknown}; allowed: {sorted(k for k in MODES if k)}")
    paths = [x.strip() for x in a.p2p.split(",") if x.strip()]
    if not paths or any(x not in P2P_PATHS for x in paths):
        raise SystemExit(f"--p2p = {a.p2p!r}: allowed: comma-separated {sorted(P2P_PATHS)}")
    sizes = [int(x) for x in a.micro_batch_sizes.split(",") if x.strip()] or [a.micro_batch_size]
    if any(x < 1 for x in sizes):
        raise SystemExit(f"--micro-batch-sizes = {a.micro_batch_sizes!r}: each must be >= 1")
    if any(k in V_KINDS for k in kinds):
        a.vpp = max(a.vpp, 2)
    a.blocks = a.blocks or a.pp * a.vpp
    for size in sizes:
        a.micro_batch_size = size
        launch_one_size(a, kinds, paths)


def launch_one_size(a, kinds: list, paths: list) -> None:
    common = [x for x in passed_on(a, MODEL_ARGS) if not x.startswith("--vpp=")] + [f"--pp={a.pp}",
                                                                                    f"--blocks={a.blocks}"]
    # ABBA order (--repeats 2): on a shared machine a later launch can run faster or slower
    # than an earlier one whatever its schedule; each variant's figures are its runs' means
    variants = [(k, x) for k in kinds for x in paths]
    order = [v for r in range(a.repeats) for v in (variants if r % 2 == 0 else variants[::-1])]
    runs: dict = {v: [] for v in variants}
    for kind, path in order:
        pipe_out = launch_ranks(__file__, [*common, f"--kind={kind}", f"--vpp={kind_vpp(kind, a.vpp)}",
                                           f"--p2p={path}"], "pipe.json",
                                nproc=a.pp, prefix="pipeline_bench_", timeout=600)
        with open(pipe_out) as f:
            runs[(kind, path)].append(json.load(f))
        single_out = os.path.join(os.path.dirname(pipe_out), "single.json")
    def mean(values: list):
        if isinstance(values[0], dict):
            return {k: mean([v[k] for v in values]) for k in values[0]}
        return [statistics.mean(x) for x in zip(*values)] if isinstance(values[0], list) else statistics.mean(values)

    rows = [{key: (mean([r[key] for r in runs[v]]) if key != "kind" else runs[v][0][key])
             for key in runs[v][0]} for v in variants]
    for row, (_kind, path) in zip(rows, variants):
        row["label"] = row["kind"] + (" (no key)" if path == "default" else "")
    subprocess.run([sys.executable, os.path.abspath(__file__), "--mode=single", f"--out={single_out}", *common,
                    f"--vpp={a.vpp}"],
                   env={**os.environ, **CPU_ENV}, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=600)
    with open(single_out) as f:
        t_single = json.load(f)["step"]
    pp = a.pp
    print(f"pipeline_cpu: pp={pp} vpp={a.vpp} blocks={a.blocks} M={a.microbatches} micro-batch size "
          f"{a.micro_batch_size} hidden={a.hidden} seq={a.seq}, 1 thread per process, {a.repeats} launch(es) per "
          f"variant; reference single process: {t_single * 1e3:.1f} ms/step; load average {os.getloadavg()[0]:.1f}")
    ref = rows[0]
    for pipe in rows:
        measured = t_single / (pp * pipe["step"])
        predicted = t_single / (pp * pipe["predicted_step"])
        print(f"{pipe['label']:>26}: {pipe['step'] * 1e3:.1f} ms/step ({pipe['step'] / ref['step']:.2f}x "
              f"{ref['label']}), simulator's prediction {pipe['predicted_step'] * 1e3:.1f} ms/step; bubble "
              f"measured {pipe['measured_bubble']:.1%}, simulated {1 - pipe['schedule_efficiency']:.1%}; efficiency "
              f"measured {measured:.1%}, predicted {predicted:.1%}: measured/predicted = {measured / predicted:.2f} "
              "(target >= 0.90)")
        print(f"{'':>28}per rank and step: compute thread outside compute (transfers, waits, bubble) "
              f"{pipe['off_compute'] * 1e3:.1f} ms ({pipe['off_compute'] / ref['off_compute']:.2f}x "
              f"{ref['label']}) beside the simulator's compute-only bubble {pipe['ideal_bubble'] * 1e3:.1f} ms; "
              f"spans of transfer actions {pipe['comm_and_wait'] * 1e3:.1f} ms; outside the schedule "
              f"(optimizer, loss broadcast) {pipe['outside'] * 1e3:.1f} ms")
        replayed = t_single / (pp * pipe["replayed_step"])
        print(f"{'':>28}the simulator replaying each action's own measured time (not the medians): "
              f"{pipe['replayed_step'] * 1e3:.1f} ms/step, efficiency {replayed:.1%}: measured/replayed = "
              f"{measured / replayed:.2f} (what the runtime adds beyond the schedule's dependencies)")
        cores = min(pp, os.cpu_count() or 1)
        if cores < pp:
            print(f"{'':>28}{pp} ranks on {cores} cores: {cores} or more ranks compute at once for "
                  f"{pipe['cores_saturated']:.0%} of the step (the cores are saturated then, whatever the "
                  "schedule; the medians above price every action as if it had a core of its own)")
        f, b, i, w = (x * 1e3 for x in pipe["costs"])
        split = f", I {i:.1f} + W {w:.1f} = {i + w:.1f} ms" if i and w else ""
        print(f"{'':>28}median per chunk and micro-batch: F {f:.1f} ms, B {b:.1f} ms{split}")
        stages = "; ".join(f"{k}: " + " / ".join(f"{x * 1e3:.1f}" for x in v)
                           for k, v in pipe["per_stage"].items())
        print(f"{'':>28}per stage (F / B, or F / I / W), ms: {stages}")


def main(argv=None) -> None:
    from bench._timing import print_cpu_math_path

    print_cpu_math_path()
    a = parse_args(argv)
    {"launch": launch, "single": single, "rank": rank}[a.mode](a)


if __name__ == "__main__":
    main()
