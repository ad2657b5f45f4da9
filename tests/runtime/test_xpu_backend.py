"""The xpu backend against a stand-in libxpurt.so (csrc/tools/fake_xpurt.cc,
the XPU compile leg's fake runtime) loaded through PADDLE_EXT_XPURT: the
dlopen path, pinned host memory from xpu_host_alloc, XRE events with their
options recorded but ignored, and unsupported timing as a mapped DeviceError.
Runs in a child process because the loader reads the variable once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.runtime.conftest import C

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE = os.path.join(ROOT, "csrc", "tools", "fake_xpurt.cc")

pytestmark = pytest.mark.skipif("xpu" not in C.build_info()["backends"] or not os.path.exists(FAKE)
                                or shutil.which("g++") is None,
                                reason="needs the xpu backend, csrc/tools/fake_xpurt.cc and g++")

CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from paddle_ext import _C
    from paddle_ext.runtime import DeviceError, Event, PinnedPool, RuntimeConfig
    out = {"reason": _C.unavailable_reason("xpu")}
    pool = PinnedPool("xpu", config=RuntimeConfig(), chunk_size=1 << 20, alignment=4096)
    x = pool.empty(1000, "float32")
    x[:] = 1.5
    out["aligned"] = x.ctypes.data % 4096 == 0
    out["recorded"] = pool.record_event(x, 0)
    del x
    out["returned"] = pool.poll()
    out["stats"] = pool.stats().as_dict()
    ev = Event("xpu", blocking=True)
    out["created_before"] = ev.created
    ev.record(0)
    out["created_after"] = ev.created
    out["query"] = ev.query()
    out["flags"] = ev.native_flags
    timed = Event("xpu", enable_timing=True)
    timed.record(0)
    try:
        timed.elapsed_time(timed)
    except DeviceError as e:
        out["elapsed"] = [e.code, e.name]
    print(json.dumps(out))
""")


def test_xpu_backend_through_the_stand_in_runtime(tmp_path):
    lib = tmp_path / "libxpurt.so"
    subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", f"-I{ROOT}/csrc/include", FAKE, "-o", str(lib)],
                   check=True, timeout=120)
    env = {**os.environ, "PADDLE_EXT_XPURT": str(lib), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, ROOT], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["reason"] == ""  # one stand-in device
    assert out["aligned"] and out["recorded"] and out["returned"] == 1
    s = out["stats"]
    assert (s["allocated_bytes"], s["events_recorded"], s["events_completed"]) == (0, 1, 1)
    assert (out["created_before"], out["created_after"], out["query"], out["flags"]) == (False, True, True, 0)
    assert out["elapsed"] == [712, "XPUERR_NOSUPPORT"]


def test_xpu_without_a_runtime_is_a_named_device_error():
    from paddle_ext.runtime import DeviceError

    if C.unavailable_reason("xpu") == "":
        pytest.skip("an XPU runtime is installed here")
    pool = C.HostAllocator(C.make_host_backend("xpu"))
    with pytest.raises(DeviceError) as err:
        pool.allocate(10)
    assert (err.value.backend, err.value.code, err.value.name) == ("xpu", -1, "XPU_RUNTIME_NOT_FOUND")
    assert "libxpurt.so" in str(err.value)
