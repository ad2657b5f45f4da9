"""The compiled runtime module, paddle_ext._C, with a clear error when it is missing."""

from __future__ import annotations

from types import ModuleType


def native() -> ModuleType:
    try:
        from paddle_ext import _C
    except ImportError as err:  # pragma: no cover - only on a broken install
        raise ImportError(
            "paddle_ext's native runtime (paddle_ext._C) is not built: reinstall paddle-ext "
            f"(`pip install .` in its source tree) ({err})") from err
    return _C
