"""Settings of communication tracing and the watchdog.

From the "comm" section of the paddle_ext config (``{"paddle_ext": {"comm": {...}}}``,
the mapping ``paddle_ext.enable`` takes), then environment variables, later winning:

=================  ============================  ================================================
key                environment variable          meaning
=================  ============================  ================================================
trace              PADDLE_EXT_COMM_TRACE         record every operation (default on)
ring               PADDLE_EXT_COMM_RING          records kept per rank (default 4096)
watchdog           PADDLE_EXT_COMM_WATCHDOG      hang report, lost-rank detection (default on)
hang_timeout       PADDLE_EXT_HANG_TIMEOUT       seconds one operation may wait before the job
                                                 is declared hung (default 600; 0: never)
heartbeat_timeout  PADDLE_EXT_HEARTBEAT_TIMEOUT  seconds a rank's watchdog connection may stay
                                                 silent before that rank (rank 0: the hub) is
                                                 named lost, with its host (default 15; 0: never)
trace_dir          PADDLE_EXT_COMM_TRACE_DIR     at exit, each rank writes its chrome trace
                                                 there (comm_rank<R>.json; default: none)
=================  ============================  ================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

SECTION = "comm"
_TRUE = {"1", "on", "true", "yes"}
_FALSE = {"0", "off", "false", "no"}
_ENV = {"trace": "PADDLE_EXT_COMM_TRACE", "ring": "PADDLE_EXT_COMM_RING",
        "watchdog": "PADDLE_EXT_COMM_WATCHDOG", "hang_timeout": "PADDLE_EXT_HANG_TIMEOUT",
        "trace_dir": "PADDLE_EXT_COMM_TRACE_DIR", "heartbeat_timeout": "PADDLE_EXT_HEARTBEAT_TIMEOUT"}
_SECONDS = ("hang_timeout", "heartbeat_timeout")


@dataclass(frozen=True)
class CommSettings:
    trace: bool = True
    ring: int = 4096
    watchdog: bool = True
    hang_timeout: float = 600.0
    trace_dir: str = ""
    heartbeat_timeout: float = 15.0

    def __post_init__(self) -> None:
        if not isinstance(self.ring, int) or isinstance(self.ring, bool) or not 1 <= self.ring <= 1 << 24:
            raise ValueError(f"comm.ring = {self.ring!r} is not allowed: an int in [1, {1 << 24}]")
        if isinstance(self.hang_timeout, bool) or not isinstance(self.hang_timeout, (int, float)) \
                or not 0 <= self.hang_timeout <= 1e7:
            raise ValueError(f"comm.hang_timeout = {self.hang_timeout!r} is not allowed: seconds in "
                             "[0, 1e7], 0 switches hang detection off")
        if isinstance(self.heartbeat_timeout, bool) or not isinstance(self.heartbeat_timeout, (int, float)) \
                or not (self.heartbeat_timeout == 0 or 0.1 <= self.heartbeat_timeout <= 1e7):
            raise ValueError(f"comm.heartbeat_timeout = {self.heartbeat_timeout!r} is not allowed: seconds in "
                             "[0.1, 1e7], 0 switches the heartbeat off")
        for name in ("trace", "watchdog"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"comm.{name} must be True or False, got {getattr(self, name)!r}")


def _parse(key: str, text: str) -> Any:
    if key in ("trace", "watchdog"):
        value = text.strip().lower()
        if value not in _TRUE | _FALSE:
            raise ValueError(f"{_ENV[key]} = {text!r} is not allowed: on or off")
        return value in _TRUE
    if key == "ring":
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{_ENV[key]} = {text!r} is not allowed: an int") from None
    if key in _SECONDS:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{_ENV[key]} = {text!r} is not allowed: seconds") from None
    return text


def from_source(source: Any = None) -> CommSettings:
    from paddle_ext.config import plugin_section

    section: Mapping[str, Any] = plugin_section(source).get(SECTION, {})
    if not isinstance(section, Mapping):
        raise TypeError(f"config['{SECTION}'] must be a mapping, got {type(section).__name__}")
    unknown = sorted(set(section) - set(_ENV))
    if unknown:
        raise ValueError(f"unknown paddle_ext comm keys {unknown}; allowed: {sorted(_ENV)}")
    values = dict(section)
    for key, env in _ENV.items():
        if os.environ.get(env):
            values[key] = _parse(key, os.environ[env])
    return CommSettings(**values)
