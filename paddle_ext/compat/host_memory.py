"""Version differences in sharing host memory with tensors: 3.x's from_dlpack shares a numpy
array's memory, 2.6's copies."""

from __future__ import annotations

from typing import Any

from paddle_ext.compat.version import paddle_before, version_string


def tensors_share_host_memory() -> bool:
    """Whether a Tensor can sit over host memory without a copy (3.x's from_dlpack shares
    it; 2.6's copies, measured): what GPU staging from a pinned pool needs."""
    return not paddle_before(3, 0)


def tensor_sharing_host_memory(array: Any) -> Any:
    """A CPU Tensor over a numpy array's memory, without a copy.

    3.x: through DLPack. Paddle 2.6's from_dlpack copies (measured: the tensor
    did not see later writes), so there is no zero-copy path and it raises.
    """
    if not tensors_share_host_memory():
        raise NotImplementedError(
            f"Paddle {version_string()} has no zero-copy path from host memory to a Tensor "
            "(its from_dlpack copies); use the buffer's numpy() view, or Paddle >= 3.0")
    import paddle

    return paddle.utils.dlpack.from_dlpack(array.__dlpack__())
