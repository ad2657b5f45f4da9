"""paddle-ext: large-model training features for stock PaddlePaddle releases.

    import paddle_ext
    paddle_ext.enable()            # apply the patch series (idempotent)
    paddle_ext.disable()           # put every original Paddle object back

Importing paddle_ext changes nothing in Paddle's Python objects; enable() does,
unit by unit, as listed in `python -m paddle_ext patches`. On AMD CPUs with AVX2
the import points Paddle's MKL at its AVX2 kernels (paddle_ext.cpu_math;
PADDLE_EXT_MKL_AMD=off leaves MKL's own choice). Where Paddle's core library brings a
zlib of its own (2.6), the import keeps Python's zlib working, whether it comes before
or after `import paddle` (paddle_ext.zlib_binding; PADDLE_EXT_ZLIB=off leaves it).
"""

from __future__ import annotations

from typing import Any

from paddle_ext import _source_tree

_source_tree.check()  # an unbuilt checkout stops here, saying what to run

from paddle_ext import cpu_math, zlib_binding  # noqa: E402
from paddle_ext._version import __version__  # noqa: E402

# Before anything here imports Paddle (see zlib_binding).
zlib_binding.decision = zlib_binding.prepare()

# Before Paddle's MKL makes its first computation, on AMD only (see cpu_math).
cpu_math.decision = cpu_math.prefer_avx2_path()

__all__ = ["__version__", "enable", "disable", "patch_table"]


def enable(config: Any = None) -> None:
    """Applies the patch series in order, as `config` switches units on or off.

    config: None, or a strategy-style mapping with the plugin's keys under
    "paddle_ext" (see paddle_ext.config). Calling it again re-applies the
    configuration: units switched off are reverted, the others stay applied.
    """
    from paddle_ext import config as config_module
    from paddle_ext.comm import debug
    from paddle_ext.patches import series

    debug.configure(config)  # before the units: comm_debug may start the watchdog
    config_module.configure_pp_configs(config)
    s = series()
    s.apply(config_module.from_source(config, s.names))
    section = config_module.plugin_section(config)
    if "runtime" in section:
        from paddle_ext import runtime

        runtime.configure(config)


def disable() -> None:
    """Reverts every applied unit, restoring the original Paddle objects."""
    from paddle_ext.patches import series

    series().revert()


def patch_table() -> list[tuple[str, str, str, str]]:
    """(unit, upstream PRs, status, title) for each unit of the series."""
    from paddle_ext.patches import series

    return series().table()
