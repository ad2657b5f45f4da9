"""The patch series: loads the units listed in `series` and keeps their state.

Installed as paddle_ext.patches. Units are thin adapters: each wires an
implementation from paddle_ext (which never imports this package) into Paddle.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

from paddle_ext import compat
from paddle_ext.patches._unit import Patcher, PatchUnit

SERIES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "series")

APPLIED = "applied"
NATIVE = "native upstream"
SKIPPED = "skipped"
DISABLED = "disabled by config"
NOT_APPLIED = "not applied"


def read_series(path: str = SERIES_FILE) -> list[str]:
    names = []
    with open(path) as f:
        for line in f:
            entry = line.split("#", 1)[0].strip()
            if entry:
                names.append(entry.removesuffix(".py"))
    return names


def load_units() -> list[PatchUnit]:
    units = []
    for name in read_series():
        module = importlib.import_module(f"{__name__}.{name}")
        unit = module.UNIT
        if unit.name != name:
            raise RuntimeError(f"patches/series names {name!r} but its module defines unit {unit.name!r}")
        units.append(unit)
    return units


@dataclass
class UnitState:
    unit: PatchUnit
    status: str = NOT_APPLIED
    detail: str = ""
    patcher: Patcher | None = None


class Series:
    """The units in series order with what happened to each."""

    def __init__(self, units: list[PatchUnit]) -> None:
        self.states = [UnitState(u) for u in units]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.unit.name for s in self.states)

    def apply(self, config: Any) -> None:
        """Brings every unit to what `config` asks; idempotent."""
        for state in self.states:
            wanted = config.unit_enabled(state.unit.name)
            if not wanted:
                self._revert(state)
                state.status, state.detail = DISABLED, ""
                continue
            if state.status == APPLIED:
                continue
            if state.unit.native():
                state.status, state.detail = NATIVE, f"Paddle {compat.version_string()} ships it"
                continue
            reason = state.unit.unavailable()
            if reason:
                state.status, state.detail = SKIPPED, reason
                continue
            patcher = Patcher()
            try:
                state.unit.apply(patcher)
                problems = state.unit.problems(patcher, self._swaps())
                if problems:
                    raise RuntimeError("verify failed after apply(): " + "; ".join(problems))
            except Exception:
                patcher.revert()
                raise
            state.patcher, state.status, state.detail = patcher, APPLIED, ""

    def _swaps(self) -> list:
        return [swap for s in self.states if s.patcher is not None for swap in s.patcher.swaps]

    def verify(self) -> list[str]:
        """For every applied unit, what no longer holds of what it installed (each
        problem names the unit and the attribute); empty when every swap holds."""
        swaps = self._swaps()
        return [p for s in self.states if s.patcher is not None for p in s.unit.problems(s.patcher, swaps)]

    def installed_by(self, obj: Any) -> str | None:
        """The name of the applied unit that installed `obj` (a wrapper, a method), or None."""
        for s in self.states:
            if s.patcher is not None and any(swap.new is obj for swap in s.patcher.swaps):
                return s.unit.name
        return None

    def revert(self) -> None:
        for state in reversed(self.states):
            self._revert(state)
            state.status, state.detail = NOT_APPLIED, ""

    @staticmethod
    def _revert(state: UnitState) -> None:
        if state.patcher is not None:
            state.patcher.revert()
            state.patcher = None

    def table(self) -> list[tuple[str, str, str, str]]:
        """(unit, upstream PRs, status, title) rows in series order."""
        rows = []
        for s in self.states:
            status = f"{s.status} ({s.detail})" if s.detail else s.status
            rows.append((s.unit.name, s.unit.upstream_text, status, s.unit.title))
        return rows


_SERIES: Series | None = None


def series() -> Series:
    global _SERIES
    if _SERIES is None:
        _SERIES = Series(load_units())
    return _SERIES
