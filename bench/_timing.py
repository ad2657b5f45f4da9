"""Shared timing helpers for the benchmarks: medians of repeated runs, since
the machines here are shared and noisy; every figure is printed next to a
reference measured in the same run."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import numpy as np


def median_seconds(fn: Callable[[], object], repeats: int = 7, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def memcpy_seconds(nbytes: int, repeats: int = 7) -> float:
    """numpy copy of nbytes into a reused buffer: the bandwidth reference."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    return median_seconds(lambda: np.copyto(dst, src), repeats=repeats)


def print_cpu_math_path() -> None:
    """Every bench's first line: the code path Paddle's MKL runs on here (on AMD, AVX2 or
    generic, ~3x apart), without which a ratio to Paddle's own time reads differently from
    one host to the next. Imports paddle_ext, which picks AVX2 on AMD (paddle_ext.cpu_math)."""
    from paddle_ext import cpu_math

    print(f"cpu math: {cpu_math.describe()}", flush=True)
