"""Whether GPU tests can run here: one answer for every module in tests/gpu."""

from __future__ import annotations


def gpu_skip_reason() -> str | None:
    """None when Paddle is a CUDA or ROCm build that sees a device, else why not."""
    try:
        import paddle
    except ImportError as err:
        return f"paddle is not importable ({err})"
    if not (paddle.is_compiled_with_cuda() or paddle.is_compiled_with_rocm()):
        return f"Paddle {paddle.__version__} is not a CUDA or ROCm build"
    try:
        count = paddle.device.cuda.device_count()
    except Exception as err:  # a GPU build on a machine without a driver
        return f"no GPU device ({err})"
    if count < 1:
        return "no GPU device"
    return None
