"""Argument checks shared by the op wrappers: each error names the argument,
the value it got and what is allowed."""

from __future__ import annotations

from typing import Any, Iterable


def dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).replace("paddle.", "").replace("VarType.", "").lower()


def require_tensor(name: str, value: Any) -> None:
    import paddle

    if not isinstance(value, paddle.Tensor):
        raise TypeError(f"{name} must be a paddle.Tensor, got {type(value).__name__}")


def require_dtype(name: str, tensor: Any, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    got = dtype_name(tensor)
    if got not in allowed:
        raise TypeError(f"{name} must have dtype in {allowed}, got {got}")


def require_ndim(name: str, tensor: Any, ndim: int) -> None:
    if tensor.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {list(tensor.shape)}")


def require_int(name: str, value: Any, *, low: int | None = None, high: int | None = None,
                also: tuple[int, ...] = ()) -> None:
    """value must be an int in [low, high] (either end optional) or one of `also`."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value in also:
        return
    if (low is not None and value < low) or (high is not None and value > high):
        lo = "-inf" if low is None else str(low)
        hi = "inf" if high is None else str(high)
        extra = f" or one of {list(also)}" if also else ""
        raise ValueError(f"{name} must be in [{lo}, {hi}]{extra}, got {value}")
