"""Rank script: fleet's VocabParallelEmbedding with mp_degree=2 and paddle_ext enabled.

mode "parity": every rank checks that the vocab-parallel lookup equals a
full-table embedding and that its weight grad equals its slice of the full grad;
"parity-float64" the same with a float64 table (stock CPU c_embedding takes it).
mode "bad-id": rank 1 looks up an id >= vocab_size; the checked op must raise.
mode "tp-inputs": fleet.distributed_model's TensorParallel wrapper (no pipeline) gives every
rank the first rank's inputs, nested ones and another shape included, as it does on GPUs.
Usage: vocab_parallel_embedding.py MODE[,MODE...]: the modes in turn, in one launch.
"""

import sys

import numpy as np
import paddle
import paddle.distributed.fleet as fleet

import paddle_ext

VOCAB, WIDTH = 10, 4


class Seen(paddle.nn.Layer):
    """Returns what its forward received."""

    def forward(self, x, extra=None):
        return x, extra


def tensor_parallel_inputs(rank: int) -> None:
    model = fleet.distributed_model(Seen())
    assert type(model).__name__ == "TensorParallel", type(model)
    first = {"x": np.arange(6, dtype="float32").reshape(2, 3), "y": np.array([7, 8], dtype="int64")}
    if rank == 0:
        x, y = first["x"], first["y"]
    else:  # another shape and other values: replaced by rank 0's
        x, y = np.full([4, 3], -1, dtype="float32"), np.array([0], dtype="int64")
    extra = {"y": [paddle.to_tensor(y)], "scale": 2.0}
    seen_x, seen_extra = model(paddle.to_tensor(x), extra=extra)
    np.testing.assert_array_equal(seen_x.numpy(), first["x"])
    np.testing.assert_array_equal(seen_extra["y"][0].numpy(), first["y"])
    assert seen_extra["scale"] == 2.0
    print(f"rank {rank}: tensor-parallel inputs are rank 0's", flush=True)


def main(mode: str) -> None:
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 2, "pp_degree": 1}
    # before fleet.init, as README says: stock 2.6.2's gloo groups rendezvous through the job
    # store with unprefixed keys, and a rank could read an earlier group's address (measured
    # here with the plugin enabled after fleet.init: "connect ...: Connection refused" in the
    # model group's creation, once in about 60 launches under load; a hang there once in CI)
    paddle_ext.enable()
    fleet.init(is_collective=True, strategy=strategy)
    rank = paddle.distributed.get_rank()
    for one in mode.split(","):
        if one == "tp-inputs":
            tensor_parallel_inputs(rank)
        else:
            lookup(rank, one)


def lookup(rank: int, mode: str) -> None:
    dtype = "float64" if mode == "parity-float64" else "float32"
    paddle.set_default_dtype(dtype)

    full = np.random.default_rng(0).integers(-8, 8, size=(VOCAB, WIDTH)).astype(dtype) / 4
    emb = fleet.meta_parallel.VocabParallelEmbedding(VOCAB, WIDTH)
    assert emb.weight.dtype == getattr(paddle, dtype), emb.weight.dtype
    rows = VOCAB // 2
    emb.weight.set_value(full[rank * rows:(rank + 1) * rows])

    ids = np.array([[0, 9, 5, 4, 4], [7, 1, 9, 2, 5]], dtype="int64")
    if mode == "bad-id" and rank == 1:
        ids[1, 3] = VOCAB + 3
    out = emb(paddle.to_tensor(ids))
    np.testing.assert_array_equal(out.numpy(), full[ids])

    upstream = np.arange(ids.size * WIDTH, dtype=dtype).reshape(*ids.shape, WIDTH) / 8
    (out * paddle.to_tensor(upstream)).sum().backward()
    full_grad = np.zeros_like(full, dtype="float64")
    np.add.at(full_grad, ids, upstream.astype("float64"))
    np.testing.assert_array_equal(emb.weight.grad.numpy(), full_grad[rank * rows:(rank + 1) * rows])
    paddle.set_default_dtype("float32")
    print(f"rank {rank}: vocab-parallel embedding matches the full table ({dtype})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
