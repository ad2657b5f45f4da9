"""Splitting a global batch into micro-batches, with fleet's conventions.

`data` is `[inputs, labels]`; each side is a Tensor, a tuple of Tensors (all
split along dim 0), or a list with one entry per micro-batch. Stages that need
no data (neither first nor last) may pass None.
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


class MicroBatches:
    def __init__(self, data: Any, count: int, size: int) -> None:
        if data is not None and (not isinstance(data, (list, tuple)) or len(data) != 2):
            raise ValueError("data must be [inputs, labels] (either may be None on middle stages)")
        self._data = data
        self.count = count
        self.size = size

    def inputs(self, mb: int) -> Any:
        if self._data is None or self._data[0] is None:
            raise ValueError("the first pipeline stage needs inputs: data[0] is None")
        return _slice(self._data[0], mb, self.size, self.count, "data[0]")

    def labels(self, mb: int) -> Any:
        if self._data is None or self._data[1] is None:
            raise ValueError("the last pipeline stage needs labels: data[1] is None")
        return _slice(self._data[1], mb, self.size, self.count, "data[1]")
