"""Paddle's FlexCheckpoint loader on a CPU build: the tensors it exchanges stay on the host.

`paddle.distributed.load_state_dict` (FlexCheckpoint, Paddle 3.2+; what PaddleFormers'
Trainer calls to resume from a checkpoint) reshards a checkpoint by broadcasting the
slices one rank holds to the ranks that need them. Since upstream #75282 it stages every
tensor it sends or receives on the GPU first (`Tensor.cuda()` in
flex_checkpoint/dcp/reshard_comm.py and resharder.py), so on a CPU build a resume that
needs any exchange (tensor parallelism: the tensor-parallel slices are read across ranks)
fails with "No available device found", although gloo broadcasts host tensors.

`host_staged(load_state_dict)` runs Paddle's loader with `Tensor.cuda` answering the
tensor itself for the length of the call: the staging copy becomes the host tensor, the
broadcasts run on gloo, and Paddle's code that copies a staged tensor back into its
target copies it onto itself. Nothing else of the loader changes. `Tensor.cuda` is the
class attribute, so another thread calling `.cuda()` meanwhile gets the tensor back
instead of Paddle's error; on a CPU build that call could not have succeeded either.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

_LOCK = threading.RLock()  # one scope at a time swaps Tensor.cuda


def _stays_on_host(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    return tensor


@contextlib.contextmanager
def cuda_stays_on_host() -> Iterator[None]:
    """For the length of the block, `Tensor.cuda(...)` answers the tensor itself (a CPU
    build has no device to stage on). Also used for group sharding's clip on the host
    (paddle_ext.host_sharding)."""
    import paddle

    with _LOCK:
        device_copy = paddle.Tensor.cuda
        paddle.Tensor.cuda = _stays_on_host
        try:
            yield
        finally:
            paddle.Tensor.cuda = device_copy


def host_staged(original: Callable[..., Any]) -> Callable[..., Any]:
    """`original` (Paddle's load_state_dict) with its GPU staging kept on the host."""

    @functools.wraps(original)
    def load_state_dict(*args: Any, **kwargs: Any) -> Any:
        with cuda_stays_on_host():
            return original(*args, **kwargs)

    return load_state_dict
