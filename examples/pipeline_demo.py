"""The main job: a small GPT-style model trained with pipeline parallelism on CPU.

pp=2 ranks x 2 virtual stages each (interleaved VPP, which stock Paddle refuses
for pp=2), accumulate_steps=5 (not a multiple of pp: an unbalanced schedule),
the lm head tied to the embedding across the first and last stage, on gloo.
Prints the loss per step, the simulated and measured bubble, and writes a
timeline picture of the measured last step.

    python examples/pipeline_demo.py [--steps 6] [--out build/demo]

Run as above it starts its two ranks through paddle.distributed.launch and
prints rank 0's report; each rank runs this same file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PP, VPP, ACCUMULATE, MICRO_BATCH = 2, 2, 5, 4
VOCAB, HIDDEN, SEQ = 256, 128, 32


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "demo"))
    parser.add_argument("--timeout", type=float, default=300)
    return parser.parse_args(argv)


def launch(args) -> int:
    return launch_ranks(__file__, PP, args.out, ["--steps", str(args.steps), "--out", args.out], args.timeout,
                        "[demo]", lambda line: line.startswith("[demo]") or "Error" in line)


def launch_ranks(script: str, nproc: int, out: str, script_args: list, timeout: float, tag: str,
                 keep) -> int:
    """Starts `script` on `nproc` ranks through paddle.distributed.launch (logs in
    OUT/logs) and prints the lines of rank 0's log that `keep` selects."""
    os.makedirs(out, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PADDLE_EXT_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
           "--log_dir", os.path.join(out, "logs"), os.path.abspath(script), *script_args]
    print(f"{tag} starting {nproc} ranks: logs in {os.path.join(out, 'logs')}", flush=True)
    try:
        rc = subprocess.run(cmd, env=env, timeout=timeout, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT).returncode
    except subprocess.TimeoutExpired:
        print(f"{tag} no result within {timeout:.0f} s", flush=True)
        rc = 1
    log = os.path.join(out, "logs", "workerlog.0")
    if os.path.exists(log):
        with open(log, errors="replace") as f:
            lines = [line for line in f if keep(line)]
        sys.stdout.write("".join(lines))
    print(f"{tag} {'finished' if rc == 0 else f'FAILED (exit {rc})'}", flush=True)
    return rc


def train(args) -> None:
    sys.path.insert(0, ROOT)
    import paddle
    import paddle.distributed as dist
    import paddle.distributed.fleet as fleet

    import paddle_ext
    from examples.tiny_gpt import pattern_batch, pipeline_model
    from paddle_ext.comm import trace
    from paddle_ext.pipeline.schedule import render, simulate
    from paddle_ext.pipeline.timeline import measured_costs, measured_result

    paddle_ext.enable()  # before fleet.init: the CPU/gloo fixes cover its set-up
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": PP}
    strategy.pipeline_configs = {"accumulate_steps": ACCUMULATE, "micro_batch_size": MICRO_BATCH}
    fleet.init(is_collective=True, strategy=strategy)
    paddle.seed(0)
    model = fleet.distributed_model(pipeline_model(VOCAB, HIDDEN, SEQ, blocks=PP * VPP, pp=PP, vpp=VPP))
    optimizer = fleet.distributed_optimizer(paddle.optimizer.AdamW(3e-3, parameters=model.parameters()))
    rank = dist.get_rank()
    say = (lambda text: print(f"[demo] {text}", flush=True)) if rank == 0 else (lambda text: None)
    say(f"{type(model).__name__}: pp={PP} vpp={VPP} accumulate_steps={ACCUMULATE} "
        f"micro_batch_size={MICRO_BATCH}, tied embedding, gloo on CPU")
    for step in range(args.steps):
        if step == args.steps - 1:
            trace.tracer().clear()  # the chrome trace below: the last step's communication
        ids, labels = pattern_batch(step, ACCUMULATE * MICRO_BATCH, SEQ, VOCAB)
        loss = model.train_batch([ids, labels], optimizer)
        say(f"step {step}: loss {float(loss):.4f} ({model.last_step.seconds * 1e3:.0f} ms)")

    model.export_chrome_trace(os.path.join(args.out, f"trace_rank{rank}.json"))
    gathered: list = []
    dist.all_gather_object(gathered, model.last_step.spans, group=model.pp_group)
    if rank != 0:
        return
    schedule = model.schedule()
    measured = measured_result(schedule, gathered)
    unit = simulate(schedule)
    predicted = simulate(schedule, measured_costs(schedule, gathered))
    say(f"bubble: simulated {float(unit.bubble_overall):.1%} (unit costs F=1 B=2), "
        f"{float(predicted.bubble_overall):.1%} (measured costs); measured {float(measured.bubble_overall):.1%}")
    path = render.plot_timeline(measured, os.path.join(args.out, "timeline.png"),
                                title=f"measured: pp={PP} vpp={VPP} M={ACCUMULATE}, last step")
    say(f"timeline of the measured step: {path}")
    chrome = trace.merge_chrome_traces([os.path.join(args.out, f"trace_rank{r}.json") for r in range(PP)],
                                       os.path.join(args.out, "trace.json"))
    say(f"its compute and communication, every rank, for chrome://tracing or Perfetto: {chrome}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if "PADDLE_TRAINER_ID" in os.environ:  # a rank started by paddle.distributed.launch
        train(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
