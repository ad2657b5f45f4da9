"""RMSNorm on CPU: paddle_ext's fused kernel (paddle_ext.ops.fused_rms_norm_ext,
what Paddle's fused_rms_norm_ext runs on CPU with the plugin enabled) against
Paddle's unfused composition x * rsqrt(mean(x^2) + eps) * w, both measured in
this run at the same thread count (paddle_ext.ops.set_num_threads and
paddle.base.core.set_num_threads).

For each thread count it prints the forward and the forward+backward (x and w
gradients, from paddle.grad with a fixed output gradient) times: medians of
calls interleaved with the reference's, so a load change on this shared machine
hits both alike, each timed call after an untimed one of the same
implementation; the ratio is reference time / paddle_ext time (> 1: paddle_ext
faster). With more than one thread KMP_BLOCKTIME=0 is set before Paddle loads
(see bench/flash_attn_cpu.py's quiet_openmp: spinning OpenMP workers otherwise
take the second core). The machine's load average is printed beside the figures.

Run: python bench/rms_norm_cpu.py [--shape 4096,4096] [--threads 1,2] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def make_cases(shape: list[int], eps: float):
    import paddle

    import paddle_ext.ops as ops

    rng = np.random.default_rng(0)
    x = paddle.to_tensor(rng.standard_normal(shape).astype(np.float32), stop_gradient=False)
    w = paddle.to_tensor((rng.random(shape[-1]) + 0.5).astype(np.float32), stop_gradient=False)
    dout = paddle.to_tensor(rng.standard_normal(shape).astype(np.float32))

    def fused():
        return ops.fused_rms_norm_ext(x, w, eps)[0]

    def unfused():
        return x * paddle.rsqrt((x * x).mean(axis=-1, keepdim=True) + eps) * w

    def with_backward(fn):
        return lambda: paddle.grad([fn()], [x, w], [dout])

    def forward_only(fn):
        def run():
            with paddle.no_grad():
                return fn()
        return run

    return {"forward": (forward_only(fused), forward_only(unfused)),
            "forward+backward": (with_backward(fused), with_backward(unfused))}


def timed(fn) -> float:
    fn()  # untimed: this VM's idle second core wakes slowly
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="4096,4096")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--epsilon", type=float, default=1e-6)
    args = parser.parse_args(argv)
    shape = [int(s) for s in args.shape.split(",")]
    thread_counts = [int(t) for t in args.threads.split(",")]
    if max(thread_counts) > 1 and "KMP_BLOCKTIME" not in os.environ:
        os.environ["KMP_BLOCKTIME"] = "0"  # before Paddle loads MKL's OpenMP runtime
    sys.path.insert(0, os.path.dirname(HERE))
    import paddle

    import paddle_ext.ops as ops

    cases = make_cases(shape, args.epsilon)
    print(f"RMSNorm {shape} float32, eps={args.epsilon}; reference: Paddle {paddle.__version__} "
          "x * rsqrt(mean(x^2) + eps) * w; ratio = reference time / paddle_ext time")
    print(f"KMP_BLOCKTIME={os.environ.get('KMP_BLOCKTIME', 'unset')}, thread pool {ops.thread_pool()}, "
          f"load average at start {load_average()}")
    print(f"{'threads':>7}  {'pass':<17} {'paddle_ext ms':>13} {'unfused ms':>11} {'ratio':>6}")
    for n in thread_counts:
        ops.set_num_threads(n)
        paddle.base.core.set_num_threads(n)
        for name, (fused, unfused) in cases.items():
            ext_times, ref_times = [], []
            for _ in range(args.repeats):
                ext_times.append(timed(fused))
                ref_times.append(timed(unfused))
            ext, ref = statistics.median(ext_times), statistics.median(ref_times)
            print(f"{n:>7}  {name:<17} {ext * 1e3:>13.2f} {ref * 1e3:>11.2f} {ref / ext:>6.2f}")
    print(f"load average at end {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
