"""GPU check of the pinned pool and the timing-free DeviceEvent: a prepared
script for a machine with an NVIDIA GPU and paddlepaddle-gpu, not run in CI
(pytest does not collect it). Each check prints its figures next to a
reference measured in the same run.

    python tests/runtime/gpu_check.py bandwidth     # H2D copy: pool (pinned) vs pageable numpy
    python tests/runtime/gpu_check.py gated-reuse   # record_event keeps a block from reuse during an async copy
    python tests/runtime/gpu_check.py staging       # micro-batch inputs through the pool (MicroBatches on GPU):
                                                    # values intact, events recorded, time vs Paddle's own copy
    python tests/runtime/gpu_check.py overlap       # GEMM vs communication overlap, CUDA_DEVICE_MAX_CONNECTIONS=1,
                                                    # timing-free vs timing events (NCCL with >= 2 GPUs,
                                                    # else a device-to-device copy stream)
    python tests/runtime/gpu_check.py all
    python tests/runtime/gpu_check.py stream-reuse  # without Paddle: the pool's cuda backend and the timing-free
                                                    # DeviceEvent on raw cudart streams (tests/gpu/device_check.sh;
                                                    # --native-dir DIR takes the _C module built there)

Needs paddle_ext built with its cuda backend (a CUDA toolkit at build time).
The copies go through cudaMemcpyAsync from libcudart (ctypes) so that they
really are asynchronous on the stream given to record_event.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

H2D, D2D = 1, 3  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToDevice


def cudart() -> ctypes.CDLL:
    """libcudart: next to Paddle or PyTorch when importable, in a site-packages
    nvidia/cuda_runtime wheel, in the CUDA toolkit, or on the loader path."""
    roots = list(sys.path)
    for framework in ("paddle", "torch"):
        try:
            module = __import__(framework)
        except ImportError:
            continue
        roots.insert(0, os.path.dirname(module.__file__))
    candidates = [p for r in roots for p in glob.glob(os.path.join(r, "**", "libcudart.so*"), recursive=False)]
    candidates += glob.glob(os.path.join(sys.prefix, "lib", "python*", "site-packages", "nvidia", "cu*",
                                         "lib", "libcudart.so*"))
    candidates += glob.glob(os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "lib64", "libcudart.so*"))
    found = ctypes.util.find_library("cudart")
    for path in candidates + ([found] if found else []):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        p = ctypes.c_void_p
        lib.cudaMemcpyAsync.argtypes = [p, p, ctypes.c_size_t, ctypes.c_int, p]
        lib.cudaMemcpy.argtypes = [p, p, ctypes.c_size_t, ctypes.c_int]
        lib.cudaStreamSynchronize.argtypes = [p]
        lib.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(p), ctypes.c_uint]
        lib.cudaStreamDestroy.argtypes = [p]
        lib.cudaMalloc.argtypes = [ctypes.POINTER(p), ctypes.c_size_t]
        lib.cudaFree.argtypes = [p]
        lib.cudaLaunchHostFunc.argtypes = [p, p, p]
        return lib
    raise SystemExit("libcudart not found next to Paddle or PyTorch, in the CUDA toolkit or on the loader path")


def check(code: int, what: str) -> None:
    if code != 0:
        raise SystemExit(f"{what} failed with cudaError {code}")


def setup() -> tuple:
    import paddle

    from paddle_ext import runtime

    if not paddle.is_compiled_with_cuda() or paddle.device.cuda.device_count() == 0:
        raise SystemExit("needs paddlepaddle-gpu and a CUDA device")
    if "cuda" not in runtime.backends() or not runtime.backends()["cuda"]["usable"]:
        raise SystemExit(f"paddle_ext's cuda backend is not usable: {runtime.backends().get('cuda')}")
    paddle.set_device("gpu:0")
    return paddle, runtime, cudart()


def bandwidth(nbytes: int = 256 << 20, repeats: int = 10) -> dict:
    paddle, runtime, rt = setup()
    pool = runtime.PinnedPool("cuda")
    pinned = pool.empty(nbytes, np.uint8)
    pinned[:] = 1
    pageable = np.ones(nbytes, np.uint8)
    dst = paddle.empty([nbytes], dtype="uint8")
    stream = runtime.stream_handle(paddle.device.current_stream())

    def copy(src: np.ndarray) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            check(rt.cudaMemcpyAsync(dst.data_ptr(), src.ctypes.data, nbytes, H2D, stream), "cudaMemcpyAsync")
            check(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
            times.append(time.perf_counter() - start)
        return nbytes / sorted(times)[len(times) // 2] / 1e9

    out = {"pinned_GBps": copy(pinned), "pageable_GBps": copy(pageable)}
    out["ratio"] = out["pinned_GBps"] / out["pageable_GBps"]
    print(f"bandwidth: H2D {nbytes >> 20} MiB: pool (pinned) {out['pinned_GBps']:.1f} GB/s, pageable "
          f"{out['pageable_GBps']:.1f} GB/s (reference): {out['ratio']:.2f}x")
    return out


def gated_reuse(nbytes: int = 256 << 20, trials: int = 20) -> dict:
    """Free a block while an async H2D copy still reads it, reallocate at once and
    overwrite: with record_event the pool hands out another block and the copy
    arrives intact; without it (reference) the same block comes back."""
    paddle, runtime, rt = setup()
    pool = runtime.PinnedPool("cuda", max_cached_bytes=None)
    stream = paddle.device.cuda.Stream()
    handle = runtime.stream_handle(stream)
    dst = paddle.empty([nbytes], dtype="uint8")
    results = {}
    for gated in (True, False):
        same_block = corrupted = 0
        for _ in range(trials):
            src = pool.empty(nbytes, np.uint8)
            src[:] = 7
            ptr = src.ctypes.data
            check(rt.cudaMemcpyAsync(dst.data_ptr(), ptr, nbytes, H2D, handle), "cudaMemcpyAsync")
            if gated:
                assert pool.record_event(src, stream)
            del src  # freed while the copy may still read it
            again = pool.empty(nbytes, np.uint8)
            same_block += again.ctypes.data == ptr
            again[:] = 9  # would corrupt the copy if it is the same memory
            check(rt.cudaStreamSynchronize(handle), "cudaStreamSynchronize")
            corrupted += int((dst.numpy()[:: 1 << 20] != 7).any())
            del again
        results["gated" if gated else "ungated"] = {"same_block": same_block, "corrupted": corrupted}
    s = pool.stats()
    print(f"gated-reuse: with record_event: {results['gated']['same_block']}/{trials} reused while in flight, "
          f"{results['gated']['corrupted']} corrupted copies; without (reference): "
          f"{results['ungated']['same_block']}/{trials} reused, {results['ungated']['corrupted']} corrupted; "
          f"events recorded {s.events_recorded}, completed {s.events_completed}")
    if results["gated"]["same_block"] or results["gated"]["corrupted"]:
        raise SystemExit("gated reuse FAILED")
    return results


OVERLAP_CHILD = r"""
import json, os, sys, time
import paddle
from paddle_ext.runtime import Event
timing = sys.argv[1] == "timing"
distributed = int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) > 1
if distributed:
    import paddle.distributed as dist
    dist.init_parallel_env()
paddle.set_device(f"gpu:{paddle.distributed.get_rank() if distributed else 0}")
compute, comm = paddle.device.cuda.Stream(), paddle.device.cuda.Stream()
a = paddle.randn([8192, 8192]); b = paddle.randn([8192, 8192])
payload = paddle.ones([64 << 20])
scratch = paddle.empty_like(payload)

def communicate():
    if distributed:
        paddle.distributed.stream.all_reduce(payload, sync_op=False, use_calc_stream=True)
    else:
        paddle.assign(payload, output=scratch)

def gemms():
    for _ in range(8):
        paddle.matmul(a, b)

def run(do_comm, do_gemm):
    paddle.device.synchronize()
    start = time.perf_counter()
    ready = Event("cuda", enable_timing=timing)
    done = Event("cuda", enable_timing=timing)
    ready.record(paddle.device.current_stream())
    if do_comm:
        with paddle.device.stream_guard(comm):
            ready.wait(comm)
            for _ in range(4):
                communicate()
            done.record(comm)
    if do_gemm:
        with paddle.device.stream_guard(compute):
            ready.wait(compute)
            gemms()
    done.wait(paddle.device.current_stream())
    paddle.device.synchronize()
    return time.perf_counter() - start

for _ in range(2):
    run(True, True)
t_comm = min(run(True, False) for _ in range(3))
t_gemm = min(run(False, True) for _ in range(3))
t_both = min(run(True, True) for _ in range(3))
print("RESULT " + json.dumps({"comm": t_comm, "gemm": t_gemm, "both": t_both,
                              "overlap": (t_comm + t_gemm - t_both) / min(t_comm, t_gemm)}))
"""


def staging(micro_batches: int = 8, shape: tuple = (16, 4096, 1024)) -> dict:
    """MicroBatches on GPU stages host inputs through the pool (paddle_ext.runtime.staging):
    every micro-batch arrives on the device with its values, one event per tensor is
    recorded, and the time per micro-batch is printed next to Paddle's own blocking copy
    of the same host slice (reference)."""
    paddle, runtime, _ = setup()
    from paddle_ext.pipeline.microbatch import MicroBatches

    paddle.set_device("gpu:0")
    host = paddle.to_tensor(np.random.default_rng(0).standard_normal(
        (micro_batches * shape[0], *shape[1:]), dtype=np.float32), place=paddle.CPUPlace())
    labels = paddle.to_tensor(np.arange(micro_batches * shape[0]), place=paddle.CPUPlace())
    batches = MicroBatches([host, labels], count=micro_batches, size=shape[0])
    assert batches.stager is not None, "no stager on a GPU device"
    before = runtime.default_pool().stats()
    start = time.perf_counter()
    staged = [batches.inputs(mb) for mb in range(micro_batches)]
    issue = time.perf_counter() - start
    paddle.device.synchronize()
    staged_s = time.perf_counter() - start
    for mb, t in enumerate(staged):
        assert not t.place.is_cpu_place(), f"micro-batch {mb} stayed on {t.place}"
        np.testing.assert_array_equal(t.numpy(), host.numpy()[mb * shape[0]:(mb + 1) * shape[0]])
    assert np.array_equal(batches.labels(3).numpy(), labels.numpy()[3 * shape[0]:4 * shape[0]])
    after = runtime.default_pool().stats()
    start = time.perf_counter()
    for mb in range(micro_batches):
        host[mb * shape[0]:(mb + 1) * shape[0]]._copy_to(paddle.CUDAPlace(0), True)
    paddle.device.synchronize()
    plain_s = time.perf_counter() - start
    out = {"staged_s": staged_s, "issue_s": issue, "paddle_copy_s": plain_s,
           "events": after.events_recorded - before.events_recorded,
           "peak_reserved": after.peak_reserved_bytes}
    print(f"staging: {micro_batches} micro-batches of {shape}: through the pool {staged_s * 1e3:.1f} ms "
          f"(host side {issue * 1e3:.1f} ms), Paddle's blocking copy (reference) {plain_s * 1e3:.1f} ms; "
          f"{out['events']} events, pool peak reserved {after.peak_reserved_bytes >> 20} MiB")
    if out["events"] < micro_batches + 1:
        raise SystemExit("staging: fewer events than staged tensors")
    return out


def overlap() -> dict:
    import paddle

    gpus = paddle.device.cuda.device_count()
    results = {}
    for kind in ("timing-free", "timing"):
        env = {**os.environ, "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
        script = os.path.join(os.environ.get("TMPDIR", "/tmp"), "paddle_ext_overlap_child.py")
        with open(script, "w") as f:
            f.write(OVERLAP_CHILD)
        if gpus >= 2:
            log_dir = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"paddle_ext_overlap_{kind}")
            cmd = [sys.executable, "-m", "paddle.distributed.launch", "--gpus", "0,1", "--log_dir", log_dir,
                   script, "timing" if kind == "timing" else "free"]
            subprocess.run(cmd, env=env, check=True, timeout=600)
            text = open(os.path.join(log_dir, "workerlog.0")).read()
        else:
            proc = subprocess.run([sys.executable, script, "timing" if kind == "timing" else "free"], env=env,
                                  check=True, timeout=600, capture_output=True, text=True)
            text = proc.stdout
        results[kind] = json.loads(text.split("RESULT ", 1)[1].splitlines()[0])
    what = "NCCL all_reduce" if gpus >= 2 else "device-to-device copies (one GPU: no NCCL)"
    for kind, r in results.items():
        print(f"overlap: {what} with GEMMs, CUDA_DEVICE_MAX_CONNECTIONS=1, {kind} events: comm {r['comm'] * 1e3:.1f} "
              f"ms, gemm {r['gemm'] * 1e3:.1f} ms, both {r['both'] * 1e3:.1f} ms, overlap {r['overlap']:.2f}")
    return results


D2H = 2  # cudaMemcpyDeviceToHost
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# Every StreamGate's host function, for the life of the process: the thread that
# runs one (CUDA's callback thread, or a test's) returns through the function's
# ctypes trampoline after the gate opens, which may be after the gate object is
# gone (the next gate replaces it, or an error unwinds the check); a freed
# trampoline is a SIGSEGV in that thread (measured: tests/runtime/test_gpu_check_logic.py).
_HOST_FNS_IN_FLIGHT: list = []


class StreamGate:
    """Holds a raw cudart stream at a host function until open(): the work queued
    behind it is certainly still pending while the test frees and reuses memory."""

    def __init__(self, rt: ctypes.CDLL, stream: int) -> None:
        self._open = threading.Event()
        fn = HOST_FN(lambda _: self._open.wait(30.0))
        _HOST_FNS_IN_FLIGHT.append(fn)
        check(rt.cudaLaunchHostFunc(stream, ctypes.cast(fn, ctypes.c_void_p), None), "cudaLaunchHostFunc")

    def open(self) -> None:
        self._open.set()


def _native_runtime(native_dir: str | None) -> object:
    """paddle_ext.runtime, with paddle_ext._C taken from native_dir when given
    (the module device_check.sh builds with CMake for the Python at hand)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root not in sys.path:  # the source tree's package, where it is not installed (the GPU machine)
        sys.path.insert(0, root)
    import paddle_ext

    if native_dir:
        paddle_ext.__path__.insert(0, os.path.abspath(native_dir))
    from paddle_ext import runtime

    return runtime


def stream_reuse(native_dir: str | None = None, nbytes: int = 64 << 20, backend: str = "cuda",
                 rt: Any = None) -> dict:
    """Without Paddle: a pinned block that an H2D copy on a raw stream still reads
    is freed and asked for again while the stream is held at a gate. With
    record_event the pool hands out another block and the copy delivers its bytes;
    without it (reference) the same block comes back and the copy delivers the
    overwrite. The timing-free DeviceEvent on that stream: not complete while the
    gate holds it, complete after; another stream's wait() on it orders a copy
    after it on the device; elapsed_time needs timing events. Exit 77 without a
    usable cuda backend.

    backend / rt: the pool backend and the cudart stand-in; tests run the same
    logic on "posix" (whose events are the cpu backend's) with a fake runtime
    whose streams are CpuStreams (tests/runtime/test_gpu_check_logic.py)."""
    runtime = _native_runtime(native_dir)
    device = "cuda" if backend == "cuda" else "cpu"
    if backend == "cuda":
        info = runtime.backends().get("cuda")
        if info is None or not info["usable"]:
            print(f"stream-reuse: skipped: the cuda backend is {'not built' if info is None else info['reason']}")
            raise SystemExit(77)
    rt = rt if rt is not None else cudart()
    streams = [ctypes.c_void_p(), ctypes.c_void_p()]
    for st in streams:
        check(rt.cudaStreamCreateWithFlags(ctypes.byref(st), 1), "cudaStreamCreateWithFlags")  # non-blocking
    stream, other = (int(st.value) for st in streams)
    dst = ctypes.c_void_p()
    check(rt.cudaMalloc(ctypes.byref(dst), nbytes), "cudaMalloc")
    pool = runtime.PinnedPool(backend, max_cached_bytes=None)
    # Pinned, so that the read-back below is queued, not done at once (a pageable
    # one would block the host behind the gate), and from another pool.
    host = runtime.PinnedPool(backend).empty(nbytes, np.uint8)
    # Two blocks' chunks made now and cached, so that no cudaHostAlloc (which
    # may wait for the device) runs while a stream is held at the gate.
    warm = [pool.empty(nbytes, np.uint8) for _ in range(2)]
    del warm
    results: dict = {}
    failures = []
    for gated in (True, False):
        gate = StreamGate(rt, stream)
        src = pool.empty(nbytes, np.uint8)
        src[:] = 7
        ptr = src.ctypes.data
        check(rt.cudaMemcpyAsync(dst.value, ptr, nbytes, H2D, stream), "cudaMemcpyAsync")
        if gated and not pool.record_event(src, stream):
            failures.append("record_event returned False for a pool block")
        done = runtime.Event(device)  # timing-free
        done.record(stream)
        pending = not done.query()
        del src  # freed while the copy waits behind the gate
        again = pool.empty(nbytes, np.uint8)
        reused = again.ctypes.data == ptr
        again[:] = 9
        host[:] = 0
        done.wait(other)  # the read-back on `other` waits for the copy, on the device
        check(rt.cudaMemcpyAsync(host.ctypes.data, dst.value, nbytes, D2H, other), "cudaMemcpyAsync D2H")
        gate.open()
        done.synchronize()
        check(rt.cudaStreamSynchronize(other), "cudaStreamSynchronize")
        values = np.unique(host[:: 1 << 12])
        results["gated" if gated else "ungated"] = {"pending_before_gate": pending, "complete_after": done.query(),
                                                    "reused": reused, "copied": values.tolist()}
        del again
        if not pending:
            failures.append(f"{'gated' if gated else 'ungated'}: the event completed while the stream was held")
    g, u = results["gated"], results["ungated"]
    if g["reused"] or g["copied"] != [7]:
        failures.append(f"with record_event: reused {g['reused']}, copy delivered {g['copied']} (want not reused, [7])")
    if u["reused"] and u["copied"] != [9]:
        failures.append(f"reference: the block was reused but the copy delivered {u['copied']}: the gate did not hold it")
    timing_free = runtime.Event(device)
    timing_free.record(stream)
    try:  # refused by DeviceEvent before any runtime call (ValueError), not by CUDA
        timing_free.elapsed_time(timing_free)
        failures.append("elapsed_time on timing-free events did not raise")
    except ValueError as err:
        results["timing_free_elapsed"] = str(err).splitlines()[0][:80]
    start, end = runtime.Event(device, enable_timing=True), runtime.Event(device, enable_timing=True)
    start.record(stream)
    check(rt.cudaMemcpyAsync(dst.value, host.ctypes.data, nbytes, H2D, stream), "cudaMemcpyAsync")
    end.record(stream)
    end.synchronize()
    results["timing_ms"] = start.elapsed_time(end)
    if not results["timing_ms"] > 0:
        failures.append(f"timing events measured {results['timing_ms']} ms")
    stats = pool.stats()
    check(rt.cudaFree(dst.value), "cudaFree")
    for st in (stream, other):
        check(rt.cudaStreamDestroy(st), "cudaStreamDestroy")
    print(f"stream-reuse: {nbytes >> 20} MiB H2D copy held at a gate: with record_event reused {g['reused']}, copy "
          f"delivered {g['copied']}; without (reference) reused {u['reused']}, delivered {u['copied']}; timing-free "
          f"event pending {g['pending_before_gate']} while held, complete {g['complete_after']} after, wait() "
          f"ordered the read-back; elapsed_time on it raises ({results.get('timing_free_elapsed')}); timing events "
          f"{results['timing_ms']:.3f} ms; pool events recorded {stats.events_recorded}, completed "
          f"{stats.events_completed}")
    if failures:
        print("stream-reuse: FAILED: " + "; ".join(failures))
        raise SystemExit(1)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("check", choices=["bandwidth", "gated-reuse", "staging", "overlap", "stream-reuse", "all"])
    parser.add_argument("--native-dir", help="stream-reuse: a folder holding the paddle_ext._C module to use")
    args = parser.parse_args()
    if args.check == "stream-reuse":
        stream_reuse(args.native_dir)
        return
    checks = {"bandwidth": bandwidth, "gated-reuse": gated_reuse, "staging": staging, "overlap": overlap}
    for name in checks if args.check == "all" else [args.check]:
        checks[name]()


if __name__ == "__main__":
    main()
