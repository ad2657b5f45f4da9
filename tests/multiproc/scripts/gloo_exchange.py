"""Rank script: reduce_scatter and all_to_all on gloo (paddle_ext.comm.gloo_exchange),
through Paddle's public APIs, against numpy, on a group of every rank (3 in the test:
more than two, where gloo's per-rank point-to-point tags would not line up).

mode "values": every form against numpy; prints "rank R: CASE ok" per case.
mode "refusals": arguments one rank or every rank gets wrong; every rank must raise a
ValueError naming the problem (none waits for another), and the group must still
compute right afterwards; prints "rank R: REFUSAL ok" per case.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
import paddle
import paddle.distributed as dist

import paddle_ext
from paddle_ext import compat
from paddle_ext.comm import gloo


def data(rank: int, rows: int, width: int = 3, dtype: str = "float32") -> np.ndarray:
    """Rank-distinct values, exact in every dtype used (small integers)."""
    return (np.arange(rows * width).reshape(rows, width) % 7 + 10 * rank).astype(dtype)


def check(name: str, got, want) -> None:
    np.testing.assert_array_equal(np.asarray(got, dtype="float64"), np.asarray(want, dtype="float64"),
                                  err_msg=name)
    print(f"rank {dist.get_rank()}: {name} ok", flush=True)


def values(size: int, rank: int) -> None:
    # reduce_scatter, tensor form: [size * 2, 3] in, [2, 3] out
    for dtype in ("float32", "int64", "bfloat16"):
        full = [data(r, size * 2, dtype="float32") for r in range(size)]
        out = paddle.empty([2, 3], dtype=dtype)
        dist.stream.reduce_scatter(out, paddle.to_tensor(full[rank]).astype(dtype))
        check(f"reduce_scatter tensor {dtype}", out.astype("float32").numpy(), sum(full)[rank * 2:rank * 2 + 2])
    full = [data(r, size * 2) for r in range(size)]
    out = paddle.empty([2, 3])
    dist.stream.reduce_scatter(out, paddle.to_tensor(full[rank]), op=dist.ReduceOp.MAX, use_calc_stream=True)
    check("reduce_scatter tensor max calc_stream", out.numpy(), np.max(full, axis=0)[rank * 2:rank * 2 + 2])
    out = paddle.empty([2, 3])
    task = dist.stream.reduce_scatter(out, paddle.to_tensor(full[rank]), sync_op=False)
    task.wait()
    check("reduce_scatter tensor async", out.numpy(), sum(full)[rank * 2:rank * 2 + 2])
    # an input that wants gradients: the output records none, as Paddle's collectives
    x = paddle.to_tensor(full[rank], stop_gradient=False)
    out = paddle.empty([2, 3])
    dist.stream.reduce_scatter(out, x)
    assert out.stop_gradient, "reduce_scatter's output records a gradient"
    check("reduce_scatter records no gradient", out.numpy(), sum(full)[rank * 2:rank * 2 + 2])
    # list form (paddle.distributed.reduce_scatter): tensor_list[i] is rank i's share
    parts = [[data(r + i, 2, width=4) for i in range(size)] for r in range(size)]
    out = paddle.empty([2, 4])
    dist.reduce_scatter(out, [paddle.to_tensor(p) for p in parts[rank]])
    check("reduce_scatter list", out.numpy(), sum(parts[r][rank] for r in range(size)))
    # fleet's sequence-parallel reduce-scatter (ReduceScatterOp's forward), [s, b, h] -> [s / size, b, h]
    x = np.stack([data(rank + j, size * 2, width=4) for j in range(2)], axis=1)  # [size * 2, 2, 4]
    xs = [np.stack([data(r + j, size * 2, width=4) for j in range(2)], axis=1) for r in range(size)]
    out = paddle.empty([2, 2, 4])
    dist.stream.reduce_scatter(out, paddle.to_tensor(x), op=dist.ReduceOp.SUM, sync_op=True)
    check("reduce_scatter 3-d", out.numpy(), sum(xs)[rank * 2:rank * 2 + 2])

    # all_to_all, list form: tensor i to rank i (an empty out list gets in's likes)
    outs: list = []
    # keywords: 2.6.2's public all-to-all functions take in before out, 3.x's out before in
    dist.alltoall(in_tensor_list=[paddle.to_tensor(data(rank * size + d, 2)) for d in range(size)],
                  out_tensor_list=outs)
    for src in range(size):
        check(f"alltoall list from {src}", outs[src].numpy(), data(src * size + rank, 2))

    # given outs may differ in shape per pair, as long as each holds what its sender sends
    def piece(src: int, dst: int) -> np.ndarray:
        return data(src * size + dst, 1 + dst, width=2 + src)

    outs = [paddle.empty([1 + rank, 2 + src]) for src in range(size)]
    dist.stream.alltoall(outs, [paddle.to_tensor(piece(rank, d)) for d in range(size)], use_calc_stream=True)
    check("alltoall list calc_stream", np.concatenate([o.numpy().ravel() for o in outs]),
          np.concatenate([piece(s, rank).ravel() for s in range(size)]))
    # alltoall_single: even, then uneven splits (rank r sends r + d + 1 rows to d)
    ins = [data(r, size * 2) for r in range(size)]
    out = paddle.empty([size * 2, 3])
    dist.alltoall_single(out_tensor=out, in_tensor=paddle.to_tensor(ins[rank]))
    check("alltoall_single even", out.numpy(), np.concatenate([ins[s][rank * 2:rank * 2 + 2] for s in range(size)]))

    def sends(src: int) -> list[int]:
        return [src + d + 1 for d in range(size)]

    ins = [data(r, sum(sends(r))) for r in range(size)]
    want = [ins[s][sum(sends(s)[:rank]):sum(sends(s)[:rank + 1])] for s in range(size)]
    out = paddle.empty([sum(sends(s)[rank] for s in range(size)), 3])
    dist.alltoall_single(out_tensor=out, in_tensor=paddle.to_tensor(ins[rank]), in_split_sizes=sends(rank),
                         out_split_sizes=[sends(s)[rank] for s in range(size)])
    check("alltoall_single uneven", out.numpy(), np.concatenate(want))
    # zero rows to send or receive between some pairs (MoE: an expert no token chose)
    counts = [[0 if (s + d) % 2 else 2 for d in range(size)] for s in range(size)]
    ins = [data(r, sum(counts[r])) for r in range(size)]
    want = [ins[s][sum(counts[s][:rank]):sum(counts[s][:rank + 1])] for s in range(size)]
    out = paddle.empty([sum(counts[s][rank] for s in range(size)), 3])
    dist.alltoall_single(out_tensor=out, in_tensor=paddle.to_tensor(ins[rank]), in_split_sizes=counts[rank],
                         out_split_sizes=[counts[s][rank] for s in range(size)])
    check("alltoall_single empty pairs", out.numpy(), np.concatenate(want))
    if compat.paddle_version() >= (3, 0, 0):
        # the tensor form (2.6.2's Python wrapper passes in_tensor where its pybind takes out)
        ins = [data(r, size) for r in range(size)]
        out = paddle.empty([size, 3])
        dist.stream.alltoall(out, paddle.to_tensor(ins[rank]))
        check("alltoall tensor", out.numpy(), np.stack([ins[s][rank] for s in range(size)]))


def expect_refusal(name: str, call, *phrases: str) -> None:
    try:
        call()
    except ValueError as err:
        message = str(err)
        missing = [p for p in phrases if p not in message]
        assert not missing, f"{name}: {missing} not in {message!r}"
        print(f"rank {dist.get_rank()}: {name} ok", flush=True)
        return
    raise AssertionError(f"{name}: no ValueError")


def refusals(size: int, rank: int) -> None:
    # one rank's in_tensor has the wrong shape: it names the shape, the others name it
    rows = size * 2 + (1 if rank == 1 else 0)
    phrase = "in_tensor's shape" if rank == 1 else "rank(s) [1] of the group refused"
    expect_refusal("reduce_scatter bad shape on rank 1",
                   lambda: dist.stream.reduce_scatter(paddle.empty([2, 3]), paddle.zeros([rows, 3])), phrase)
    # split sizes that do not add up on rank 0
    sizes = [1] * size if rank else [2] * size
    phrase = "in_split_sizes" if rank == 0 else "rank(s) [0] of the group refused"
    expect_refusal("alltoall_single sizes not summing",
                   lambda: dist.alltoall_single(out_tensor=paddle.empty([size, 3]), in_tensor=paddle.zeros([size, 3]),
                                                in_split_sizes=sizes, out_split_sizes=[1] * size), phrase)
    # sizes every rank finds fine alone, but that disagree between ranks
    ins = [2] + [1] * (size - 2) + [0]  # every rank sends 2 rows to rank 0 ...
    outs = [1] * (size - 1) + [1]       # ... which expects 1 from each
    expect_refusal("alltoall_single sizes disagreeing",
                   lambda: dist.alltoall_single(out_tensor=paddle.empty([sum(outs), 3]),
                                                in_tensor=paddle.zeros([sum(ins), 3]),
                                                in_split_sizes=ins, out_split_sizes=outs),
                   "sends 2 rows to rank 0, which expects 1")
    # the group is still in step: an all_reduce and a reduce-scatter give the right values
    t = paddle.to_tensor([float(rank + 1)])
    dist.all_reduce(t)
    full = [data(r, size * 2) for r in range(size)]
    out = paddle.empty([2, 3])
    dist.stream.reduce_scatter(out, paddle.to_tensor(full[rank]))
    assert float(t.numpy()[0]) == size * (size + 1) / 2, t.numpy()
    check("group still in step", out.numpy(), sum(full)[rank * 2:rank * 2 + 2])


def enable_after_groups(size: int, rank: int) -> None:
    """enable() names the gloo groups Paddle made alone (before the plugin was
    enabled) and stays quiet about the groups it made itself."""
    group = dist.new_group(list(range(size)))
    t = paddle.to_tensor([1.0])
    dist.all_reduce(t, group=group)
    assert float(t.numpy()[0]) == size, t.numpy()

    def reenable() -> list[str]:
        paddle_ext.disable()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            paddle_ext.enable()
        ours = [w for w in seen if "enabled after gloo process groups" in str(w.message)]
        assert all(w.filename == __file__ for w in ours), [w.filename for w in ours]
        return [str(w.message) for w in ours]

    assert reenable() == [], "warned about a group the plugin made"
    store = gloo._GROUP_STORES.pop(group.id)  # as if Paddle had made the group alone
    try:
        said = reenable()
    finally:
        gloo._GROUP_STORES[group.id] = store
    assert len(said) == 1 and f"groups [{group.id}]" in said[0] and "before fleet.init" in said[0], said
    print(f"rank {rank}: enable after groups warns ok", flush=True)


def main(mode: str) -> None:
    paddle_ext.enable()
    dist.init_parallel_env()
    size, rank = dist.get_world_size(), dist.get_rank()
    {"values": values, "refusals": refusals}[mode](size, rank)
    if mode == "values":
        enable_after_groups(size, rank)


if __name__ == "__main__":
    main(sys.argv[1])
