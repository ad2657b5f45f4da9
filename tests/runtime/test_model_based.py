"""Randomized, model-based test of the allocator against a plain Python model of
the same policy (best fit by (size, address), split at the low end, merge with
free neighbours, growth by max(request, chunk size), a request above the chunk
size in a dedicated chunk that is never split and is reused whole only within
reuse_waste of the request, idle chunks trimmed before a growth that would pass
the reserved peak, optional release of idle chunks).
After every operation the pool's whole block layout, the pointer it
returned and its byte counts must equal the model's. Fixed seeds."""

from __future__ import annotations

import random

import pytest

from tests.runtime.conftest import KiB, MiB


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class Model:
    """Chunks as address-ordered lists of [ptr, size, state]."""

    def __init__(self, alignment: int, chunk_size: int, granularity: int, free_idle_chunk: bool,
                 trim_on_growth: bool, reuse_waste: float) -> None:
        self.alignment, self.chunk_size, self.granularity = alignment, chunk_size, granularity
        self.free_idle_chunk, self.trim_on_growth, self.reuse_waste = free_idle_chunk, trim_on_growth, reuse_waste
        self.peak = 0
        self.chunks: dict[int, list[list]] = {}
        self.raw: dict[int, int] = {}
        self.dedicated: set[int] = set()

    def fits(self, cid: int, size: int, need: int) -> bool:
        if cid in self.dedicated:  # taken whole, so only if it wastes little
            return need <= size <= need + int(need * self.reuse_waste)
        return size >= need

    def best_fit(self, need: int):
        fits = [(b[1], b[0], cid, i) for cid, blocks in self.chunks.items()
                for i, b in enumerate(blocks) if b[2] == "free" and self.fits(cid, b[1], need)]
        return min(fits) if fits else None

    def allocate(self, nbytes: int, observed_chunks: dict[int, int]) -> int:
        need = round_up(max(nbytes, 1), self.alignment)
        fit = self.best_fit(need)
        if fit is None:  # growth: the new chunk's address comes from the backend
            raw = round_up(max(need, self.chunk_size), self.granularity)
            if self.trim_on_growth:
                self.trim(sum(self.raw.values()) + raw - self.peak)
            new = [cid for cid in observed_chunks if cid not in self.chunks]
            assert len(new) == 1, "the pool grew while a free block fitted, or did not grow"
            cid = new[0]
            self.chunks[cid] = [[observed_chunks[cid], raw, "free"]]
            self.raw[cid] = raw
            if need > self.chunk_size:
                self.dedicated.add(cid)
            self.peak = max(self.peak, sum(self.raw.values()))
            fit = (raw, observed_chunks[cid], cid, 0)
        size, ptr, cid, i = fit
        blocks = self.chunks[cid]
        if cid in self.dedicated:
            need = size
        elif size > need:
            blocks.insert(i + 1, [ptr + need, size - need, "free"])
        blocks[i] = [ptr, need, "allocated"]
        return ptr

    def free(self, ptr: int) -> None:
        for cid, blocks in self.chunks.items():
            for i, b in enumerate(blocks):
                if b[0] == ptr:
                    b[2] = "free"
                    if i + 1 < len(blocks) and blocks[i + 1][2] == "free":
                        b[1] += blocks.pop(i + 1)[1]
                    if i > 0 and blocks[i - 1][2] == "free":
                        blocks[i - 1][1] += blocks.pop(i)[1]
                    if self.free_idle_chunk and len(blocks) == 1:
                        self.drop(cid)
                    return
        raise AssertionError(f"model: free of unknown {ptr:#x}")

    def trim(self, excess: int) -> None:
        """Idle chunks go, largest first (lowest address among equals), until `excess` bytes went."""
        idle = sorted((-self.raw[c], blocks[0][0], c) for c, blocks in self.chunks.items()
                      if len(blocks) == 1 and blocks[0][2] == "free")
        taken = 0
        for neg_size, _, cid in idle:
            if taken >= excess:
                break
            taken -= neg_size
            self.drop(cid)

    def empty_cache(self) -> None:
        for cid in [c for c, blocks in self.chunks.items() if len(blocks) == 1 and blocks[0][2] == "free"]:
            self.drop(cid)

    def drop(self, cid: int) -> None:
        del self.chunks[cid], self.raw[cid]
        self.dedicated.discard(cid)

    def allocated(self) -> int:
        return sum(b[1] for blocks in self.chunks.values() for b in blocks if b[2] == "allocated")

    def layout(self) -> list[tuple]:
        return [(cid, b[0], b[1], b[2]) for cid in sorted(self.chunks, key=lambda c: self.chunks[c][0][0])
                for b in self.chunks[cid]]


def observed_chunk_starts(pool) -> dict[int, int]:
    starts: dict[int, int] = {}
    for cid, ptr, _, _ in pool.blocks():
        starts.setdefault(cid, ptr)
    return starts


@pytest.mark.parametrize("seed, alignment, chunk_size, free_idle_chunk, trim_on_growth, reuse_waste", [
    (1, 256, 256 * KiB, False, True, 0.0625),
    (2, 256, 256 * KiB, True, True, 0.0625),
    (3, 16, 64 * KiB, False, True, 0.0625),
    (4, 4096, 1 * MiB, False, True, 0.0625),
    (5, 512, 0, False, True, 0.0625),
    (6, 256, 256 * KiB, False, False, 0.0625),
    (7, 256, 0, False, False, 0.0625),
    (8, 256, 64 * KiB, False, True, 0.0),
    (9, 256, 64 * KiB, False, True, 1.0),
    (10, 256, 0, False, True, 0.3),
])
def test_pool_matches_the_reference_model(make_pool, seed, alignment, chunk_size, free_idle_chunk, trim_on_growth,
                                          reuse_waste):
    rng = random.Random(seed)
    pool, backend = make_pool(alignment=alignment, chunk_size=chunk_size, free_idle_chunk=free_idle_chunk,
                              trim_on_growth=trim_on_growth, reuse_waste=reuse_waste, granularity=4096)
    model = Model(alignment, chunk_size, 4096, free_idle_chunk, trim_on_growth, reuse_waste)
    live: dict[int, int] = {}
    for step in range(1500):
        action = rng.random()
        if action < 0.55 or not live:
            # Mostly small, sometimes larger than a chunk.
            nbytes = int(2 ** rng.uniform(0, 19)) if rng.random() < 0.9 else rng.randint(0, 600 * KiB)
            ptr = pool.allocate(nbytes)
            expected = model.allocate(nbytes, observed_chunk_starts(pool))
            assert ptr == expected, f"step {step}: best fit chose {ptr:#x}, the model {expected:#x}"
            live[ptr] = nbytes
        elif action < 0.97:
            ptr = rng.choice(sorted(live))
            pool.free(ptr)
            model.free(ptr)
            del live[ptr]
        else:
            pool.empty_cache()
            model.empty_cache()
        assert pool.blocks() == model.layout(), f"step {step}: layouts differ"
        s = pool.stats()
        assert s["allocated_bytes"] == model.allocated()
        # Shared chunks hand out the aligned request; dedicated ones the whole chunk.
        assert s["allocated_bytes"] >= sum(round_up(max(n, 1), alignment) for n in live.values())
        assert s["requested_bytes"] == sum(live.values())
        assert s["reserved_bytes"] == sum(model.raw.values()) == backend.used
    for ptr in list(live):
        pool.free(ptr)
    pool.empty_cache()
    assert backend.used == 0
