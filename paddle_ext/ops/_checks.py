"""Argument checks shared by the op wrappers: each error names the argument,
the value it got and what is allowed."""

from __future__ import annotations

from typing import Any, Iterable

from paddle_ext.errors import InvalidArgumentError


class ArgumentTypeError(TypeError, InvalidArgumentError):
    """An argument of the wrong kind: not a Tensor, not a bool / int / float where
    one is needed, or a dtype that differs from the tensor it must match.
    Paddle's C++ entry points refuse those with InvalidType (TypeError, 3.x) or
    InvalidArgument (ValueError: 2.6, a non-Tensor argument on 3.x, its kernels
    for a tensor of another dtype than their first input)."""


class UnsupportedDtypeError(TypeError, RuntimeError):
    """A dtype no kernel of the op takes. Paddle finds no kernel registered for
    it and raises NotFound, which reaches Python as RuntimeError."""


class RankError(InvalidArgumentError, IndexError):
    """A tensor with the wrong number of dimensions. Paddle's wrappers index the
    shape they expect (flash_attention reads query.shape[3] first: IndexError
    for a 3-D query) or its shape inference refuses it (ValueError)."""


def dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).replace("paddle.", "").replace("VarType.", "").lower()


def require_tensor(name: str, value: Any) -> None:
    """value must be a Tensor (or, while a static program is built, one of its variables)."""
    from paddle_ext.ops import _modes

    if not _modes.is_tensor(value):
        raise ArgumentTypeError(f"{name} must be a paddle.Tensor, got {type(value).__name__}")


def require_dtype(name: str, tensor: Any, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    got = dtype_name(tensor)
    if got not in allowed:
        raise UnsupportedDtypeError(f"{name} must have dtype in {allowed}, got {got}")


def require_ndim(name: str, tensor: Any, ndim: int) -> None:
    if tensor.ndim != ndim:
        raise RankError(f"{name} must be {ndim}-D, got shape {list(tensor.shape)}")


def require_same_dtype(name: str, tensor: Any, other_name: str, other: Any) -> None:
    """tensor must have other's dtype (key and value that of query, ...)."""
    if dtype_name(tensor) != dtype_name(other):
        raise ArgumentTypeError(f"{name} must have {other_name}'s dtype {dtype_name(other)}, got {dtype_name(tensor)}")


def same_place(a: Any, b: Any) -> bool:
    """Whether two tensors are on the same device; always True for a static
    program's variables, whose place is the executor's."""
    from paddle_ext.ops import _modes

    if not _modes.in_dynamic_mode():
        return True
    return str(a.place) == str(b.place)


def contiguous(t: Any) -> Any:
    """t with contiguous memory (the kernels read raw pointers); a static
    program's variable as it is (2.6's have no is_contiguous; the executor
    passes contiguous tensors)."""
    is_contiguous = getattr(t, "is_contiguous", None)
    if is_contiguous is not None and not is_contiguous():
        return t.contiguous()
    return t


def require_int(name: str, value: Any, *, low: int | None = None, high: int | None = None,
                also: tuple[int, ...] = ()) -> None:
    """value must be an int in [low, high] (either end optional) or one of `also`."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value in also:
        return
    if (low is not None and value < low) or (high is not None and value > high):
        lo = "-inf" if low is None else str(low)
        hi = "inf" if high is None else str(high)
        extra = f" or one of {list(also)}" if also else ""
        raise InvalidArgumentError(f"{name} must be in [{lo}, {hi}]{extra}, got {value}")


def cpu_kernel_dtypes(kernel: str) -> frozenset[str]:
    """The dtypes phi's kernel registry has a CPU kernel of `kernel` for ("float32", ...),
    read without running anything: both releases keep the registry as strings such as
    "(CPU, Undefined(AnyLayout), float32)". A kernel that crashes this CPU (built for an
    instruction set it lacks) can be told from a missing one only this way."""
    from paddle.base import core

    entries = core._get_registered_phi_kernels("function").get(kernel) or []
    dtypes = set()
    for entry in entries:
        parts = [p.strip() for p in entry.strip("()").split(",")]
        if parts and parts[0] == "CPU":
            dtypes.add(parts[-1])
    return frozenset(dtypes)
