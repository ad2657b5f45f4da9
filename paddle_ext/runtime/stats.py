"""PoolStats: one consistent snapshot of a pinned pool's counters."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class PoolStats:
    """Bytes are block bytes (requests rounded up to the alignment) unless named
    "requested"; reserved bytes are what the backend holds for the pool."""

    allocated_bytes: int
    peak_allocated_bytes: int
    requested_bytes: int
    peak_requested_bytes: int
    reserved_bytes: int
    peak_reserved_bytes: int
    pending_bytes: int        # freed, waiting for events recorded on streams
    allocated_blocks: int
    pending_blocks: int
    free_blocks: int
    largest_free_block: int
    chunks: int
    allocations: int
    frees: int
    cache_hits: int           # allocations served without a backend call
    growths: int
    backend_allocs: int
    backend_alloc_failures: int
    backend_frees: int
    backend_alloc_ns: int     # time spent in backend calls
    backend_free_ns: int
    oom_retries: int          # out-of-memory -> idle chunks released -> retried
    idle_chunks_released: int
    trims: int                # growths that first gave idle chunks back (trim_on_growth)
    events_recorded: int
    events_completed: int
    syncs: int

    @property
    def cached_bytes(self) -> int:
        """Reserved but not handed out (free and pending blocks, padding)."""
        return self.reserved_bytes - self.allocated_bytes

    @classmethod
    def from_native(cls, values: Mapping[str, int]) -> PoolStats:
        names = {f.name for f in dataclasses.fields(cls)}
        if set(values) != names:
            raise RuntimeError(  # the build and the package disagree: a stale _C
                f"paddle_ext._C reports stats {sorted(set(values) ^ names)} this package does not expect; "
                "reinstall paddle-ext")
        return cls(**values)

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)
