"""dp gradient reduction overlapped with the backward on GPUs: the prepared device check
(not run in CI; written without a device to run it on, so expect to fix small things
the first time).

- one GPU: `StreamWorker` (comm/collectives.py) with a stand-in collective: a
  bandwidth-bound kernel submitted on the worker's own communication stream right
  after a compute kernel wrote its buffer, then more compute. The result must show
  that the communication stream waited for the compute that produced its input,
  and that the compute stream waited for it before reading the result; the times
  show how much of the stand-in was hidden behind the later compute, with
  CUDA_DEVICE_MAX_CONNECTIONS=1, for timing-free events (the default, #57574) and
  for default (timing) events.
- two or more GPUs: the reducer on NCCL, dp = 2: an MLP's gradients in buckets,
  micro-batch backwards, the bucket all-reduces launched inside the last backward
  (overlap on) or after it (off); step times, the isolated all-reduce time C and the
  hidden fraction (off - on) / C, for timing-free and default events, each in a job
  of its own with CUDA_DEVICE_MAX_CONNECTIONS=1; gradients on == off bitwise.
- four or more GPUs: bench/grad_overlap_cpu.py --gpus (pp2 x dp2, the engine).

The whole module is skipped unless Paddle is a CUDA build that sees a device.
    python -m pytest -q -s tests/gpu/test_grad_overlap_gpu.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def _gpu_count() -> tuple[int, str]:
    try:
        import paddle
    except ImportError as err:
        return 0, f"paddle is not importable ({err})"
    if not paddle.is_compiled_with_cuda():
        return 0, f"Paddle {paddle.__version__} is not a CUDA build"
    try:
        count = paddle.device.cuda.device_count()
    except Exception as err:  # a GPU build on a machine without a driver
        return 0, f"no GPU device ({err})"
    return count, "no GPU device"


if __name__ != "__main__":
    GPUS, _REASON = _gpu_count()
    if GPUS < 1:
        pytest.skip(f"GPU check of the dp/sharding gradient overlap: {_REASON}", allow_module_level=True)
    pytestmark = pytest.mark.gpu


def _env(timing: bool) -> dict:
    return {**os.environ, "CUDA_DEVICE_MAX_CONNECTIONS": "1", "GRAD_OVERLAP_TIMING_EVENTS": "1" if timing else "0"}


# --- one GPU: the stream worker ------------------------------------------------------------

def stream_check() -> dict:
    """Runs in a fresh process (CUDA_DEVICE_MAX_CONNECTIONS must be set before CUDA starts)."""
    import paddle

    from paddle_ext.comm.collectives import StreamWorker, device_event

    timing = os.environ.get("GRAD_OVERLAP_TIMING_EVENTS") == "1"
    paddle.set_device("gpu:0")
    a = paddle.randn([4096, 4096])
    buffer = paddle.zeros([64 << 20])  # 256 MiB: the stand-in collective is bandwidth bound
    worker = StreamWorker("dp", lambda: device_event(timing))

    def compute(n):
        x = a
        for _ in range(n):
            x = paddle.matmul(x, a) * 1e-3
        return x

    def stand_in():  # on the communication stream (StreamWorker's stream_guard)
        for _ in range(8):
            buffer.scale_(1.0001)

    def step(overlap: bool) -> float:
        paddle.device.cuda.synchronize()
        start = time.perf_counter()
        compute(4)
        buffer.fill_(1.0)  # the "gradient" is complete only after this, on the compute stream
        if overlap:
            worker.submit("bucket", stand_in)
            compute(12)
            worker.wait_all()
        else:
            compute(12)
            stand_in()
        total = float(buffer[:4].sum())  # reads the result on the compute stream
        paddle.device.cuda.synchronize()
        assert abs(total - 4 * 1.0001 ** 8) < 1e-3, total  # ordered: fill, then 8 scales
        worker.reset()
        return time.perf_counter() - start

    for _ in range(2):
        step(True), step(False)
    on = statistics.median(step(True) for _ in range(5))
    off = statistics.median(step(False) for _ in range(5))
    paddle.device.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        stand_in()
    paddle.device.cuda.synchronize()
    comm = (time.perf_counter() - start) / 5
    return {"timing_events": timing, "on": on, "off": off, "comm": comm}


def _run_self(mode: str, timing: bool, launch_gpus: int = 0) -> dict:
    out = tempfile.mkstemp(suffix=".json")[1]
    env = {**_env(timing), "GRAD_OVERLAP_OUT": out}
    me = os.path.abspath(__file__)
    if launch_gpus:
        cmd = [sys.executable, "-m", "paddle.distributed.launch", "--devices",
               ",".join(str(i) for i in range(launch_gpus)), "--log_dir", tempfile.mkdtemp(), me, mode]
    else:
        cmd = [sys.executable, me, mode]
    subprocess.run(cmd, env=env, check=True, cwd=ROOT, timeout=900)
    with open(out) as f:
        return json.load(f)


def test_stream_worker_orders_and_overlaps_on_one_gpu():
    for timing in (False, True):
        r = _run_self("stream", timing)
        hidden = (r["off"] - r["on"]) / r["comm"]
        print(f"\nstream worker, CUDA_DEVICE_MAX_CONNECTIONS=1, {'timing' if timing else 'timing-free'} events: "
              f"step off {r['off'] * 1e3:.2f} ms, on {r['on'] * 1e3:.2f} ms, stand-in collective "
              f"{r['comm'] * 1e3:.2f} ms: {hidden:.0%} hidden")


# --- two GPUs: the reducer on NCCL ----------------------------------------------------------

def nccl_check() -> None:
    """One rank of a dp = 2 job (paddle.distributed.launch --devices 0,1)."""
    import numpy as np
    import paddle
    import paddle.distributed as dist
    import paddle.distributed.fleet as fleet

    from paddle_ext.pipeline.grad_sync import GradReducer, GradSyncSettings
    from paddle_ext.pipeline.schedule.ir import B, GradSync

    timing = os.environ.get("GRAD_OVERLAP_TIMING_EVENTS") == "1"
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 2, "mp_degree": 1, "pp_degree": 1}
    fleet.init(is_collective=True, strategy=strategy)
    hcg = fleet.get_hybrid_communicate_group()
    m, width, depth = 4, 4096, 8

    class Layers(paddle.nn.Layer):  # what the reducer needs from a PipelineLayer
        def __init__(self):
            super().__init__()
            paddle.seed(0)
            self.net = paddle.nn.Sequential(*[paddle.nn.Linear(width, width) for _ in range(depth)])
            self.shared_layers = {}

        def get_num_virtual_stages(self):
            return 1

    runs = {}
    for overlap in (False, True):
        layers = Layers()
        reducer = GradReducer(layers, hcg, m, delay_scale_loss=False,
                              settings=GradSyncSettings(dp_overlap=overlap, bucket_mb=64, timing_events=timing))
        actions = [B(0, i) for i in range(m)] + [GradSync(0)]
        rng = np.random.default_rng(dist.get_rank())
        xs = [paddle.to_tensor(rng.standard_normal((64, width)).astype("float32")) for _ in range(m)]
        times = []
        for step in range(8):
            paddle.device.cuda.synchronize()
            start = time.perf_counter()
            reducer.begin_step(None, actions)
            for x in xs:
                (layers.net(x).square().mean() / m).backward()
            reducer.on_grad_sync(0)
            reducer.finish()
            paddle.device.cuda.synchronize()
            times.append(time.perf_counter() - start)
            if step < 7:
                layers.clear_gradients()
        runs[overlap] = (statistics.median(times[2:]), [p.grad.numpy() for p in layers.parameters()], reducer)
    for a, b in zip(runs[False][1], runs[True][1]):
        assert np.array_equal(a, b), "overlap on != off"
    buckets = runs[True][2].buckets
    comm = []
    for _ in range(5):
        dist.barrier()
        paddle.device.cuda.synchronize()
        start = time.perf_counter()
        for b in buckets:
            dist.all_reduce(b.buffer)
        paddle.device.cuda.synchronize()
        comm.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        with open(os.environ["GRAD_OVERLAP_OUT"], "w") as f:
            json.dump({"timing_events": timing, "off": runs[False][0], "on": runs[True][0],
                       "comm": statistics.median(comm), "bytes": sum(b.nbytes for b in buckets)}, f)


@pytest.mark.skipif("GPUS < 2", reason="NCCL needs two GPUs")
def test_bucket_allreduce_hidden_fraction_on_nccl_dp2():
    for timing in (False, True):
        r = _run_self("nccl", timing, launch_gpus=2)
        print(f"\nNCCL dp=2, CUDA_DEVICE_MAX_CONNECTIONS=1, {'timing' if timing else 'timing-free'} events, "
              f"{r['bytes'] / 2**20:.0f} MiB of gradients: step off {r['off'] * 1e3:.1f} ms, on {r['on'] * 1e3:.1f} "
              f"ms, all-reduces alone {r['comm'] * 1e3:.1f} ms: {(r['off'] - r['on']) / r['comm']:.0%} hidden")


@pytest.mark.skipif("GPUS < 4", reason="pp2 x dp2 needs four GPUs")
def test_pipeline_pp2_dp2_bench_on_nccl():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "grad_overlap_cpu.py"), "--gpus", "4"],
                         env=_env(False), check=True, capture_output=True, text=True, timeout=1200)
    print("\n" + out.stdout)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "stream":
        with open(os.environ["GRAD_OVERLAP_OUT"], "w") as f:
            json.dump(stream_check(), f)
    elif mode == "nccl":
        nccl_check()
    else:
        raise SystemExit(f"unknown mode {mode!r}: stream or nccl")
