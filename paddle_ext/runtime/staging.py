"""Host-to-device staging through the pinned pool: a host array is copied into a
pinned block, the device copy is started asynchronously from there, and an
event on the copying stream keeps the block out of reuse until the copy has
read it (the pool's record_event). Used by the pipeline for micro-batch inputs
on GPU (paddle_ext.pipeline.microbatch); on CPU there is nothing to stage and
default_stager() returns None, so no copy is made.

Why pinned: from pageable memory the driver copies synchronously through its
own bounce buffer; from page-locked memory the copy is a DMA that runs while
the host goes on. Why the event: the copy reads the block after stage()
returned and dropped it, so without the event the next stage() could be handed
the same block and overwrite it mid-copy.

The core (HostStager) takes the copy and the stream as functions, so the CPU
tests drive it with the fake backend and a held CpuStream; only gpu_stager()
touches Paddle's device API (checked on a GPU by tests/runtime/gpu_check.py).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from paddle_ext.runtime.event import StreamLike
from paddle_ext.runtime.pool import PinnedPool, as_tensor, default_pool

CopyFn = Callable[[np.ndarray], Any]


class HostStager:
    """Stages host data through `pool`: stage(x) returns copy(pinned copy of x),
    with the block gated on an event recorded on stream() after the copy was
    enqueued. `copy` must enqueue on that stream and must not keep the array."""

    def __init__(self, pool: PinnedPool, copy: CopyFn, stream: Callable[[], StreamLike],
                 device: int = -1, accept: Callable[[Any], bool] | None = None) -> None:
        if not isinstance(pool, PinnedPool):
            raise TypeError(f"pool must be a PinnedPool, got {type(pool).__name__}")
        for name, fn in (("copy", copy), ("stream", stream)):
            if not callable(fn):
                raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
        self.pool, self.copy, self.stream, self.device = pool, copy, stream, device
        self.accept = accept if accept is not None else (lambda x: isinstance(x, np.ndarray))
        self.staged = 0        # arrays staged so far
        self.staged_bytes = 0

    def stage(self, host: Any) -> Any:
        pinned = self.pool.copy_of(host)
        out = self.copy(pinned)
        # After the copy was enqueued: the event captures it. The block is freed
        # when `pinned` goes at return, and reused only once the event completed.
        if not self.pool.record_event(pinned, self.stream(), self.device):
            raise RuntimeError("staging: the pinned block was not live when its copy was recorded (a pool bug)")
        self.staged += 1
        self.staged_bytes += pinned.nbytes
        return out

    def stage_tree(self, item: Any) -> Any:
        """stage() every accepted leaf of nested tuples, lists and dicts; other leaves as they are."""
        if isinstance(item, tuple):
            return tuple(self.stage_tree(x) for x in item)
        if isinstance(item, list):
            return [self.stage_tree(x) for x in item]
        if isinstance(item, dict):
            return {k: self.stage_tree(v) for k, v in item.items()}
        return self.stage(item) if self.accept(item) else item


def _host_tensor(x: Any) -> bool:
    import paddle

    # bfloat16 has no numpy dtype (Paddle's numpy() gives uint16): left to Paddle's own copy.
    return isinstance(x, paddle.Tensor) and x.place.is_cpu_place() and x.dtype != paddle.bfloat16


def gpu_stager(device_id: int, pool: PinnedPool | None = None) -> HostStager:
    """Stages host tensors to GPU `device_id` on Paddle's current stream of that device."""
    import paddle

    place = paddle.CUDAPlace(device_id)

    def copy(pinned: np.ndarray) -> Any:
        # A CPU tensor over the pinned block (no copy), copied with blocking=False:
        # cudaMemcpyAsync on the device context's stream, i.e. current_stream().
        return as_tensor(pinned)._copy_to(place, False)

    def stream() -> StreamLike:
        return paddle.device.current_stream(place)

    # MicroBatches hands out detached slices (stop_gradient=True), and so is the copy.
    return HostStager(pool if pool is not None else default_pool(), copy, stream, device_id, _host_tensor)


def default_stager() -> HostStager | None:
    """A GPU stager for Paddle's current device, or None where staging does not apply:
    a CPU (or XPU) device, or a Paddle that cannot share host memory with a tensor
    without a copy (compat.tensors_share_host_memory: 2.6)."""
    import paddle

    from paddle_ext import compat

    device = paddle.get_device()
    if not device.startswith("gpu") or not compat.tensors_share_host_memory():
        return None
    return gpu_stager(int(device.partition(":")[2] or 0))
