"""Rank script: fleet's ParallelCrossEntropy (c_softmax_with_cross_entropy) with the
model-parallel group spanning every rank, on gloo with paddle_ext enabled.

mode "parity-<dtype>": loss, softmax and the logits' gradient against numpy in float64
(the GPU kernel's semantics: loss 0 and gradient 0 where the label is ignore_index,
which may name a class), for 3-D and 2-D logits and int32 / int64 labels; the logits
are left as they were.
mode "empty": no rows at all.
mode "bad-label": the last rank holds a label outside [0, classes); every rank must
raise a ValueError (that rank naming it) and the group must stay usable.
mode "bad-rows": the last rank holds more rows than the others: a ValueError on every rank.
mode "bad-dtype": bfloat16 logits, which Paddle's GPU kernel does not register: a
RuntimeError on every rank.
Usage: parallel_cross_entropy.py MODE[,MODE...]: the modes in turn, in one launch.
"""

import sys

import numpy as np
import paddle
import paddle.distributed.fleet as fleet
from paddle.distributed.fleet.layers.mpu import mp_ops

import paddle_ext
from paddle_ext import compat

WIDTH = 5  # classes per rank
TOLERANCE = {"float64": 1e-12, "float32": 2e-6, "float16": 2e-3}


def reference(full: np.ndarray, labels: np.ndarray, ignore_index: int, upstream: np.ndarray):
    """(loss, softmax, gradient of sum(loss * upstream)) of the full logits, in float64."""
    x = full.astype("float64").reshape(-1, full.shape[-1])
    lab = labels.reshape(-1)
    shifted = x - x.max(axis=1, keepdims=True)
    total = np.exp(shifted).sum(axis=1, keepdims=True)
    softmax = np.exp(shifted) / total
    rows = np.arange(len(lab))
    ignored = lab == ignore_index
    picked = shifted[rows, np.where(ignored, 0, lab)]
    loss = np.where(ignored, 0.0, np.log(total[:, 0]) - picked)
    onehot = np.zeros_like(x)
    onehot[rows[~ignored], lab[~ignored]] = 1.0
    grad = (softmax - onehot) * upstream.reshape(-1, 1).astype("float64")
    grad[ignored] = 0.0
    return loss.reshape(labels.shape), softmax.reshape(full.shape), grad.reshape(full.shape)


def check(name: str, got, want: np.ndarray, dtype: str) -> None:
    got = got.astype("float32").numpy() if got.dtype == paddle.float16 else got.numpy()
    np.testing.assert_allclose(got.astype("float64"), want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype],
                               err_msg=name)


def parity_case(rank: int, nranks: int, dtype: str, shape: list, label_dtype: str, ignore_index: int) -> None:
    rng = np.random.default_rng(len(shape) * 10 + (label_dtype == "int32"))
    classes = WIDTH * nranks
    full = (rng.standard_normal([*shape, classes]) * 3).astype(dtype)
    full[..., 0, :] += 40.0  # large logits: the max must be taken before exp
    labels = rng.integers(0, classes, size=shape)
    flat = labels.reshape(-1)
    boundary = [0, classes - 1, WIDTH - 1, WIDTH, ignore_index, ignore_index]
    flat[:len(boundary)] = boundary
    labels = flat.reshape(shape).astype(label_dtype)
    upstream = rng.uniform(0.5, 1.5, size=[*shape, 1]).astype("float32").astype("float64")
    loss_ref, softmax_ref, grad_ref = reference(full.astype("float64"), labels, ignore_index, upstream)
    mine = slice(rank * WIDTH, (rank + 1) * WIDTH)

    logits = paddle.to_tensor(np.ascontiguousarray(full[..., mine]))
    logits.stop_gradient = False
    before = logits.numpy().copy()
    label = paddle.to_tensor(labels[..., None] if len(shape) > 1 else labels)
    loss_fn = fleet.meta_parallel.ParallelCrossEntropy(ignore_index=ignore_index)
    loss = loss_fn(logits, label)
    assert loss.dtype == logits.dtype and list(loss.shape) == [*shape, 1], (loss.dtype, loss.shape)
    check("loss", loss, loss_ref[..., None], dtype)
    # in float32: a CPU build has no float16 multiply; the cast hands the op a float16 gradient
    (loss.astype("float32") * paddle.to_tensor(upstream.astype("float32"))).sum().backward()
    check("logits gradient", logits.grad, grad_ref[..., mine], dtype)
    np.testing.assert_array_equal(logits.numpy(), before)

    group = fleet.get_hybrid_communicate_group().get_model_parallel_group()
    loss2, softmax = mp_ops._c_softmax_with_cross_entropy(logits, label, group=group, return_softmax=True,
                                                          ignore_index=ignore_index)
    assert softmax.stop_gradient and list(softmax.shape) == list(logits.shape)
    check("softmax", softmax, softmax_ref[..., mine], dtype)
    np.testing.assert_array_equal(loss2.numpy(), loss.numpy())


def parity(rank: int, nranks: int, dtype: str) -> None:
    for shape, label_dtype, ignore_index in (([2, 7], "int64", -100), ([9], "int32", -100),
                                             ([3, 4], "int64", 2)):  # ignore_index may name a class
        parity_case(rank, nranks, dtype, shape, label_dtype, ignore_index)
    print(f"rank {rank}: parallel cross entropy matches numpy ({dtype})", flush=True)


def empty(rank: int) -> None:
    logits = paddle.zeros([0, WIDTH])
    logits.stop_gradient = False
    loss = fleet.meta_parallel.ParallelCrossEntropy()(logits, paddle.zeros([0, 1], dtype="int64"))
    assert list(loss.shape) == [0, 1], loss.shape
    paddle.autograd.backward([loss], [paddle.ones_like(loss)])  # 2.6 cannot sum an empty tensor
    if compat.paddle_version()[0] >= 3:
        assert list(logits.grad.shape) == [0, WIDTH], logits.grad
    else:  # 2.6's autograd hands zero-size tensors no gradient at all
        assert logits.grad is None, logits.grad
    print(f"rank {rank}: no rows, no loss", flush=True)


def refused(rank: int, nranks: int, mode: str) -> None:
    dtype = "bfloat16" if mode == "bad-dtype" else "float32"
    rows = 4 if mode == "bad-rows" and rank == nranks - 1 else 3
    logits = paddle.zeros([2, rows, WIDTH], dtype=dtype)
    labels = np.zeros([2, rows, 1], dtype="int64")
    if mode == "bad-label" and rank == nranks - 1:
        labels[1, 2, 0] = WIDTH * nranks
    try:
        fleet.meta_parallel.ParallelCrossEntropy()(logits, paddle.to_tensor(labels))
    except (ValueError, RuntimeError) as err:
        print(f"rank {rank}: {type(err).__name__}: {err}", flush=True)
    else:
        raise AssertionError("the call was not refused")
    total = paddle.to_tensor([1.0])
    paddle.distributed.all_reduce(total)  # the group is still in step
    assert total.numpy().tolist() == [nranks]
    print(f"rank {rank}: the group goes on", flush=True)


def main(modes: str) -> None:
    nranks = paddle.distributed.get_world_size()
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": nranks, "pp_degree": 1}
    paddle_ext.enable()  # before fleet.init: its gloo groups then get stores of their own (3 ranks)
    fleet.init(is_collective=True, strategy=strategy)
    rank = paddle.distributed.get_rank()
    for mode in modes.split(","):  # in turn, in one group: a refusal must leave it usable for the next
        if mode.startswith("parity-"):
            parity(rank, nranks, mode.split("-", 1)[1])
        elif mode == "empty":
            empty(rank)
        else:
            refused(rank, nranks, mode)


if __name__ == "__main__":
    main(sys.argv[1])
