"""c_embedding on CPU: paddle_ext's checked op against Paddle's own kernel.

8192 ids into a 50000 x 4096 float32 table slice, half of the ids inside the
slice. Prints, at 1 and 2 threads, forward and backward time ratios to Paddle's
_C_ops.c_embedding and its grad (>1 = paddle_ext faster), the range check's
cost, and the bytes moved per second as a fraction of a memcpy measured here.

Run: python bench/c_embedding.py [--rows 50000] [--width 4096] [--ids 8192]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import paddle
from paddle import _C_ops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import median_seconds, memcpy_seconds, print_cpu_math_path  # noqa: E402

import paddle_ext.ops as ops  # noqa: E402


def main() -> None:
    print_cpu_math_path()
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=50000)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--ids", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rows, width, n = args.rows, args.width, args.ids
    vocab, start = 2 * rows, rows  # this rank holds the upper half: half the ids are ours
    rng = np.random.default_rng(0)
    table = paddle.to_tensor(rng.standard_normal((rows, width), dtype=np.float32), stop_gradient=False)
    ids = paddle.to_tensor(rng.integers(0, vocab, size=n).astype("int64"))
    out_grad = paddle.to_tensor(rng.standard_normal((n, width), dtype=np.float32))
    in_range = int(((ids.numpy() >= start) & (ids.numpy() < start + rows)).sum())
    row_bytes = width * 4
    fwd_bytes = n * row_bytes + in_range * row_bytes            # write out, read our rows
    bwd_bytes = rows * row_bytes + 2 * in_range * row_bytes     # write the grad, read + write rows

    with paddle.no_grad():
        ref_out = _C_ops.c_embedding(table, ids, start, vocab)
        np.testing.assert_array_equal(ops.c_embedding(table, ids, start, vocab).numpy(), ref_out.numpy())
    paddle_fwd = median_seconds(lambda: _C_ops.c_embedding(table, ids, start, vocab), args.repeats)

    def paddle_grad():
        out = _C_ops.c_embedding(table, ids, start, vocab)
        return paddle.grad([out], [table], [out_grad])

    def ext_grad():
        out = ops.c_embedding(table, ids, start, vocab)
        return paddle.grad([out], [table], [out_grad])

    (g_ref,), (g_ext,) = paddle_grad(), ext_grad()
    np.testing.assert_allclose(g_ext.numpy(), g_ref.numpy(), rtol=1e-6, atol=1e-6)
    del g_ref, g_ext
    paddle_bwd = median_seconds(paddle_grad, args.repeats) - paddle_fwd

    memcpy_fwd = memcpy_seconds(fwd_bytes)
    memcpy_bwd = memcpy_seconds(bwd_bytes, repeats=3)
    small = paddle.to_tensor(np.ones((rows, 1), dtype=np.float32))
    print(f"c_embedding: {n} ids, table slice {rows} x {width} float32, {in_range} ids in range")
    print(f"reference Paddle _C_ops.c_embedding: forward {paddle_fwd * 1e3:.1f} ms, "
          f"backward {paddle_bwd * 1e3:.1f} ms; memcpy {fwd_bytes / memcpy_fwd / 1e9:.1f} GB/s")
    for threads in (1, 2):
        ops.set_num_threads(threads)
        with paddle.no_grad():
            fwd = median_seconds(lambda: ops.c_embedding(table, ids, start, vocab), args.repeats)
            checked = median_seconds(lambda: ops.c_embedding(small, ids, start, vocab), 21)
            unchecked = median_seconds(lambda: ops.c_embedding(small, ids, start, -1), 21)
        bwd = median_seconds(ext_grad, args.repeats) - fwd
        print(f"threads={threads}: forward {fwd * 1e3:.1f} ms = {paddle_fwd / fwd:.2f}x faster than Paddle "
              f"({fwd_bytes / fwd / 1e9:.1f} GB/s = {memcpy_fwd / fwd:.2f} of memcpy); "
              f"backward {bwd * 1e3:.1f} ms = {paddle_bwd / bwd:.2f}x faster than Paddle "
              f"({bwd_bytes / bwd / 1e9:.1f} GB/s = {memcpy_bwd / bwd:.2f} of memcpy); "
              f"range check {max(checked - unchecked, 0.0) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
