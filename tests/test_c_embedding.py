"""paddle_ext.ops.c_embedding against a numpy float64 reference."""

import numpy as np
import paddle
import pytest

import paddle_ext.ops as ops


def reference_forward(table_slice, ids, start):
    rows = table_slice.shape[0]
    local = ids.astype(np.int64) - start
    inside = (local >= 0) & (local < rows)
    out = np.zeros(ids.shape + (table_slice.shape[1],), dtype=np.float64)
    out[inside] = table_slice.astype(np.float64)[local[inside]]
    return out


def reference_grad(rows, width, ids, start, out_grad):
    grad = np.zeros((rows, width), dtype=np.float64)
    local = ids.astype(np.int64).reshape(-1) - start
    inside = (local >= 0) & (local < rows)
    np.add.at(grad, local[inside], out_grad.reshape(-1, width).astype(np.float64)[inside])
    return grad


def dyadic(rng, shape, dtype="float32"):
    # Multiples of 1/8 in [-4, 4): sums of a few hundred stay exact in float32,
    # so float32 results must equal the float64 reference bit for bit.
    return (rng.integers(-32, 32, size=shape) / 8).astype(dtype)


def run(table, ids, start, vocab, out_grad):
    weight = paddle.to_tensor(table, stop_gradient=False)
    out = ops.c_embedding(weight, paddle.to_tensor(ids), start_index=start, vocab_size=vocab)
    out.backward(paddle.to_tensor(out_grad))
    return out.numpy(), weight.grad.numpy()


@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
@pytest.mark.parametrize("seed", range(4))
def test_vocab_split_across_ranks_matches_reference(id_dtype, seed):
    rng = np.random.default_rng(seed)
    vocab, width, nranks = int(rng.integers(20, 60)), int(rng.integers(1, 9)), int(rng.integers(2, 5))
    full = dyadic(rng, (vocab, width))
    ids = rng.integers(0, vocab, size=(3, 17)).astype(id_dtype)
    ids[0, :4] = ids[1, 5]  # duplicates accumulate
    bounds = np.sort(rng.choice(np.arange(1, vocab), size=nranks - 1, replace=False))
    starts = [0, *bounds.tolist()]
    ends = [*bounds.tolist(), vocab]
    out_grad = dyadic(rng, ids.shape + (width,))
    total = np.zeros(ids.shape + (width,))
    for start, end in zip(starts, ends):
        out, grad = run(full[start:end], ids, start, vocab, out_grad)
        np.testing.assert_array_equal(out, reference_forward(full[start:end], ids, start))
        np.testing.assert_array_equal(grad, reference_grad(end - start, width, ids, start, out_grad))
        total += out
    np.testing.assert_array_equal(total, full.astype(np.float64)[ids])  # the all-reduce completes it


def test_many_duplicates_accumulate_in_order():
    rng = np.random.default_rng(7)
    table = dyadic(rng, (5, 3))
    ids = np.array([2] * 300 + [4] * 7 + [9], dtype="int64")
    out_grad = dyadic(rng, (ids.size, 3))
    _, grad = run(table, ids, 0, 10, out_grad)
    np.testing.assert_array_equal(grad, reference_grad(5, 3, ids, 0, out_grad))


def test_large_width_threaded_path_matches_reference():
    rng = np.random.default_rng(3)
    table = dyadic(rng, (3000, 130))
    ids = rng.integers(0, 6000, size=(4000,)).astype("int64")
    out_grad = dyadic(rng, (4000, 130))
    for threads in (1, 2):
        ops.set_num_threads(threads)
        out, grad = run(table, ids, 1500, 6000, out_grad)
        np.testing.assert_array_equal(out, reference_forward(table, ids, 1500))
        np.testing.assert_array_equal(grad, reference_grad(3000, 130, ids, 1500, out_grad))
    assert ops.get_num_threads() == 2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_weights(dtype):
    rng = np.random.default_rng(1)
    table32 = dyadic(rng, (12, 8))
    ids = np.array([[3, 3, 14, 0], [11, 3, 5, 20]], dtype="int64")
    weight = paddle.to_tensor(table32).astype(dtype)
    weight.stop_gradient = False
    out = ops.c_embedding(weight, paddle.to_tensor(ids), start_index=2, vocab_size=21)
    assert out.dtype == weight.dtype
    np.testing.assert_array_equal(out.astype("float32").numpy(), reference_forward(table32, ids, 2))
    out_grad = dyadic(rng, (2, 4, 8))
    out.backward(paddle.to_tensor(out_grad).astype(dtype))
    np.testing.assert_array_equal(weight.grad.astype("float32").numpy(), reference_grad(12, 8, ids, 2, out_grad))


def test_without_vocab_size_ids_outside_the_slice_give_zeros():
    table = np.ones((4, 2), dtype="float32")
    ids = np.array([1, 0, 3, 7, 100], dtype="int64")  # ids must still be >= 0 (Paddle's GPU kernel)
    out = ops.c_embedding(paddle.to_tensor(table), paddle.to_tensor(ids), start_index=3)
    np.testing.assert_array_equal(out.numpy(), [[0, 0], [0, 0], [1, 1], [0, 0], [0, 0]])


@pytest.mark.parametrize("bad, where", [(10, "[1, 2]"), (-3, "[1, 2]"), (2**40, "[1, 2]")])
def test_out_of_range_id_raises_naming_value_position_and_range(bad, where):
    table = paddle.to_tensor(np.ones((5, 2), dtype="float32"))
    ids = np.array([[1, 2, 3], [4, 9, 0]], dtype="int64")
    ids[1, 2] = bad
    with pytest.raises(IndexError) as info:
        ops.c_embedding(table, paddle.to_tensor(ids), start_index=5, vocab_size=10)
    message = str(info.value)
    assert f"ids{where} = {bad}" in message
    assert "[0, vocab_size) = [0, 10)" in message


def test_rows_past_vocab_size_are_looked_up_as_paddles_gpu_kernel_does(clean_series):
    """start_index + rows > vocab_size: Paddle's kernels take it (its GPU kernel checks
    only ids in [0, vocab_size); ids in [start_index, start_index + rows) take their row)."""
    rng = np.random.default_rng(12)
    table = dyadic(rng, (5, 3))
    ids = np.array([[8, 9, 7], [0, 6, 9]], dtype="int64")
    out_grad = dyadic(rng, ids.shape + (3,))
    stock = _lookup_and_grad(table, ids, out_grad, 6, 10)  # rows hold ids 6..10, vocab_size 10
    clean_series.enable()
    ours = _lookup_and_grad(table, ids, out_grad, 6, 10)
    for got, want, ref in zip(ours, stock, (reference_forward(table, ids, 6),
                                            reference_grad(5, 3, ids, 6, out_grad))):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, ref)
    with pytest.raises(IndexError, match=r"ids\[0\] = 10 is out of range: .*\[0, 10\)"):
        ops.c_embedding(paddle.to_tensor(table), paddle.to_tensor(np.array([10, 8])), start_index=6, vocab_size=10)


@pytest.mark.parametrize("vocab_size", [-1, -7])
def test_negative_vocab_size_lifts_only_the_upper_bound(vocab_size):
    # Paddle's GPU kernel: `id >= 0 && (vocab_size < 0 || id < vocab_size)`
    table = np.ones((4, 2), dtype="float32")
    out = ops.c_embedding(paddle.to_tensor(table), paddle.to_tensor(np.array([5, 100, 3])), start_index=3,
                          vocab_size=vocab_size)
    np.testing.assert_array_equal(out.numpy(), [[1, 1], [0, 0], [1, 1]])


@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
@pytest.mark.parametrize("vocab_size", [-1, -7])
def test_negative_id_with_negative_vocab_size_raises_as_paddles_gpu_kernel(clean_series, vocab_size, id_dtype):
    """Paddle's GPU kernel (paddle/phi/kernels/gpu/c_embedding_kernel.cu, CEmbedding) enforces
    `id >= 0 && (vocab_size < 0 || id < vocab_size)`: a negative id fails whatever vocab_size;
    its CPU kernel gives zeros there (the reference is the GPU kernel's)."""
    from paddle_ext import upstream

    table = paddle.to_tensor(np.arange(10, dtype="float32").reshape(5, 2))
    ids = paddle.to_tensor(np.array([[1, 4], [-3, 2]], dtype=id_dtype))
    pattern = (rf"ids\[1, 0\] = -3 is out of range: ids must lie in \[0, inf\) "
               rf"\(vocab_size = {vocab_size} < 0 lifts only the upper bound\)")
    with pytest.raises(IndexError, match=pattern):
        ops.c_embedding(table, ids, vocab_size=vocab_size)

    def lookup():
        return upstream.mp_ops_module()._c_lookup_table(table, ids, start_index=0, vocab_size=vocab_size)

    np.testing.assert_array_equal(lookup().numpy(), [[[2, 3], [8, 9]], [[0, 0], [4, 5]]])  # stock CPU: zeros
    clean_series.enable()
    with pytest.raises(IndexError, match=pattern):
        lookup()


def test_vocab_size_zero_refuses_every_id():
    table = paddle.to_tensor(np.ones((4, 2), dtype="float32"))
    with pytest.raises(IndexError, match=r"ids\[0\] = 0 is out of range: .*\[0, 0\)"):
        ops.c_embedding(table, paddle.to_tensor(np.array([0])), vocab_size=0)
    empty = ops.c_embedding(table, paddle.to_tensor(np.zeros([0], np.int64)), vocab_size=0)
    assert list(empty.shape) == [0, 2]


def test_empty_ids_give_an_empty_lookup_with_a_zero_gradient():
    """No id: an empty output of the table's dtype, on every release (the custom-op runner of
    Paddle 2.6 and 3.0 refuses an op's empty output), and a zero gradient for the table."""
    table = paddle.to_tensor(np.ones((4, 2), dtype="float32"))
    table.stop_gradient = False
    out = ops.c_embedding(table, paddle.to_tensor(np.zeros([3, 0], np.int32)), vocab_size=4)
    assert list(out.shape) == [3, 0, 2] and out.dtype == table.dtype
    (grad,) = paddle.grad([out], [table], [paddle.ones_like(out)])
    np.testing.assert_array_equal(grad.numpy(), np.zeros((4, 2), np.float32))


def test_first_bad_id_is_reported_for_int32():
    table = paddle.to_tensor(np.ones((5, 2), dtype="float32"))
    ids = paddle.to_tensor(np.array([0, 12, 4, 11], dtype="int32"))
    with pytest.raises(IndexError, match=r"ids\[1\] = 12 "):
        ops.c_embedding(table, ids, start_index=0, vocab_size=10)


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(start_index=-1), ValueError, r"start_index must be in \[0, inf\], got -1"),
        (dict(vocab_size=1.5), TypeError, r"vocab_size must be an int, got float 1.5"),
        (dict(start_index=1.5), TypeError, r"start_index must be an int"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, error, pattern):
    table = paddle.to_tensor(np.ones((5, 2), dtype="float32"))
    ids = paddle.to_tensor(np.array([0, 1], dtype="int64"))
    with pytest.raises(error, match=pattern):
        ops.c_embedding(table, ids, **kwargs)


def test_bad_tensors_name_the_argument():
    table = paddle.to_tensor(np.ones((5, 2), dtype="float32"))
    ids = paddle.to_tensor(np.array([0, 1], dtype="int64"))
    with pytest.raises(TypeError, match="ids must have dtype in"):
        ops.c_embedding(table, ids.astype("float32"))
    with pytest.raises(ValueError, match=r"weight must be 2-D, got shape \[10\]"):
        ops.c_embedding(table.reshape([10]), ids)
    with pytest.raises(TypeError, match="weight must have dtype in"):
        ops.c_embedding(table.astype("int64"), ids)
    with pytest.raises(TypeError, match="weight must be a paddle.Tensor, got ndarray"):
        ops.c_embedding(np.ones((5, 2)), ids)


def test_inputs_are_not_modified():
    rng = np.random.default_rng(5)
    table = dyadic(rng, (6, 3))
    ids = np.array([0, 5, 5, 2], dtype="int64")
    weight, id_tensor = paddle.to_tensor(table), paddle.to_tensor(ids)
    ops.c_embedding(weight, id_tensor, start_index=0, vocab_size=6)
    np.testing.assert_array_equal(weight.numpy(), table)
    np.testing.assert_array_equal(id_tensor.numpy(), ids)


def test_set_num_threads_rejects_bad_values():
    with pytest.raises(ValueError, match="n must be an int >= 1, got 0"):
        ops.set_num_threads(0)


# ------------------------------------------- every dtype Paddle's kernels take

def _table(rng, shape, dtype):
    values = rng.standard_normal(shape) / 3  # all 53 bits in use for float64
    if dtype.startswith("complex"):
        values = values + 1j * rng.standard_normal(shape) / 7
    return values.astype(dtype)


def _lookup_and_grad(table, ids, out_grad, start, vocab):
    """Through fleet's name, mp_ops._c_lookup_table (patched or stock)."""
    from paddle_ext import upstream

    weight = paddle.to_tensor(table, stop_gradient=False)
    out = upstream.mp_ops_module()._c_lookup_table(weight, paddle.to_tensor(ids), start_index=start,
                                                 vocab_size=vocab)
    out.backward(paddle.to_tensor(out_grad))
    return out.numpy(), weight.grad.numpy()


def _sequential_reference(table, ids, out_grad, start):
    """Forward rows and Paddle's scatter-add, in the order of the ids from +0, in the table's dtype."""
    rows, width = table.shape
    local = ids.reshape(-1) - start
    out = np.zeros((local.size, width), table.dtype)
    grad = np.zeros_like(table)
    for i, row in enumerate(local):
        if 0 <= row < rows:
            out[i] = table[row]
            grad[row] += out_grad.reshape(-1, width)[i]
    return out.reshape(ids.shape + (width,)), grad


@pytest.mark.parametrize("dtype", ["float64", "complex64", "complex128", "float32"])
def test_lookup_table_equals_stock_paddle_bit_for_bit(dtype, clean_series):
    """Stock CPU c_embedding takes these dtypes; enabled, fleet's lookup gives the same bits,
    forward and table gradient (duplicates included: both sum in the ids' order from +0).

    Stock Paddle 3.3.1's CPU grad kernel zeroes only numel * 4 bytes of the table gradient
    (`w.numel() * sizeof(w_grad->dtype())`, the size of the DataType enum, not of the
    element): for 8- and 16-byte dtypes the rest of its result is whatever the allocator
    held. So its gradient is compared where it zeroed it, the ids hitting rows there, and
    the plugin's (zeros elsewhere, as Paddle's GPU kernel gives) against the reference.
    """
    rng = np.random.default_rng(11)
    table = _table(rng, (12, 6), dtype)
    ids = np.array([[3, 3, 17, 5], [5, 4, 3, 14]], dtype="int64")  # rows 0, 0, -, 2 / 2, 1, 0, 11
    out_grad = _table(rng, ids.shape + (6,), dtype)
    out_grad[1, 1, :2] = -0.0  # row 1's only gradient: Paddle's sum from +0 gives +0, not -0
    try:
        stock = _lookup_and_grad(table, ids, out_grad, 3, 20)
    except RuntimeError as err:  # 2.6.2's CPU kernel has no complex dtypes (its GPU kernel has)
        assert "is not registered" in str(err) and dtype.startswith("complex"), err
        stock = None
    clean_series.enable()
    ours = _lookup_and_grad(table, ids, out_grad, 3, 20)
    assert not np.signbit(ours[1][1, :2].real).any()
    assert ours[0].dtype == ours[1].dtype == np.dtype(dtype)
    if stock is not None:
        zeroed = table.size * 4  # bytes of the gradient stock Paddle zeroes
        assert ours[0].tobytes() == stock[0].tobytes()
        assert ours[1].tobytes()[:zeroed] == stock[1].tobytes()[:zeroed]
    want_out, want_grad = _sequential_reference(table, ids, out_grad, 3)
    assert ours[0].tobytes() == want_out.tobytes()
    assert ours[1].tobytes() == want_grad.tobytes()


def test_float16_lookup_equals_stock_paddle(clean_series):
    """Forward only: stock Paddle's float16 CPU grad kernel memsets numel * 4 bytes of a
    numel * 2-byte buffer (see above), past its end, so it is not run here."""
    rng = np.random.default_rng(12)
    table = _table(rng, (9, 6), "float16")
    ids = paddle.to_tensor(np.array([[3, 3, 17, 5], [5, 9, 3, 11]], dtype="int64"))
    lookup = lambda: fleet_lookup()(paddle.to_tensor(table), ids, start_index=3, vocab_size=20)  # noqa: E731
    stock = lookup().numpy()
    clean_series.enable()
    ours = lookup().numpy()
    assert ours.dtype == np.float16 and ours.tobytes() == stock.tobytes()


def fleet_lookup():
    from paddle_ext import upstream

    return upstream.mp_ops_module()._c_lookup_table


@pytest.mark.parametrize("dtype", ["float64", "complex64", "complex128", "bfloat16", "float16"])
def test_out_of_range_id_raises_for_every_dtype(dtype):
    weight = paddle.zeros([5, 2], dtype=dtype)
    ids = paddle.to_tensor(np.array([[1, 2], [10, 0]], dtype="int64"))
    with pytest.raises(IndexError, match=r"ids\[1, 0\] = 10 is out of range.*\[0, 10\)"):
        ops.c_embedding(weight, ids, start_index=0, vocab_size=10)


@pytest.mark.parametrize("dtype", ["float64", "complex128"])
def test_wide_dtypes_threaded_path_matches_reference(dtype):
    rng = np.random.default_rng(4)
    table = _table(rng, (1500, 9), dtype)
    ids = rng.integers(0, 3000, size=(5000,)).astype("int64")
    out_grad = _table(rng, (5000, 9), dtype)
    weight = paddle.to_tensor(table, stop_gradient=False)
    out = ops.c_embedding(weight, paddle.to_tensor(ids), start_index=1000, vocab_size=3000)
    out.backward(paddle.to_tensor(out_grad))
    local = ids - 1000
    inside = (local >= 0) & (local < 1500)
    want = np.zeros((5000, 9), dtype)
    want[inside] = table[local[inside]]
    np.testing.assert_array_equal(out.numpy(), want)
    grad = np.zeros((1500, 9), dtype)
    for i in np.nonzero(inside)[0]:  # sequential, in the order of the ids
        grad[local[i]] += out_grad[i]
    np.testing.assert_array_equal(weight.grad.numpy(), grad)


@pytest.mark.parametrize("shape", [(0, 4), (5, 0), (0, 0)])
@pytest.mark.parametrize("ids", [[0, 1], []])
def test_a_table_without_rows_or_columns_is_refused_as_paddle_refuses_it(shape, ids, clean_series):
    """Paddle's shape inference (CEmbeddingInferMeta, paddle/phi/infermeta/binary.cc) enforces
    height > 0 && width > 0 with InvalidArgument (ValueError), on every device."""
    from paddle_ext import upstream
    from paddle_ext.ops._checks import InvalidArgumentError

    weight = paddle.zeros(list(shape))
    id_tensor = paddle.to_tensor(np.array(ids, dtype="int64"))
    pattern = rf"weight must have rows >= 1 and columns >= 1 .*got shape \[{shape[0]}, {shape[1]}\]"
    with pytest.raises(InvalidArgumentError, match=pattern):
        ops.c_embedding(weight, id_tensor, vocab_size=10)
    lookup = lambda: upstream.mp_ops_module()._c_lookup_table(weight, id_tensor, start_index=0)  # noqa: E731
    with pytest.raises(ValueError, match=r"height:\d+ width:\d+ start_index:0"):
        lookup()  # stock Paddle
    clean_series.enable()
    with pytest.raises(ValueError, match=pattern) as ours:
        lookup()
    assert isinstance(ours.value, InvalidArgumentError)


def test_runner_probe_for_empty_outputs_matches_the_release():
    """_library.runner_returns_empty_outputs: Paddle 3.3's custom-op runner returns a zero-size
    output, 2.6's and 3.0's refuse it (measured on 2.6.2, 3.0.0 and 3.3.1)."""
    from paddle_ext import compat
    from paddle_ext.ops import _library

    version = compat.paddle_version()[:2]
    if version in ((2, 6), (3, 0)):
        assert _library.runner_returns_empty_outputs() is False
    elif version >= (3, 3):
        assert _library.runner_returns_empty_outputs() is True
