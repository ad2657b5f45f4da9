"""Splitting a global batch into micro-batches, with fleet's conventions.

`data` is `[inputs, labels]`; each side is a Tensor, a tuple of Tensors (all
split along dim 0), or a list with one entry per micro-batch. Stages that need
no data (neither first nor last) may pass None.

On a GPU, host tensors of a micro-batch are staged: copied into the pinned pool
and from there to the device asynchronously, the block gated on an event of
the copying stream (paddle_ext.runtime.staging). On CPU nothing is staged.
"""

from __future__ import annotations

from typing import Any

import paddle


def _slice(item: Any, mb: int, size: int, count: int, where: str) -> Any:
    if item is None:
        return None
    if isinstance(item, list):
        if len(item) != count:
            raise ValueError(f"{where}: a per-micro-batch list must have accumulate_steps={count} entries, got {len(item)}")
        entry = item[mb]
        return entry.detach() if isinstance(entry, paddle.Tensor) else entry
    if isinstance(item, tuple):
        return tuple(_slice(t, mb, size, count, f"{where}[{i}]") for i, t in enumerate(item))
    if isinstance(item, dict):
        return {k: _slice(v, mb, size, count, f"{where}[{k!r}]") for k, v in item.items()}
    if not isinstance(item, paddle.Tensor):
        raise TypeError(f"{where} must be a Tensor, a tuple/dict of Tensors or a per-micro-batch list, got {type(item).__name__}")
    batch = int(item.shape[0])
    if batch != size * count:
        raise ValueError(
            f"{where}: batch size {batch} must equal micro_batch_size * accumulate_steps = {size} * {count} = {size * count}")
    return item[mb * size:(mb + 1) * size].detach()


_AUTO = object()


class MicroBatches:
    def __init__(self, data: Any, count: int, size: int, stager: Any = _AUTO) -> None:
        """stager: a paddle_ext.runtime.staging.HostStager, None (no staging), or by
        default staging.default_stager() (None on CPU)."""
        if data is not None and (not isinstance(data, (list, tuple)) or len(data) != 2):
            raise ValueError("data must be [inputs, labels] (either may be None on middle stages)")
        self._data = data
        self.count = count
        self.size = size
        if stager is _AUTO:
            stager = None
            if paddle.get_device().startswith("gpu"):  # CPU runs never load the native runtime for this
                from paddle_ext.runtime.staging import default_stager

                stager = default_stager()
        self.stager = stager

    def _staged(self, item: Any) -> Any:
        return item if self.stager is None else self.stager.stage_tree(item)

    def inputs(self, mb: int) -> Any:
        if self._data is None or self._data[0] is None:
            raise ValueError("the first pipeline stage needs inputs: data[0] is None")
        return self._staged(_slice(self._data[0], mb, self.size, self.count, "data[0]"))

    def labels(self, mb: int) -> Any:
        if self._data is None or self._data[1] is None:
            raise ValueError("the last pipeline stage needs labels: data[1] is None")
        return self._staged(_slice(self._data[1], mb, self.size, self.count, "data[1]"))
