"""The logic of tests/runtime/gpu_check.py stream-reuse, run here on the posix
pool and the cpu event backend, so that a GPU session's few minutes are not
spent finding a broken script. The device is played by FakeCudart: its streams
are CpuStreams, a host function holds its stream until the function returns,
and copies run in stream order when their stream drains (after its gate, or at
cudaStreamSynchronize). On the GPU the same function runs on real cudart
streams (tests/gpu/device_check.sh)."""

from __future__ import annotations

import ctypes
import gc
import threading
import weakref

import pytest

from paddle_ext.runtime import CpuStream
from tests.runtime import gpu_check


class FakeCudart:
    """The cudart calls stream_reuse makes. hold_streams=False: a host function
    holds nothing (a runtime that ignores stream order)."""

    def __init__(self, hold_streams: bool = True) -> None:
        self.hold_streams = hold_streams
        self.queues: dict[int, list] = {}
        self.gates: dict[int, threading.Thread] = {}
        self.buffers: list = []
        self.lock = threading.Lock()
        self.next_stream = 7000

    def _drain(self, stream: int) -> None:
        with self.lock:
            ops, self.queues[stream] = self.queues[stream], []
        for op in ops:
            op()

    def cudaStreamCreateWithFlags(self, ref, flags):  # noqa: N802 - cudart's names
        self.next_stream += 1
        ref._obj.value = self.next_stream
        self.queues[self.next_stream] = []
        return 0

    def cudaStreamDestroy(self, stream):  # noqa: N802
        self.cudaStreamSynchronize(stream)
        return 0

    def cudaMalloc(self, ref, nbytes):  # noqa: N802
        buf = ctypes.create_string_buffer(nbytes)
        self.buffers.append(buf)
        ref._obj.value = ctypes.addressof(buf)
        return 0

    def cudaFree(self, ptr):  # noqa: N802
        return 0

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):  # noqa: N802
        with self.lock:
            self.queues[stream].append(lambda: ctypes.memmove(dst, src, nbytes))
        return 0

    def cudaStreamSynchronize(self, stream):  # noqa: N802
        gate = self.gates.pop(stream, None)
        if gate is not None:
            gate.join(30)
        self._drain(stream)
        return 0

    def cudaLaunchHostFunc(self, stream, fn, data):  # noqa: N802
        callback = gpu_check.HOST_FN(fn.value)
        if not self.hold_streams:  # the function runs beside the stream, which goes on
            threading.Thread(target=callback, args=(None,), daemon=True).start()
            return 0
        CpuStream(stream).hold()

        def run() -> None:
            callback(None)  # returns when the test opens the gate
            self._drain(stream)
            CpuStream(stream).release()

        self.gates[stream] = threading.Thread(target=run, daemon=True)
        self.gates[stream].start()
        return 0


def test_stream_reuse_logic_passes_when_streams_keep_order():
    results = gpu_check.stream_reuse(nbytes=1 << 20, backend="posix", rt=FakeCudart())
    assert results["gated"] == {"pending_before_gate": True, "complete_after": True, "reused": False,
                                "copied": [7]}
    # the reference: without record_event the block comes back and the held copy sends the overwrite
    assert results["ungated"]["reused"] is True and results["ungated"]["copied"] == [9]
    assert "enable_timing=True" in results["timing_free_elapsed"]


def test_stream_reuse_logic_fails_when_the_stream_does_not_wait(capsys):
    # A host function that holds nothing: the event completes at once, the pool reuses
    # the block with record_event too, and the check must say so.
    with pytest.raises(SystemExit) as err:
        gpu_check.stream_reuse(nbytes=1 << 20, backend="posix", rt=FakeCudart(hold_streams=False))
    assert err.value.code == 1
    out = capsys.readouterr().out
    assert "the event completed while the stream was held" in out
    assert "with record_event: reused True" in out


def test_a_gates_host_function_outlives_the_gate(monkeypatch):
    # The stream's thread returns through the host function's trampoline after the
    # gate opened, possibly after the gate is gone (the next gate replaces it);
    # freed, that was a SIGSEGV in that thread (CI: the test above, under load).
    made = []
    real = gpu_check.HOST_FN

    def recording_host_fn(fn):
        host_fn = real(fn)
        made.append(weakref.ref(host_fn))
        return host_fn

    monkeypatch.setattr(gpu_check, "HOST_FN", recording_host_fn)

    class AddressOnly:  # what CUDA keeps of the function: its address
        def cudaLaunchHostFunc(self, stream, fn, data):
            self.address = fn.value
            return 0

    gate = gpu_check.StreamGate(AddressOnly(), 1)
    gate.open()
    del gate
    gc.collect()
    assert len(made) == 1 and made[0]() is not None
