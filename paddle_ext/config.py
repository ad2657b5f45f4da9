"""The plugin's one typed configuration.

It is read from the same place as the rest of the training set-up: a mapping
shaped like the fleet strategy's config dicts, whose plugin part sits under
the key "paddle_ext", e.g.

    paddle_ext.enable({"paddle_ext": {"patches": {"c_embedding_check": False}}})

The environment variable PADDLE_EXT_PATCHES ("name=off,other=on") overrides
single units without touching code. Unknown keys and wrong types raise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

SECTION = "paddle_ext"
PLUGIN_KEYS = ("patches",)
ENV_PATCHES = "PADDLE_EXT_PATCHES"
_TRUE = {"1", "on", "true", "yes"}
_FALSE = {"0", "off", "false", "no"}


@dataclass(frozen=True)
class PluginConfig:
    # unit name -> switched on; units not named keep their default (on)
    patches: Mapping[str, bool] = field(default_factory=dict)

    def unit_enabled(self, name: str) -> bool:
        return self.patches.get(name, True)


def _section(source: Any) -> Mapping[str, Any]:
    if source is None:
        return {}
    if not isinstance(source, Mapping):
        raise TypeError(
            f"config must be a mapping (the strategy-style dict) or None, got {type(source).__name__}")
    if SECTION in source:
        section = source[SECTION]
        if not isinstance(section, Mapping):
            raise TypeError(f"config[{SECTION!r}] must be a mapping, got {type(section).__name__}")
        return section
    return source


def _parse_env(text: str, known_units: tuple[str, ...]) -> dict[str, bool]:
    switches: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        value = value.strip().lower()
        if not sep or value not in _TRUE | _FALSE:
            raise ValueError(f"{ENV_PATCHES}: expected NAME=on|off items, got {item!r}")
        switches[name.strip()] = value in _TRUE
    _check_units(switches, known_units, ENV_PATCHES)
    return switches


def _check_units(switches: Mapping[str, Any], known_units: tuple[str, ...], where: str) -> None:
    for name, on in switches.items():
        if name not in known_units:
            raise ValueError(f"{where}: unknown patch unit {name!r}; known units: {list(known_units)}")
        if not isinstance(on, bool):
            raise TypeError(f"{where}[{name!r}] must be True or False, got {on!r}")


def from_source(source: Any, known_units: tuple[str, ...]) -> PluginConfig:
    """Builds the config from a strategy-style mapping and the environment."""
    section = _section(source)
    unknown = [k for k in section if k not in PLUGIN_KEYS]
    if unknown:
        raise ValueError(f"unknown paddle_ext config keys {unknown}; allowed: {list(PLUGIN_KEYS)}")
    patches = dict(section.get("patches", {}))
    _check_units(patches, known_units, "paddle_ext.patches")
    patches.update(_parse_env(os.environ.get(ENV_PATCHES, ""), known_units))
    return PluginConfig(patches=patches)
