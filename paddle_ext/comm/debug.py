"""What the comm_debug patch unit (#56441) wires into Paddle, usable without it.

- `configure(source)`: the "comm" settings (comm/settings.py) applied to the tracer;
- `traced_methods(cls)`: a class's ProcessGroup methods wrapped to record each call;
- `recording_group_creation(original)`: `_new_process_group_impl` that records every
  group's creation (on gloo: its connection) as a trace event;
- `starting_watchdog(original)`: `_set_default_store` that starts the watchdog as
  soon as init_parallel_env has made the job's store;
- `start_watchdog()`: the same, by hand (after init).
"""

from __future__ import annotations

import atexit
import collections
import os
import time
from typing import Any, Callable, Optional

from paddle_ext.comm import watchdog
from paddle_ext.comm.settings import CommSettings, from_source
from paddle_ext.comm.trace import traced_method, tracer, write_chrome_trace

__all__ = ["TRACED_METHODS", "configure", "recording_group_creation", "settings", "start_watchdog",
           "starting_watchdog", "traced_methods"]

# Every communication method of Paddle's ProcessGroup (2.6 and 3.x).
TRACED_METHODS = (
    "all_gather", "all_gather_into_tensor", "all_gather_partial", "all_reduce", "allreduce",
    "all_to_all", "all_to_all_single", "all_to_all_tensor", "alltoall", "alltoall_single", "barrier",
    "broadcast", "gather", "recv", "recv_partial", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "scatter", "scatter_tensor", "send", "send_partial",
)
_CALC_STREAM = tuple(f"{m}_on_calc_stream" for m in TRACED_METHODS)

_SETTINGS: list[CommSettings] = [CommSettings()]


def settings() -> CommSettings:
    return _SETTINGS[0]


def configure(source: Any = None) -> CommSettings:
    """Applies the comm settings (config section and environment) to this process."""
    s = from_source(source)
    t = tracer()
    t.enabled = s.trace
    if t.records.maxlen != s.ring:
        t.records = collections.deque(t.records, maxlen=s.ring)
    _SETTINGS[0] = s
    return s


def traced_methods(cls: Any) -> dict[str, Callable[..., Any]]:
    """name -> traced wrapper for the communication methods `cls` defines itself."""
    own = vars(cls)
    return {name: traced_method(name, own[name]) for name in TRACED_METHODS + _CALC_STREAM
            if name in own and not getattr(own[name], "__paddle_ext_traced__", False)}


def recording_group_creation(original: Callable[..., Any]) -> Callable[..., Any]:
    def _new_process_group_impl(backend, store, rank, world_size, group_name, pg_options,
                                group_id=0, *args: Any, **kwargs: Any) -> Any:
        start = time.time()
        pg = original(backend, store, rank, world_size, group_name, pg_options, group_id, *args, **kwargs)
        tracer().event(int(group_id), "create_group", f"{backend} {world_size} ranks", start, time.time())
        return pg

    _new_process_group_impl.__wrapped__ = original  # type: ignore[attr-defined]
    return _new_process_group_impl


def starting_watchdog(original: Callable[..., Any]) -> Callable[..., Any]:
    def _set_default_store(store: Any) -> Any:
        out = original(store)
        start_watchdog(store)
        return out

    _set_default_store.__wrapped__ = original  # type: ignore[attr-defined]
    return _set_default_store


def start_watchdog(store: Any = None) -> Optional[watchdog.Watchdog]:
    """Starts this rank's watchdog when the settings ask for it and the job has more
    than one rank (collective: every rank calls it). Also arranges the chrome trace
    at exit when comm.trace_dir is set."""
    from paddle_ext import upstream

    s = settings()
    env = upstream.parallel_env_class()()
    rank, world = int(env.rank), int(env.world_size)
    if s.trace_dir:
        atexit.register(_write_trace_at_exit, s.trace_dir, rank)
    store = store if store is not None else upstream.job_store()
    if not s.watchdog or world < 2 or store is None:
        return None
    return watchdog.start(store, rank, world, tracer(), s.hang_timeout,
                          heartbeat_timeout=s.heartbeat_timeout)


def _write_trace_at_exit(directory: str, rank: int) -> None:
    os.makedirs(directory, exist_ok=True)
    write_chrome_trace(os.path.join(directory, f"comm_rank{rank}.json"), rank=rank)
