"""Configuration of the pinned pool and its debug flags.

Three layers, later ones winning: the defaults below, the "runtime" section of
the paddle_ext config (``{"paddle_ext": {"runtime": {...}}}``, the same
strategy-style mapping ``paddle_ext.enable`` takes), then environment
variables. Keyword arguments of ``PinnedPool`` override all three.

=====================  ====================================  ==========================================
key                    environment variable                  upstream counterpart
=====================  ====================================  ==========================================
backend                PADDLE_EXT_PINNED_BACKEND             (auto: cuda, hip, xpu if usable, else posix)
alignment              PADDLE_EXT_PINNED_ALIGNMENT           64 KiB fixed upstream
chunk_size             PADDLE_EXT_PINNED_CHUNK_SIZE          FLAGS_auto_growth_chunk_size_in_mb
max_cached_bytes       PADDLE_EXT_PINNED_MAX_CACHED_BYTES    (none)
trim_on_growth         PADDLE_EXT_PINNED_TRIM_ON_GROWTH      (bounded FLAGS_free_when_no_cache_hit)
reuse_waste            PADDLE_EXT_PINNED_REUSE_WASTE         (none: upstream splits every chunk)
mlock                  PADDLE_EXT_PINNED_MLOCK               (posix only: try / require / off)
auto_growth            PADDLE_EXT_PINNED_AUTO_GROWTH         FLAGS_use_auto_growth_pinned_allocator
fill_value             PADDLE_EXT_ALLOC_FILL_VALUE           FLAGS_alloc_fill_value
sync_after_alloc       PADDLE_EXT_SYNC_AFTER_ALLOC           FLAGS_sync_after_alloc
dump_chunks            PADDLE_EXT_ALLOC_DUMP_CHUNKS          (chunk layout on growth and out-of-memory)
free_idle_chunk        PADDLE_EXT_FREE_IDLE_CHUNK            FLAGS_free_idle_chunk
=====================  ====================================  ==========================================

Sizes take an int or a string with a unit: "2MiB", "512KiB", "1GiB", "4096".
auto_growth=False is upstream's non-caching pinned allocator: every block is
its own backend allocation and goes back on free. trim_on_growth (on by
default) gives idle chunks back before a growth that would lift the pool's
reserved bytes above their peak, which keeps variable-size workloads from
piling up exact-size chunks (see docs/runtime.md). A request above chunk_size
gets a dedicated chunk, never split; reuse_waste (default 1/16) is how much
larger than a request, as a fraction of it, a free dedicated chunk may be and
still serve it whole.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

SECTION = "runtime"
BACKENDS = ("auto", "posix", "cuda", "hip", "xpu", "fake")
MLOCK_MODES = ("try", "require", "off")
MIN_ALIGNMENT, MAX_ALIGNMENT = 16, 1 << 16
MAX_CHUNK_SIZE = 1 << 40
MAX_REUSE_WASTE = 1
_TRUE = {"1", "on", "true", "yes"}
_FALSE = {"0", "off", "false", "no"}
_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "kb": 1000, "mib": 1 << 20, "mb": 1000**2, "gib": 1 << 30,
          "gb": 1000**3, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


@dataclass(frozen=True)
class DebugFlags:
    """Allocation debug flags (upstream PaddlePaddle/Paddle#57797)."""

    fill_value: int = -1           # -1 off; else memset every allocation with this byte
    sync_after_alloc: bool = False  # wait for the device after each allocation
    dump_chunks: bool = False       # print the chunk layout on growth and on out-of-memory
    free_idle_chunk: bool = False   # give an entirely free chunk back at once

    def __post_init__(self) -> None:
        if isinstance(self.fill_value, bool) or not isinstance(self.fill_value, int) or not (
                -1 <= self.fill_value <= 255):
            raise ValueError(f"fill_value must be -1 (off) or a byte value in [0, 255], got {self.fill_value!r}")
        for name in ("sync_after_alloc", "dump_chunks", "free_idle_chunk"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class RuntimeConfig:
    """Settings of a pinned pool; see the module docstring for keys and variables."""

    backend: str = "auto"
    alignment: int = 256
    chunk_size: int = 2 << 20
    max_cached_bytes: int | None = None
    trim_on_growth: bool = True
    reuse_waste: float = 0.0625
    mlock: str = "try"
    auto_growth: bool = True
    flags: DebugFlags = field(default_factory=DebugFlags)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        _check_int("alignment", self.alignment, MIN_ALIGNMENT, MAX_ALIGNMENT)
        if self.alignment & (self.alignment - 1):
            raise ValueError(
                f"alignment must be a power of two in [{MIN_ALIGNMENT}, {MAX_ALIGNMENT}], got {self.alignment}")
        _check_int("chunk_size", self.chunk_size, 0, MAX_CHUNK_SIZE)
        if self.max_cached_bytes is not None:
            _check_int("max_cached_bytes", self.max_cached_bytes, 0, (1 << 63) - 1)
        if isinstance(self.reuse_waste, bool) or not isinstance(self.reuse_waste, (int, float)):
            raise TypeError(f"reuse_waste must be a fraction in [0, {MAX_REUSE_WASTE}], got {self.reuse_waste!r}")
        if not 0.0 <= self.reuse_waste <= MAX_REUSE_WASTE:  # NaN fails too
            raise ValueError(f"reuse_waste must be a fraction in [0, {MAX_REUSE_WASTE}], got {self.reuse_waste}")
        if self.mlock not in MLOCK_MODES:
            raise ValueError(f"mlock must be one of {list(MLOCK_MODES)}, got {self.mlock!r}")
        for name in ("auto_growth", "trim_on_growth"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.flags, DebugFlags):
            raise TypeError(f"flags must be a DebugFlags, got {type(self.flags).__name__}")

    def effective(self) -> RuntimeConfig:
        """The settings the allocator runs with: auto_growth=False means no caching."""
        if self.auto_growth:
            return self
        return dataclasses.replace(self, chunk_size=0, max_cached_bytes=0,
                                   flags=dataclasses.replace(self.flags, free_idle_chunk=True))


_FLAG_KEYS = tuple(f.name for f in dataclasses.fields(DebugFlags))
_TOP_KEYS = tuple(f.name for f in dataclasses.fields(RuntimeConfig) if f.name != "flags")
KEYS = _TOP_KEYS + _FLAG_KEYS
ENV = {
    "backend": "PADDLE_EXT_PINNED_BACKEND",
    "alignment": "PADDLE_EXT_PINNED_ALIGNMENT",
    "chunk_size": "PADDLE_EXT_PINNED_CHUNK_SIZE",
    "max_cached_bytes": "PADDLE_EXT_PINNED_MAX_CACHED_BYTES",
    "trim_on_growth": "PADDLE_EXT_PINNED_TRIM_ON_GROWTH",
    "reuse_waste": "PADDLE_EXT_PINNED_REUSE_WASTE",
    "mlock": "PADDLE_EXT_PINNED_MLOCK",
    "auto_growth": "PADDLE_EXT_PINNED_AUTO_GROWTH",
    "fill_value": "PADDLE_EXT_ALLOC_FILL_VALUE",
    "sync_after_alloc": "PADDLE_EXT_SYNC_AFTER_ALLOC",
    "dump_chunks": "PADDLE_EXT_ALLOC_DUMP_CHUNKS",
    "free_idle_chunk": "PADDLE_EXT_FREE_IDLE_CHUNK",
}
_SIZE_KEYS = ("alignment", "chunk_size", "max_cached_bytes")
_BOOL_KEYS = ("auto_growth", "trim_on_growth", "sync_after_alloc", "dump_chunks", "free_idle_chunk")


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int in [{low}, {high}], got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


def parse_size(text: str, where: str) -> int:
    """'2MiB' -> 2097152; raises ValueError naming `where` and the text."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{where}: expected a byte count such as 4096, 64KiB or 2MiB, got {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _parse_bool(text: str, where: str) -> bool:
    value = text.strip().lower()
    if value not in _TRUE | _FALSE:
        raise ValueError(f"{where}: expected one of 1/0, on/off, true/false, yes/no, got {text!r}")
    return value in _TRUE


def _from_text(key: str, text: str, where: str) -> Any:
    if key in _SIZE_KEYS:
        if key == "max_cached_bytes" and text.strip().lower() in ("", "none", "unlimited"):
            return None
        return parse_size(text, where)
    if key in _BOOL_KEYS:
        return _parse_bool(text, where)
    if key == "reuse_waste":
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{where}: expected a fraction in [0, {MAX_REUSE_WASTE}] such as 0.0625, "
                             f"got {text!r}") from None
    if key == "fill_value":
        try:
            return int(text, 0)
        except ValueError:
            raise ValueError(f"{where}: expected -1 or a byte value in [0, 255], got {text!r}") from None
    return text.strip()


def _section(source: Any) -> Mapping[str, Any]:
    if source is None:
        return {}
    if not isinstance(source, Mapping):
        raise TypeError(f"runtime config must be a mapping or None, got {type(source).__name__}")
    if "paddle_ext" in source:
        source = source["paddle_ext"]
        if not isinstance(source, Mapping):
            raise TypeError(f"config['paddle_ext'] must be a mapping, got {type(source).__name__}")
        source = source.get(SECTION, {})
    elif SECTION in source:
        source = source[SECTION]
    if not isinstance(source, Mapping):
        raise TypeError(f"config['paddle_ext'][{SECTION!r}] must be a mapping, got {type(source).__name__}")
    return source


def _build(values: Mapping[str, Any]) -> RuntimeConfig:
    top = {k: v for k, v in values.items() if k in _TOP_KEYS}
    flags = DebugFlags(**{k: v for k, v in values.items() if k in _FLAG_KEYS})
    return RuntimeConfig(**top, flags=flags)


def from_source(source: Any = None, environ: Mapping[str, str] | None = None) -> RuntimeConfig:
    """The runtime config from a strategy-style mapping, then the environment."""
    section = _section(source)
    unknown = [k for k in section if k not in KEYS]
    if unknown:
        raise ValueError(f"unknown paddle_ext runtime config keys {unknown}; allowed: {list(KEYS)}")
    values: dict[str, Any] = {}
    for key, value in section.items():
        values[key] = _from_text(key, value, f"paddle_ext.runtime.{key}") if isinstance(value, str) and (
            key in _SIZE_KEYS or key in _BOOL_KEYS or key in ("fill_value", "reuse_waste")) else value
    env = os.environ if environ is None else environ
    for key, var in ENV.items():
        if env.get(var, "") != "":
            values[key] = _from_text(key, env[var], var)
    return _build(values)
