"""Loads the custom-op library (paddle_ext/lib/libpaddle_ext_ops.so) once.

The library is compiled against one Paddle release at install time; loading it
into another one is refused with a message saying how to rebuild.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
from typing import Any

from paddle_ext import compat
from paddle_ext.ops import _modes
from paddle_ext.ops._checks import InvalidArgumentError

LIB_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib")
LIBRARY = os.path.join(LIB_DIR, "libpaddle_ext_ops.so")
BUILD_INFO = os.path.join(LIB_DIR, "build_info.json")


class OpLibraryError(RuntimeError):
    """The op library is missing or was built for another Paddle."""


def build_info() -> dict[str, Any] | None:
    """What the op library was built against, or None when it is not built."""
    if not (os.path.exists(LIBRARY) and os.path.exists(BUILD_INFO)):
        return None
    with open(BUILD_INFO) as f:
        return json.load(f)


def register_custom_op_library(path: str) -> None:
    """Registers the custom ops of the library at `path` with Paddle (the same loader in
    2.6.2 and 3.x)."""
    import warnings

    with warnings.catch_warnings():  # importing cpp_extension warns that ccache is missing
        warnings.simplefilter("ignore")
        from paddle.utils.cpp_extension.extension_utils import load_op_meta_info_and_register_op

    load_op_meta_info_and_register_op(path)


@functools.cache
def load() -> ctypes.CDLL:
    """Registers the library's ops with Paddle (once) and returns its C handle."""
    info = build_info()
    if info is None:
        raise OpLibraryError(
            f"paddle_ext's op library is not built ({LIBRARY} is missing): "
            "reinstall paddle-ext with `pip install .` in an environment that has Paddle")
    built_for = info["paddle_version"]
    if not compat.is_running_release(built_for):
        raise OpLibraryError(
            f"paddle_ext's op library was built against Paddle {built_for}, but Paddle "
            f"{compat.version_string()} is installed: reinstall paddle-ext (pip install --force-reinstall "
            "--no-deps paddle-ext, or `pip install .` in its source tree)")
    register_custom_op_library(LIBRARY)
    # The same path gives the same handle: its C settings are the ones the ops use.
    return ctypes.CDLL(LIBRARY)


def unavailable(ops: tuple[str, ...]) -> str | None:
    """Why the library cannot serve `ops` here (not built, built for another
    Paddle, or built without them), or None."""
    try:
        load()
    except OpLibraryError as err:
        return str(err)
    built = (build_info() or {}).get("ops", [])
    lacking = [op for op in ops if op not in built]
    if lacking:
        return f"paddle_ext's op library lacks {', '.join(lacking)}: reinstall paddle-ext"
    return None


def run(op_name: str, *args: Any) -> list:
    """Runs a registered op eagerly, or adds it to the static program being built."""
    load()
    return _modes.run_custom_op_any_mode(op_name, *args)


@functools.cache
def runner_returns_empty_outputs() -> bool:
    """Whether this Paddle's custom-op runner lets an op return a zero-size output (3.3 does;
    2.6 and 3.0 refuse it as "not initialized": measured). Where it does not, a backward
    whose gradient of an empty input (flash attention without keys) is zero-size fails."""
    import paddle

    try:
        run("pe_c_embedding", paddle.zeros([1, 1], dtype="float32"), paddle.zeros([0], dtype="int64"), 0, -1)
    except ValueError as err:
        if "not initialized" in str(err):
            return False
        raise
    return True


def set_num_threads(n: int) -> None:
    """Threads the CPU kernels use (default: PADDLE_EXT_NUM_THREADS, else all cores)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise InvalidArgumentError(f"set_num_threads: n must be an int >= 1, got {n!r}")
    load().paddle_ext_set_num_threads(n)


def get_num_threads() -> int:
    return int(load().paddle_ext_get_num_threads())


def thread_pool() -> str:
    """Where the CPU kernels' threads come from: "openmp (libiomp5.so)" (the OpenMP
    runtime Paddle already loaded, shared with its MKL calls) or "std::thread"
    (none loaded, or PADDLE_EXT_THREAD_POOL=std)."""
    fn = load().paddle_ext_thread_pool
    fn.restype = ctypes.c_char_p
    return fn().decode()
