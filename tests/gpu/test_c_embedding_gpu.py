"""paddle_ext.ops.c_embedding on a GPU against a numpy float64 reference.

Values are chosen so that every sum is exact in float32 (and the results exact
in float16 / bfloat16), so results must be equal, not close. The GPU backward
sums duplicates in position order, like the CPU kernel, so on random values the
two devices must agree bit for bit as well.

The whole module is skipped unless Paddle is a CUDA or ROCm build that sees a
device; it is collected without error on a CPU-only Paddle or without Paddle.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu._device import gpu_skip_reason

_SKIP_REASON = gpu_skip_reason()
if _SKIP_REASON is not None:
    pytest.skip(f"GPU tests of c_embedding: {_SKIP_REASON}", allow_module_level=True)

pytestmark = pytest.mark.gpu

ID_DTYPES = ["int32", "int64"]


def _gpu():
    import paddle

    return paddle.CUDAPlace(0)


def _tensor(array, dtype=None, place=None, stop_gradient=True):
    import paddle

    t = paddle.to_tensor(array, place=place if place is not None else _gpu(), stop_gradient=stop_gradient)
    return t.astype(dtype) if dtype is not None else t


def _numpy(t) -> np.ndarray:
    return t.astype("float32").numpy() if str(t.dtype).endswith(("float16", "bfloat16")) else t.numpy()


def _reference_forward(weight: np.ndarray, ids: np.ndarray, start: int) -> np.ndarray:
    rows, width = weight.shape
    local = ids.astype(np.int64) - start
    hit = (local >= 0) & (local < rows)
    out = np.zeros(ids.shape + (width,), np.float64)
    out[hit] = weight.astype(np.float64)[local[hit]]
    return out


def _reference_backward(rows: int, ids: np.ndarray, out_grad: np.ndarray, start: int) -> np.ndarray:
    width = out_grad.shape[-1]
    local = ids.reshape(-1).astype(np.int64) - start
    grads = out_grad.reshape(-1, width).astype(np.float64)
    hit = (local >= 0) & (local < rows)
    table_grad = np.zeros((rows, width), np.float64)
    np.add.at(table_grad, local[hit], grads[hit])
    return table_grad


def _run(weight_np, ids_np, start, vocab, out_grad_np, dtype="float32", place=None):
    """Forward and backward of c_embedding; returns (out, weight grad) as float32 numpy."""
    from paddle_ext.ops import c_embedding

    weight = _tensor(weight_np, dtype, place)
    weight.stop_gradient = False
    ids = _tensor(ids_np, place=place)
    out = c_embedding(weight, ids, start_index=start, vocab_size=vocab)
    out.backward(_tensor(out_grad_np, dtype, place))
    return _numpy(out), _numpy(weight.grad)


def _exact_case(rng, rows, width, start, vocab, ids_shape, id_dtype, low=-4, high=4):
    """Integer-valued weight and grads: every float32 sum below is exact."""
    weight = rng.integers(low, high + 1, (rows, width)).astype(np.float32) / 8
    ids = rng.integers(0, vocab, ids_shape).astype(id_dtype)
    ids.flat[:: max(1, ids.size // 16)] = start  # a hot id: many duplicates of row 0
    out_grad = rng.integers(low, high + 1, ids_shape + (width,)).astype(np.float32) / 8
    return weight, ids, out_grad


@pytest.mark.parametrize("id_dtype", ID_DTYPES)
@pytest.mark.parametrize("width", [1, 3, 8, 129])
def test_float32_matches_reference_exactly(id_dtype, width):
    rng = np.random.default_rng(width)
    rows, start, vocab = 37, 11, 64
    weight, ids, out_grad = _exact_case(rng, rows, width, start, vocab, (4, 33), id_dtype)
    out, grad = _run(weight, ids, start, vocab, out_grad)
    assert out.dtype == np.float32 and out.shape == (4, 33, width)
    np.testing.assert_array_equal(out, _reference_forward(weight, ids, start).astype(np.float32))
    np.testing.assert_array_equal(grad, _reference_backward(rows, ids, out_grad, start).astype(np.float32))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("id_dtype", ID_DTYPES)
def test_half_types_accumulate_exactly(dtype, id_dtype):
    # Integers in [-2, 2] over 64 ids: every sum is an integer of magnitude
    # <= 128, exact in float32 and representable in float16 and bfloat16.
    rng = np.random.default_rng(7)
    rows, width, start, vocab = 20, 16, 3, 30
    weight = rng.integers(-2, 3, (rows, width)).astype(np.float32)
    ids = rng.integers(0, vocab, (64,)).astype(id_dtype)
    ids[::4] = start + 1
    out_grad = rng.integers(-2, 3, (64, width)).astype(np.float32)
    out, grad = _run(weight, ids, start, vocab, out_grad, dtype=dtype)
    np.testing.assert_array_equal(out, _reference_forward(weight, ids, start).astype(np.float32))
    np.testing.assert_array_equal(grad, _reference_backward(rows, ids, out_grad, start).astype(np.float32))


def test_many_rows_and_ids():
    # 70000 rows need three 8-bit radix passes; 6161 ids span four sort tiles.
    rng = np.random.default_rng(3)
    rows, width, start, vocab = 70000, 4, 5000, 80000
    weight, ids, out_grad = _exact_case(rng, rows, width, start, vocab, (6161,), "int64")
    out, grad = _run(weight, ids, start, vocab, out_grad)
    np.testing.assert_array_equal(out, _reference_forward(weight, ids, start).astype(np.float32))
    np.testing.assert_array_equal(grad, _reference_backward(rows, ids, out_grad, start).astype(np.float32))


def test_gpu_equals_cpu_bit_for_bit_and_is_deterministic():
    import paddle

    rng = np.random.default_rng(11)
    rows, width, start, vocab = 50, 24, 10, 100
    weight = rng.standard_normal((rows, width)).astype(np.float32)
    ids = rng.integers(0, vocab, (3, 500)).astype(np.int64)
    ids[:, ::3] = start + 7
    out_grad = rng.standard_normal((3, 500, width)).astype(np.float32)
    gpu_first = _run(weight, ids, start, vocab, out_grad)
    gpu_second = _run(weight, ids, start, vocab, out_grad)
    cpu = _run(weight, ids, start, vocab, out_grad, place=paddle.CPUPlace())
    for a, b, c in zip(gpu_first, gpu_second, cpu):
        assert a.tobytes() == b.tobytes()
        assert a.tobytes() == c.tobytes()


@pytest.mark.parametrize("id_dtype", ID_DTYPES)
@pytest.mark.parametrize("bad", [-1, 64, 1000])
def test_out_of_range_id_raises_index_error_naming_the_first(id_dtype, bad):
    from paddle_ext.ops import c_embedding

    ids = np.arange(16, dtype=id_dtype).reshape(2, 8)
    ids[1, 1] = 64  # a later bad id: the error must name the first one
    ids[0, 5] = bad
    weight = _tensor(np.ones((8, 4), np.float32))
    with pytest.raises(IndexError, match=rf"ids\[0, 5\] = {bad} is out of range"):
        c_embedding(weight, _tensor(ids), start_index=0, vocab_size=64)


def test_negative_vocab_size_checks_only_the_lower_bound():
    # vocab_size=-1 lifts the upper bound: ids outside the slice give zeros; a negative id
    # still raises, as in Paddle's GPU kernel (`id >= 0 && (vocab_size < 0 || id < vocab_size)`).
    from paddle_ext.ops import c_embedding

    weight = np.arange(12, dtype=np.float32).reshape(3, 4)
    ids = np.array([0, 2, 3, 4, 99], np.int64)
    out, grad = _run(weight, ids, 2, -1, np.ones((5, 4), np.float32))
    np.testing.assert_array_equal(out, _reference_forward(weight, ids, 2).astype(np.float32))
    np.testing.assert_array_equal(grad, _reference_backward(3, ids, np.ones((5, 4)), 2).astype(np.float32))
    with pytest.raises(IndexError, match=r"ids\[2\] = -5 is out of range: ids must lie in \[0, inf\)"):
        c_embedding(_tensor(weight), _tensor(np.array([0, 2, -5, -1], np.int64)), start_index=2, vocab_size=-1)
