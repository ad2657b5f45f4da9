"""Staging host data through the pinned pool (paddle_ext.runtime.staging) with
the fake backend and a held cpu stream as the device: the "copy engine" below
reads the pinned block by address only when the test runs it, as a DMA would
after stage() returned. The block must not be handed out again before the
stream's event completed, and the values must arrive intact."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from paddle_ext.runtime import CpuStream, FakeBackend, PinnedPool, RuntimeConfig
from paddle_ext.runtime.staging import HostStager
from tests.runtime.conftest import C, KiB

_ids = iter(range(20_000, 30_000))


class FakeCopyEngine:
    """copy(pinned) -> a destination array filled later, by run(), from the pinned
    block's address (it keeps no reference to the array, like a DMA engine)."""

    def __init__(self) -> None:
        self.queued: list[tuple[int, int, np.ndarray]] = []
        self.sources: list[int] = []

    def copy(self, pinned: np.ndarray) -> np.ndarray:
        dst = np.empty_like(pinned)
        self.queued.append((pinned.ctypes.data, pinned.nbytes, dst))
        self.sources.append(pinned.ctypes.data)
        return dst

    def run(self) -> None:
        for src, nbytes, dst in self.queued:
            ctypes.memmove(dst.ctypes.data, src, nbytes)
        self.queued.clear()


@pytest.fixture
def device():
    stream = CpuStream(next(_ids))
    yield stream
    C.cpu_stream_release(stream.id)


def make_stager(stream: CpuStream) -> tuple[HostStager, FakeCopyEngine, PinnedPool]:
    pool = PinnedPool(FakeBackend(), config=RuntimeConfig(), chunk_size=64 * KiB)
    engine = FakeCopyEngine()
    return HostStager(pool, engine.copy, lambda: stream), engine, pool


def test_a_block_is_not_reused_before_its_copy_completed_and_values_arrive_intact(device):
    stager, engine, pool = make_stager(device)
    device.hold()  # the copies are enqueued, not run
    first = np.arange(1024, dtype=np.float32)
    second = -np.arange(1024, dtype=np.float32)
    out1 = stager.stage(first)
    out2 = stager.stage(second)  # out1's block was freed at once, but is pending
    assert engine.sources[1] != engine.sources[0]
    s = pool.stats()
    assert (s.pending_blocks, s.allocated_blocks, s.events_recorded) == (2, 0, 2)
    engine.run()       # the device reads both blocks ...
    device.release()   # ... and the stream passes the recorded events
    np.testing.assert_array_equal(out1, first)
    np.testing.assert_array_equal(out2, second)
    out3 = stager.stage(np.ones(1024, np.float32))  # polled on allocate: the first block is back
    assert engine.sources[2] == engine.sources[0]
    engine.run()
    np.testing.assert_array_equal(out3, np.ones(1024, np.float32))
    assert (stager.staged, stager.staged_bytes) == (3, 3 * 4 * KiB)


def test_without_the_event_the_block_would_have_been_overwritten(device):
    """The reference for the test above: the same sequence with the event left out
    reuses the block at once and the first copy reads the second's values."""
    pool = PinnedPool(FakeBackend(), config=RuntimeConfig(), chunk_size=64 * KiB)
    engine = FakeCopyEngine()
    first, second = np.full(256, 1.0, np.float32), np.full(256, 2.0, np.float32)
    outs = []
    for host in (first, second):
        pinned = pool.copy_of(host)
        outs.append(engine.copy(pinned))
        del pinned
    assert engine.sources[0] == engine.sources[1]
    engine.run()
    np.testing.assert_array_equal(outs[0], second)  # corrupted: why stage() records the event


def test_stage_tree_stages_accepted_leaves_of_nested_containers(device):
    stager, engine, _ = make_stager(device)
    tree = (np.zeros(4, np.int64), {"mask": np.ones(3, np.bool_), "n": 5}, [np.arange(2.0)], None)
    device.hold()  # an unheld cpu stream completes at once: the engine would have to copy then
    out = stager.stage_tree(tree)
    engine.run()
    device.release()
    assert out[1]["n"] == 5 and out[3] is None
    np.testing.assert_array_equal(out[0], tree[0])
    np.testing.assert_array_equal(out[1]["mask"], tree[1]["mask"])
    np.testing.assert_array_equal(out[2][0], tree[2][0])
    assert stager.staged == 3


def test_stager_argument_errors():
    pool = PinnedPool(FakeBackend(), config=RuntimeConfig())
    with pytest.raises(TypeError, match="pool must be a PinnedPool, got str"):
        HostStager("pool", lambda a: a, lambda: None)
    with pytest.raises(TypeError, match="copy must be callable, got int"):
        HostStager(pool, 3, lambda: None)


def test_micro_batches_on_cpu_stage_nothing_and_take_an_explicit_stager(device):
    paddle = pytest.importorskip("paddle")
    from paddle_ext.pipeline.microbatch import MicroBatches

    x = paddle.arange(24, dtype="float32").reshape([6, 4])
    y = paddle.arange(6, dtype="int64")
    plain = MicroBatches([x, y], count=3, size=2)
    assert paddle.get_device() == "cpu" and plain.stager is None  # CPU: no staging, no pool
    np.testing.assert_array_equal(plain.inputs(1).numpy(), x.numpy()[2:4])

    pool = PinnedPool(FakeBackend(), config=RuntimeConfig(), chunk_size=64 * KiB)
    copies = []

    def copy(pinned: np.ndarray):
        copies.append(pinned.ctypes.data)
        return paddle.to_tensor(pinned.copy())  # a synchronous stand-in for the device copy

    stager = HostStager(pool, copy, lambda: device, accept=lambda t: isinstance(t, paddle.Tensor))
    staged = MicroBatches([(x, {"y": y}), y], count=3, size=2, stager=stager)
    inputs = staged.inputs(2)
    np.testing.assert_array_equal(inputs[0].numpy(), x.numpy()[4:6])
    np.testing.assert_array_equal(inputs[1]["y"].numpy(), y.numpy()[4:6])
    np.testing.assert_array_equal(staged.labels(0).numpy(), y.numpy()[0:2])
    assert len(copies) == 3 and pool.stats().events_recorded == 3
