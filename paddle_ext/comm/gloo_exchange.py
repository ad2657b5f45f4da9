"""reduce_scatter and all_to_all for ProcessGroupGloo, which Paddle leaves
unimplemented ("ProcessGroupGLOO does not support reduce_scatter / all_to_all").

Sequence parallelism (fleet's sequence_parallel_utils: a reduce-scatter after every
row-parallel linear; PaddleFormers' `sequence_parallel=True`) and expert parallelism
(MoE token dispatch: all_to_all) call them, so neither could run on CPU. Each is built
here from collectives gloo has, all_reduce and all_gather_into_tensor, which every rank
of the group issues in the same order, so the group's sequence stays aligned (gloo
matches point-to-point messages by a per-rank tag counter: a pairwise exchange among
more than two ranks would not line up). They move more bytes than native ones (the
whole input is all-reduced; every rank receives every rank's input): CPU runs are for
correctness, not bandwidth.

The methods keep the pybind signatures of Paddle's ProcessGroup (out before in, then the
ReduceOp or the split sizes, then sync_op) and return the task of their last collective,
complete on return (gloo's synchronous ops), so `.wait()` works whatever sync_op said.
Arguments that cannot fit raise a ValueError naming the argument, its value and what
fits, on every rank of the group together: each call first agrees on whether any rank
refused its arguments (one small all_reduce), and all_to_all checks every rank's split
sizes against its peers', so no rank is left waiting for one that raised.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any, Callable


def _paddle() -> Any:
    import paddle

    return paddle


def _communication(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Runs fn with autograd off: a collective writes its output without recording a
    gradient, as Paddle's own do (an input that wants gradients leaves out_tensor alone)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with _paddle().no_grad():
            return fn(*args, **kwargs)

    return run


def agree_on_arguments(group: Any, name: str, problem: str | None, error: type[Exception] = ValueError,
                       share: int = 0) -> list[int]:
    """Raises `error` on every rank when any rank of the group (a ProcessGroup) found a
    problem in its arguments: its own message there, the other ranks naming it. One small
    all_reduce, so a refusal never leaves the other ranks waiting in the next collective.
    It also carries one integer per rank (`share`, e.g. a row count): returns every rank's,
    in rank order, the same list on every rank."""
    paddle = _paddle()
    from paddle.base import core

    size, rank = group.size(), group.rank()
    flags = paddle.zeros([2 * size], dtype="int64")
    flags[size + rank] = int(share)
    if problem is not None:
        flags[rank] = 1
    group.all_reduce(flags, core.ReduceOp.SUM, True)
    if problem is not None:
        raise error(f"{name}: {problem}")
    values = [int(v) for v in flags.numpy()]
    refused = [r for r in range(size) if values[r]]
    if refused:
        raise error(f"{name}: rank(s) {refused} of the group refused their arguments (their errors say why); "
                    f"this rank's were fine")
    return values[size:]


def _write(out: Any, value: Any) -> None:
    """out's data := value's (as many elements, out's dtype), out staying the same tensor."""
    _paddle().assign(value.reshape(out.shape), output=out)


# ---- reduce-scatter ----------------------------------------------------------------

def _reduced_rows(group: Any, tensor: Any, rows: int, op: Any) -> tuple[Any, Any]:
    """(this rank's block of `rows` rows of the group's reduction of tensor, the task)."""
    reduced = tensor.clone()
    task = group.all_reduce(reduced, op, True)
    rank = group.rank()
    return reduced[rank * rows:(rank + 1) * rows], task


@_communication
def reduce_scatter_tensor(self: Any, out: Any, tensor: Any, op: Any, sync_op: bool = True) -> Any:
    """out = this rank's block of dim 0 of the group's reduction of `tensor`, whose shape
    is [group size * out's rows, *out's other dims]."""
    size = self.size()
    rows = out.shape[0] if len(out.shape) else 1
    want = [rows * size, *out.shape[1:]]
    problem = None
    if tensor.dtype != out.dtype:
        problem = f"in_tensor's dtype {tensor.dtype} differs from out_tensor's {out.dtype}"
    elif list(tensor.shape) != want:
        problem = (f"in_tensor's shape {list(tensor.shape)} must be [group size {size} x out_tensor's {rows} "
                   f"rows, *out_tensor's other dims] = {want}")
    agree_on_arguments(self, "reduce_scatter", problem)
    block, task = _reduced_rows(self, tensor, rows, op)
    _write(out, block)
    return task


@_communication
def reduce_scatter(self: Any, out: Any, tensors: Any, op: Any, sync_op: bool = True) -> Any:
    """out = the group's reduction of tensors[this rank] (the list has one tensor per rank)."""
    size = self.size()
    problem = None
    if len(tensors) != size:
        problem = f"tensor_list has {len(tensors)} tensors; the group has {size} ranks, one tensor each"
    else:
        for i, t in enumerate(tensors):
            if list(t.shape) != list(out.shape) or t.dtype != out.dtype:
                problem = (f"tensor_list[{i}] is {t.dtype} {list(t.shape)}, out_tensor {out.dtype} "
                           f"{list(out.shape)}: every tensor of the list must be out_tensor's like")
                break
    agree_on_arguments(self, "reduce_scatter", problem)
    flat = _paddle().concat([t.reshape([-1]) for t in tensors])
    block, task = _reduced_rows(self, flat, int(out.size), op)
    _write(out, block)
    return task


def reduce_scatter_tensor_on_calc_stream(self: Any, out: Any, tensor: Any, op: Any) -> Any:
    return reduce_scatter_tensor(self, out, tensor, op)


def reduce_scatter_on_calc_stream(self: Any, out: Any, tensors: Any, op: Any) -> Any:
    return reduce_scatter(self, out, tensors, op)


# ---- all-to-all --------------------------------------------------------------------

def _split(given: list[int], rows: int, size: int, argument: str, tensor: str) -> tuple[list[int], str | None]:
    """(the split sizes, a problem or None): `given`, or an even split of `rows` where empty."""
    if not given:
        if rows % size:
            return [], (f"{tensor}'s {rows} rows (dim 0) do not split evenly over the group's {size} ranks; "
                        f"give {argument}")
        return [rows // size] * size, None
    sizes = [int(s) for s in given]
    if len(sizes) != size:
        return sizes, f"{argument} = {sizes} has {len(sizes)} entries; the group has {size} ranks, one entry each"
    if any(s < 0 for s in sizes) or sum(sizes) != rows:
        return sizes, f"{argument} = {sizes} must be >= 0 and sum to {tensor}'s {rows} rows (dim 0)"
    return sizes, None


def _exchange(group: Any, name: str, out: Any, tensor: Any, out_sizes: list[int], in_sizes: list[int]) -> Any:
    """out's rows := the rows every rank sends this rank (rank order); tensor's rows go
    out in blocks of in_sizes, one per rank. Returns the task of the last collective."""
    paddle = _paddle()
    size, me = group.size(), group.rank()
    in_rows = tensor.shape[0] if len(tensor.shape) else 0
    out_rows = out.shape[0] if len(out.shape) else 0
    in_sizes, in_problem = _split(in_sizes, in_rows, size, "in_split_sizes", "in_tensor")
    out_sizes, out_problem = _split(out_sizes, out_rows, size, "out_split_sizes", "out_tensor")
    problem = in_problem or out_problem
    if tensor.dtype != out.dtype:
        problem = f"in_tensor's dtype {tensor.dtype} differs from out_tensor's {out.dtype}"
    elif list(tensor.shape[1:]) != list(out.shape[1:]):
        problem = f"in_tensor's shape {list(tensor.shape)} and out_tensor's {list(out.shape)} differ past dim 0"
    agree_on_arguments(group, name, problem)

    # every rank's sizes, row layout and dtype, so that a disagreement raises everywhere
    layout = zlib.crc32(f"{tensor.dtype} {list(tensor.shape[1:])}".encode())
    meta = paddle.to_tensor([*in_sizes, *out_sizes, layout], dtype="int64")
    metas = paddle.empty([size * (2 * size + 1)], dtype="int64")
    task = group.all_gather_into_tensor(metas, meta, True)
    table = metas.numpy().reshape(size, 2 * size + 1)
    sends, receives, layouts = table[:, :size], table[:, size:2 * size], table[:, -1]
    for src in range(size):
        if layouts[src] != layouts[me]:
            raise ValueError(f"{name}: rank {src}'s tensors differ from this rank's ({tensor.dtype}, rows of "
                             f"{list(tensor.shape[1:])}) in dtype or row shape")
        for dst in range(size):
            if sends[src, dst] != receives[dst, src]:
                raise ValueError(f"{name}: rank {src} sends {sends[src, dst]} rows to rank {dst}, which expects "
                                 f"{receives[dst, src]} (its out_split_sizes[{src}])")

    longest = int(sends.sum(axis=1).max())
    if longest == 0:
        return task
    row_shape = list(tensor.shape[1:])
    padded = tensor
    if in_rows < longest:
        padded = paddle.concat([tensor, paddle.zeros([longest - in_rows, *row_shape], dtype=tensor.dtype)])
    gathered = paddle.empty([size * longest, *row_shape], dtype=tensor.dtype)
    task = group.all_gather_into_tensor(gathered, padded, True)
    blocks = []
    for src in range(size):
        start = src * longest + int(sends[src, :me].sum())
        blocks.append(gathered[start:start + int(sends[src, me])])
    if out_rows:
        _write(out, paddle.concat(blocks))
    return task


@_communication
def all_to_all_single(self: Any, out: Any, tensor: Any, out_sizes: list[int], in_sizes: list[int],
                      sync_op: bool = True) -> Any:
    """Rows of dim 0 in blocks: in_sizes[i] rows to rank i, out_sizes[i] rows from rank i
    (empty lists: even splits)."""
    return _exchange(self, "all_to_all_single", out, tensor, out_sizes, in_sizes)


@_communication
def all_to_all_tensor(self: Any, out: Any, tensor: Any, sync_op: bool = True) -> Any:
    """Dim 0 split evenly: block i to rank i, out's block i from rank i."""
    return _exchange(self, "all_to_all", out, tensor, [], [])


@_communication
def all_to_all(self: Any, outs: Any, tensors: Any, sync_op: bool = True) -> Any:
    """tensors[i] to rank i; outs[i] from rank i (shapes per pair may differ, as long as
    what rank i sends this rank has outs[i]'s element count)."""
    paddle = _paddle()
    size = self.size()
    problem = None
    if len(tensors) != size or len(outs) != size:
        problem = (f"in_tensor_list has {len(tensors)} tensors and out_tensor_list {len(outs)}; the group has "
                   f"{size} ranks, one tensor each")
    elif len({str(t.dtype) for t in [*tensors, *outs]}) > 1:
        problem = f"the tensors' dtypes differ: {[str(t.dtype) for t in [*tensors, *outs]]}"
    agree_on_arguments(self, "all_to_all", problem)
    flat_in = paddle.concat([t.reshape([-1]) for t in tensors])
    flat_out = paddle.empty([sum(int(o.size) for o in outs)], dtype=outs[0].dtype)
    task = _exchange(self, "all_to_all", flat_out, flat_in, [int(o.size) for o in outs],
                     [int(t.size) for t in tensors])
    start = 0
    for o in outs:
        _write(o, flat_out[start:start + int(o.size)])
        start += int(o.size)
    return task


def all_to_all_single_on_calc_stream(self: Any, out: Any, tensor: Any, out_sizes: list[int],
                                     in_sizes: list[int]) -> Any:
    return all_to_all_single(self, out, tensor, out_sizes, in_sizes)


def all_to_all_tensor_on_calc_stream(self: Any, out: Any, tensor: Any) -> Any:
    return all_to_all_tensor(self, out, tensor)


def all_to_all_on_calc_stream(self: Any, outs: Any, tensors: Any) -> Any:
    return all_to_all(self, outs, tensors)


EXCHANGE_METHODS: dict[str, Callable[..., Any]] = {
    "reduce_scatter_tensor": reduce_scatter_tensor,
    "reduce_scatter": reduce_scatter,
    "reduce_scatter_tensor_on_calc_stream": reduce_scatter_tensor_on_calc_stream,
    "reduce_scatter_on_calc_stream": reduce_scatter_on_calc_stream,
    "all_to_all_single": all_to_all_single,
    "all_to_all_tensor": all_to_all_tensor,
    "all_to_all": all_to_all,
    "all_to_all_single_on_calc_stream": all_to_all_single_on_calc_stream,
    "all_to_all_tensor_on_calc_stream": all_to_all_tensor_on_calc_stream,
    "all_to_all_on_calc_stream": all_to_all_on_calc_stream,
}
