"""Fused rotary position embedding on CPU: paddle_ext's one-pass kernel against
Paddle's unfused composition (what a model falls back to on CPU, where Paddle's
fused_rotary_position_embedding has no kernel).

q and k of [1, 4096, 32, 128] float32 and sin/cos tables [1, 4096, 1, 128] by
default. For each rotation style it prints the forward and forward+backward
times of both (medians; >1 = paddle_ext faster) and paddle_ext's achieved
bandwidth in steady state (repeated calls, fresh outputs from Paddle's
allocator each time, as in training) against a memcpy measured in the same
run:
  - "of memcpy": bytes the op reads and writes per second over bytes a memcpy
    copies per second (the convention of bench/c_embedding.py and of issue 7's
    50% target);
  - "of equal-traffic memcpy": the same with the memcpy's reads counted too,
    i.e. a memcpy that moves as much data as the op (half the figure above).
forward+backward runs through paddle.grad with given output grads, which
Paddle deep-copies single-threaded before any grad kernel runs; that copy is
measured alone and the ratio is also printed without it.

Run: python bench/rotary_cpu.py [--seq 4096] [--heads 32] [--kv-heads 32]
     [--head-dim 128] [--styles neox,half] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import paddle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import median_seconds, print_cpu_math_path  # noqa: E402

import paddle_ext.ops as ops  # noqa: E402


def unfused(q, k, sin, cos, neox):
    """Paddle elementwise ops: x * cos + rot(x) * sin."""
    def rot(x):
        if neox:  # adjacent pairs (x0, x1) -> (-x1, x0)
            return paddle.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
        half = x.shape[-1] // 2  # rotate_half
        return paddle.concat([-x[..., half:], x[..., :half]], axis=-1)

    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def fused(q, k, sin, cos, neox):
    out_q, out_k, _ = ops.fused_rotary_position_embedding(q, k, sin=sin, cos=cos, use_neox_rotary_style=neox)
    return out_q, out_k


def bench_style(neox, q, k, grad_q, grad_k, angles, args, threads_list, fwd_bytes, memcpy, seed_copy):
    s, d = angles.shape[0], 2 * angles.shape[1]
    if neox:  # adjacent pairs share an angle
        cos_np, sin_np = np.cos(np.repeat(angles, 2, axis=1)), np.sin(np.repeat(angles, 2, axis=1))
    else:  # the two halves share an angle
        cos_np, sin_np = np.cos(np.tile(angles, 2)), np.sin(np.tile(angles, 2))
    cos = paddle.to_tensor(cos_np.astype(np.float32).reshape(1, s, 1, d))
    sin = paddle.to_tensor(sin_np.astype(np.float32).reshape(1, s, 1, d))

    def run_fwd(fn):
        with paddle.no_grad():
            return fn(q, k, sin, cos, neox)

    def run_fwd_bwd(fn):
        outs = fn(q, k, sin, cos, neox)
        return paddle.grad(list(outs), [q, k], [grad_q, grad_k])

    # Same results (the unfused version rounds every step in float32).
    for a, r in zip(run_fwd(fused), run_fwd(unfused)):
        np.testing.assert_allclose(a.numpy(), r.numpy(), rtol=1e-5, atol=1e-5)
    for a, r in zip(run_fwd_bwd(fused), run_fwd_bwd(unfused)):
        np.testing.assert_allclose(a.numpy(), r.numpy(), rtol=1e-5, atol=1e-5)

    ref_fwd = median_seconds(lambda: run_fwd(unfused), args.reference_repeats, warmup=1)
    ref_both = median_seconds(lambda: run_fwd_bwd(unfused), args.reference_repeats, warmup=1)
    label = "use_neox_rotary_style=True (adjacent pairs)" if neox else "use_neox_rotary_style=False (halves)"
    print(f"{label}: Paddle unfused forward {ref_fwd * 1e3:.0f} ms, forward+backward {ref_both * 1e3:.0f} ms")
    for threads in threads_list:
        ops.set_num_threads(threads)
        fwd, copy_ratio = interleaved(lambda: run_fwd(fused), memcpy, args.repeats)
        both = median_seconds(lambda: run_fwd_bwd(fused), args.repeats)
        net = max(both - seed_copy, 1e-9)
        print(f"  paddle_ext threads={threads}: forward {fwd * 1e3:.1f} ms = {ref_fwd / fwd:.0f}x faster, "
              f"forward+backward {both * 1e3:.1f} ms = {ref_both / both:.0f}x faster "
              f"(without the seed-grad copy {net * 1e3:.1f} ms = {(ref_both - seed_copy) / net:.0f}x); "
              f"forward {fwd_bytes / fwd / 1e9:.1f} GB/s = {copy_ratio:.2f} of memcpy "
              f"({copy_ratio / 2:.2f} of equal-traffic memcpy)")


def interleaved(fn, copy, repeats):
    """Median time of fn, and the median over rounds of copy time / fn time,
    timing the two alternately so that a busy machine slows both alike."""
    fn()
    copy()
    times, ratios = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        t_fn = time.perf_counter() - start
        start = time.perf_counter()
        copy()
        t_copy = time.perf_counter() - start
        times.append(t_fn)
        ratios.append(t_copy / t_fn)
    return statistics.median(times), statistics.median(ratios)


def main() -> None:
    print_cpu_math_path()
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--styles", default="neox,half")
    parser.add_argument("--threads", default="", help="comma list; default: paddle_ext's default only")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--reference-repeats", type=int, default=3)
    args = parser.parse_args()
    b, s, h, hk, d = args.batch, args.seq, args.heads, args.kv_heads, args.head_dim

    rng = np.random.default_rng(0)
    q = paddle.to_tensor(rng.standard_normal((b, s, h, d), dtype=np.float32), stop_gradient=False)
    k = paddle.to_tensor(rng.standard_normal((b, s, hk, d), dtype=np.float32), stop_gradient=False)
    angles = np.arange(s)[:, None] * (1.0 / 10000 ** (np.arange(0, d, 2) / d))[None, :]
    grad_q = paddle.to_tensor(rng.standard_normal((b, s, h, d), dtype=np.float32))
    grad_k = paddle.to_tensor(rng.standard_normal((b, s, hk, d), dtype=np.float32))

    elements = b * s * (h + hk) * d
    table_bytes = 2 * s * d * 4
    fwd_bytes = 2 * elements * 4 + table_bytes  # read q, k and the tables; write out_q, out_k
    copy_src = np.ones(fwd_bytes // 4, dtype=np.float32)
    copy_dst = np.empty_like(copy_src)

    def memcpy():  # numpy copy into a reused buffer, as bench/_timing.memcpy_seconds
        np.copyto(copy_dst, copy_src)

    memcpy_time = median_seconds(memcpy, args.repeats)
    threads_list = [int(t) for t in args.threads.split(",") if t] or [ops.get_num_threads()]
    print(f"rotary: q [{b}, {s}, {h}, {d}], k [{b}, {s}, {hk}, {d}] float32, sin/cos [1, {s}, 1, {d}]; "
          f"{fwd_bytes / 1e6:.0f} MB read+written per forward (as much per backward)")
    print(f"memcpy reference: {fwd_bytes / 1e6:.0f} MB in {memcpy_time * 1e3:.1f} ms = "
          f"{fwd_bytes / memcpy_time / 1e9:.1f} GB/s copied (timed again next to each forward below)")

    # paddle.grad deep-copies the grads it is given (egr::GradTensorHolder::
    # CopyValueFromTensor), single-threaded into fresh memory: a cost of the
    # harness that both sides below pay, shown so the ratios can be read.
    seed_copy = median_seconds(lambda: (paddle.assign(grad_q), paddle.assign(grad_k)), args.repeats)
    print(f"of every forward+backward below, Paddle's copy of the seed grads (paddle.assign of "
          f"grad_q and grad_k) takes about {seed_copy * 1e3:.0f} ms")
    for style in [x for x in args.styles.split(",") if x]:
        bench_style(style == "neox", q, k, grad_q, grad_k, angles, args, threads_list, fwd_bytes, memcpy,
                    seed_copy)
    ops.set_num_threads(threads_list[0])
    with paddle.no_grad():
        computed = median_seconds(lambda: ops.fused_rotary_position_embedding(q, k), args.repeats)
    print(f"paddle_ext without sin/cos (angles from rotary_emb_base, cached): forward {computed * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
