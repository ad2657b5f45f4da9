"""DeviceEvent / paddle_ext.runtime.Event: explicit options with timing off by
default, lazy native creation (no runtime call before the first record), the
cpu state machine, and native errors mapped to DeviceError."""

from __future__ import annotations

import threading
import time

import pytest

from paddle_ext.runtime import CpuStream, DeviceError, Event, stream_handle
from tests.runtime.conftest import C

BUILT = C.build_info()["backends"]
DEVICE_BACKENDS = [b for b in ("cuda", "hip", "xpu") if b in BUILT]

# cudaEvent* bit values, shared by the cpu and hip backends.
BLOCKING_SYNC, DISABLE_TIMING, INTERPROCESS = 0x1, 0x2, 0x4


def test_defaults_are_timing_free_non_blocking_and_local():
    ev = Event()
    assert ev.options == {"enable_timing": False, "blocking": False, "interprocess": False}
    assert ev.native_flags == DISABLE_TIMING
    assert Event(enable_timing=True).native_flags == 0
    assert Event(blocking=True).native_flags == DISABLE_TIMING | BLOCKING_SYNC
    assert Event(interprocess=True).native_flags == DISABLE_TIMING | INTERPROCESS


@pytest.mark.parametrize("backend", [b for b in ("cuda", "hip") if b in BUILT])
def test_gpu_events_are_created_with_disable_timing(backend):
    assert C.DeviceEvent(backend).native_flags == DISABLE_TIMING  # cudaEventDisableTiming / hipEventDisableTiming
    assert C.DeviceEvent(backend, enable_timing=True, blocking=True).native_flags == BLOCKING_SYNC


def test_interprocess_needs_timing_off():
    with pytest.raises(ValueError, match=r"interprocess=True needs enable_timing=False \(got enable_timing=True\)"):
        Event(interprocess=True, enable_timing=True)


@pytest.mark.parametrize("backend", ["cpu", *DEVICE_BACKENDS])
def test_construction_makes_no_runtime_call(backend):
    before = C.event_backend_calls(backend)
    events = [C.DeviceEvent(backend, device=d, enable_timing=t) for d in (-1, 0) for t in (False, True)]
    assert C.event_backend_calls(backend) == before
    assert not any(e.created for e in events)
    assert all(e.query() for e in events)  # never recorded: complete, still no call
    for e in events:
        e.synchronize()
        e.wait(0)
    assert C.event_backend_calls(backend) == before
    del events
    assert C.event_backend_calls(backend) == before  # nothing to destroy either


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_recording_without_a_device_raises_the_mapped_native_error(backend):
    ev = C.DeviceEvent(backend)
    with pytest.raises(DeviceError) as err:
        ev.record(0)
    e = err.value
    assert e.backend == backend and isinstance(e, RuntimeError)
    expected_prefix = {"cuda": "cudaError", "hip": "hipError", "xpu": "XPU"}[backend]
    assert e.name.startswith(expected_prefix) and e.code != 0
    assert str(e).startswith(f"{backend} error {e.name} ({e.code}): ")
    assert not ev.created


@pytest.mark.parametrize("backend", [b for b in ("cuda", "hip") if b in BUILT])
def test_pinned_host_backend_reports_the_missing_device(backend):
    pool = C.HostAllocator(C.make_host_backend(backend))
    with pytest.raises(DeviceError) as err:
        pool.allocate(4096)
    assert err.value.backend == backend and err.value.name.startswith(backend + "Error")
    assert C.unavailable_reason(backend).startswith(f"{backend} error ")


def test_cpu_event_follows_its_stream():
    s = CpuStream(20_001)
    s.hold()
    try:
        ev = Event("cpu")
        ev.record(s)
        assert ev.created and not ev.query() and s.outstanding == 1
        s.step(1)
        assert ev.query() and s.outstanding == 0
        ev.record(s)  # re-recording captures the new submission
        assert not ev.query()
    finally:
        s.release()
    assert ev.query()


def test_synchronize_blocks_until_another_thread_completes_the_stream():
    s = CpuStream(20_002)
    s.hold()
    ev = Event()
    ev.record(s)
    timer = threading.Timer(0.2, s.release)
    timer.start()
    start = time.perf_counter()
    ev.synchronize()
    assert time.perf_counter() - start >= 0.15 and ev.query()
    timer.join()


def test_wait_orders_one_stream_after_another():
    producer, consumer = CpuStream(20_003), CpuStream(20_004)
    producer.hold()
    try:
        ready = Event()
        ready.record(producer)
        ready.wait(consumer)  # consumer's later work waits for the producer
        after = Event()
        after.record(consumer)
        assert not after.query()
        producer.release()
        assert after.query()
    finally:
        producer.release()


def test_elapsed_time_needs_timing_on_both_events():
    a, b = Event(), Event()
    a.record()
    b.record()
    with pytest.raises(ValueError, match="needs enable_timing=True on both events; got start enable_timing=False"):
        a.elapsed_time(b)
    t0, t1 = Event(enable_timing=True), Event(enable_timing=True)
    with pytest.raises(ValueError, match="the start event was never recorded"):
        t0.elapsed_time(t1)
    t0.record()
    time.sleep(0.02)
    t1.record()
    assert 10.0 <= t0.elapsed_time(t1) < 1000.0


@pytest.mark.parametrize("device, expected", [("cpu", ("cpu", -1)), ("cuda:1", ("cuda", 1)), ("xpu:0", ("xpu", 0))])
def test_device_strings(device, expected):
    from paddle_ext.runtime.event import resolve_device

    assert resolve_device(device) == expected


@pytest.mark.parametrize("device, error, message", [
    ("tpu", ValueError, r"device must be one of \['cpu', 'cuda', 'hip', 'xpu', 'gpu'\] \(optionally ':N'\), got 'tpu'"),
    ("gpu:x", ValueError, "device index must be a non-negative int, got 'gpu:x'"),
    (3, TypeError, "device must be a string"),
])
def test_bad_devices_are_named(device, error, message):
    with pytest.raises(error, match=message):
        Event(device)


def test_bad_options_are_named():
    with pytest.raises(TypeError, match="enable_timing must be True or False, got 1"):
        Event(enable_timing=1)
    with pytest.raises(ValueError, match="device_id must be an int >= -1"):
        Event(device_id=-3)


def test_stream_handles():
    class PaddleLikeStream:
        cuda_stream = 0x5555

    assert stream_handle(None) == 0
    assert stream_handle(7) == 7
    assert stream_handle(CpuStream(9)) == 9
    assert stream_handle(PaddleLikeStream()) == 0x5555

    class PaddleDeviceStream:  # paddle.device.Stream: the handle is on its core stream
        stream_base = PaddleLikeStream()

    assert stream_handle(PaddleDeviceStream()) == 0x5555
    with pytest.raises(TypeError, match="stream must be None, an int handle, a CpuStream or a Paddle stream"):
        stream_handle("s")
    with pytest.raises(ValueError, match="non-negative"):
        stream_handle(-1)


def test_unknown_event_backend_lists_the_built_ones():
    with pytest.raises(ValueError, match="event backend 'tpu' is not in this build; built: cpu"):
        C.DeviceEvent("tpu")
