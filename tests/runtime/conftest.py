"""Fixtures of the runtime tests: pools over the fake backend and private cpu streams.

The tests drive the C++ allocator through paddle_ext._C (pytest-driven unit
tests of csrc/runtime); none of them needs Paddle or the op library.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterator

import pytest

C = pytest.importorskip("paddle_ext._C", reason="paddle_ext._C is not built")

KiB, MiB = 1 << 10, 1 << 20
_stream_ids = itertools.count(10_000)


@pytest.fixture
def make_pool() -> Iterator[Callable[..., tuple]]:
    """make_pool(capacity=None, granularity=4096, base_alignment=4096, **allocator options)
    -> (HostAllocator, FakeBackend). Every pool is checked for broken invariants at teardown."""
    made = []

    def make(capacity: int | None = None, granularity: int = 4096, base_alignment: int = 4096, **options):
        backend = C.FakeBackend(capacity=capacity, granularity=granularity, base_alignment=base_alignment)
        options.setdefault("chunk_size", 1 * MiB)
        pool = C.HostAllocator(backend, **options)
        made.append(pool)
        return pool, backend

    yield make
    for pool in made:
        pool.check_invariants()


@pytest.fixture
def stream() -> Iterator[Callable[[], int]]:
    """stream() -> a fresh cpu stream id; every stream handed out is released at teardown
    (a pool destroyed while its stream is held would wait for it forever)."""
    handed = []

    def new() -> int:
        sid = next(_stream_ids)
        handed.append(sid)
        return sid

    yield new
    for sid in handed:
        C.cpu_stream_release(sid)


def layout(pool) -> list[tuple[int, int, str]]:
    """(offset from the chunk's first block, size, state) per block, chunk by chunk."""
    out, starts = [], {}
    for chunk, ptr, size, state in pool.blocks():
        starts.setdefault(chunk, ptr)
        out.append((chunk, ptr - starts[chunk], size, state))
    return out
