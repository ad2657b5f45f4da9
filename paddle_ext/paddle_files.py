"""Files of the installed Paddle package, found without importing Paddle (the import-time
checks cpu_math and zlib_binding run before it). The same layout in 2.6.2 and 3.x."""

from __future__ import annotations


def _paddle_package_file(*parts: str) -> str | None:
    """The file paddle/<parts...> of the installed Paddle, found without importing Paddle;
    None where it has none."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("paddle")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, *parts)
        if os.path.isfile(path):
            return path
    return None


def mkl_library_path() -> str | None:
    """The MKL that Paddle's x86-64 CPU wheels (2.6.2, 3.x) ship as paddle/libs/libmklml_intel.so
    (2019.0.5 in both), found without importing Paddle; None for builds without it."""
    return _paddle_package_file("libs", "libmklml_intel.so")


def paddle_core_library() -> str | None:
    """Paddle's core extension module, paddle/base/libpaddle.so (2.6.2 and 3.x), found
    without importing Paddle; None where there is none."""
    return _paddle_package_file("base", "libpaddle.so")
