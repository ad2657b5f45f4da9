"""Where the CPU kernels' threads come from: the OpenMP runtime Paddle loaded
(shared with its MKL calls) or the library's own std::threads, with the same
results bit for bit either way."""

import numpy as np
import paddle
import pytest

import paddle_ext.ops as ops
from paddle_ext.ops.flash_attention import flash_attention

POOL_ENV = "PADDLE_EXT_THREAD_POOL"


def loaded_openmp_runtimes():
    with open("/proc/self/maps") as maps:
        names = {line.rsplit("/", 1)[-1].strip() for line in maps}
    return [n for n in ("libiomp5.so", "libgomp.so.1") if n in names]


@pytest.fixture()
def two_threads():
    before = ops.get_num_threads()
    ops.set_num_threads(2)
    yield
    ops.set_num_threads(before)


def test_the_pool_is_the_loaded_openmp_runtime_unless_told_otherwise(monkeypatch):
    ops.set_num_threads(ops.get_num_threads())  # loads the op library
    runtimes = loaded_openmp_runtimes()
    assert ops.thread_pool() == (f"openmp ({runtimes[0]})" if runtimes else "std::thread")
    monkeypatch.setenv(POOL_ENV, "std")
    assert ops.thread_pool() == "std::thread"


def run_kernels():
    """Flash attention forward and backward (both work-sharing loops), rotary
    and c_embedding, at sizes that give every worker work."""
    rng = np.random.default_rng(7)
    make = lambda *shape: paddle.to_tensor(rng.standard_normal(shape).astype(np.float32),  # noqa: E731
                                           stop_gradient=False)
    q, k, v = make(2, 200, 4, 64), make(2, 200, 2, 64), make(2, 200, 2, 64)
    out, _ = flash_attention(q, k, v, causal=True)
    grads = paddle.grad([out], [q, k, v], [paddle.to_tensor(rng.standard_normal(out.shape).astype(np.float32))])
    x = paddle.to_tensor(rng.standard_normal((2, 300, 4, 64)).astype(np.float32))
    rotated = ops.fused_rotary_position_embedding(x, rotary_emb_base=10000.0)[0]
    table = paddle.to_tensor(rng.standard_normal((500, 256)).astype(np.float32))
    ids = paddle.to_tensor(rng.integers(0, 500, (4000,)).astype(np.int64))
    embedded = ops.c_embedding(table, ids, start_index=0, vocab_size=500)
    return [t.numpy() for t in (out, *grads, rotated, embedded)]


def test_openmp_and_std_threads_give_identical_results(monkeypatch, two_threads):
    if not loaded_openmp_runtimes():
        pytest.skip("no OpenMP runtime loaded in this process: both runs would use std::thread")
    assert ops.thread_pool().startswith("openmp")
    on_openmp = run_kernels()
    monkeypatch.setenv(POOL_ENV, "std")
    on_std = run_kernels()
    for a, b in zip(on_openmp, on_std):
        np.testing.assert_array_equal(a, b)
