"""The posix backend: real mlock where the process may lock memory (root here),
and the documented fallback where mlock is refused, exercised in a child
process without CAP_IPC_LOCK (setpriv), whose RLIMIT_MEMLOCK (8 MiB here) is
below what it asks for."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from paddle_ext.runtime import PinnedPool, PosixBackend
from tests.runtime.conftest import C, MiB

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def locked_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmLck:"))


def can_lock() -> bool:
    return os.geteuid() == 0 or C.PosixBackend().counters()["rlimit_memlock"] < 0


@pytest.mark.skipif(not can_lock(), reason="needs root (CAP_IPC_LOCK) or an unlimited RLIMIT_MEMLOCK")
def test_memory_is_really_locked():
    pool = PinnedPool("posix", chunk_size=16 * MiB)
    before = locked_kib()
    buf = pool.allocate(1000)
    counters = pool.backend_counters()
    assert counters["locked_bytes"] == 16 * MiB and counters["mlock_failures"] == 0
    assert locked_kib() - before >= 16 * 1024
    del buf
    pool.empty_cache()
    assert locked_kib() == before and pool.backend_counters()["locked_bytes"] == 0


def test_mlock_off_maps_pageable_memory():
    pool = PinnedPool(PosixBackend(mlock="off"), chunk_size=1 * MiB)
    buf = pool.allocate(10)
    assert pool.backend_counters()["unlocked_bytes"] == 1 * MiB
    assert pool.backend_counters()["mlock_failures"] == 0
    del buf


def test_bad_mlock_mode_is_named():
    with pytest.raises(ValueError, match="mlock must be one of 'try', 'require', 'off', got 'always'"):
        PosixBackend(mlock="always")


CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    from paddle_ext.runtime import OutOfMemoryError, PinnedPool, PosixBackend
    out = {}
    pool = PinnedPool(PosixBackend(mlock="try"), chunk_size=16 << 20)
    x = pool.empty(1 << 20, np.float32)          # 4 MiB in a 16 MiB chunk: above the 8 MiB limit
    x[:] = 3.0
    y = pool.empty(1 << 24, np.uint8)            # a second chunk: warned once only
    out["try"] = dict(pool.backend_counters(), ok=bool((x == 3.0).all()))
    strict = PinnedPool(PosixBackend(mlock="require"), chunk_size=16 << 20)
    try:
        strict.allocate(12 << 20)
        out["require"] = "allocated"
    except OutOfMemoryError as e:
        out["require"] = {"code": e.code, "name": e.name, "message": str(e),
                          "oom_retries": strict.stats().oom_retries}
    small = strict.allocate(1000)                # the 16 MiB chunk is refused, the bare 4 KiB is not
    out["require_small"] = strict.backend_counters()["locked_bytes"]
    print(json.dumps(out))
""")


def _closed_to_others(paths: list) -> str | None:
    """The first folder on the way to one of `paths` that other users cannot enter, or None."""
    import stat

    for path in paths:
        folder = os.path.abspath(path)
        while True:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return folder
            parent = os.path.dirname(folder)
            if parent == folder:
                break
            folder = parent
    return None


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0,
                    reason="needs root and setpriv to start a child without CAP_IPC_LOCK")
def test_refused_mlock_falls_back_as_documented():
    limit = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    if limit == resource.RLIM_INFINITY or limit >= 12 * MiB:
        pytest.skip(f"RLIMIT_MEMLOCK {limit} B would let the child lock the memory")
    closed = _closed_to_others([ROOT, os.path.dirname(np.__file__)])
    if closed is not None:  # e.g. a checkout in a `mktemp -d` folder (mode 0700)
        pytest.skip(f"{closed} is closed to other users: the unprivileged child could not import from it")
    cmd = ["setpriv", "--bounding-set=-ipc_lock", "--reuid=65534", "--regid=65534", "--clear-groups",
           sys.executable, "-c", CHILD, ROOT]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # try: pageable memory, counted, one warning naming the errno and the limit.
    t = out["try"]
    assert t["ok"] and t["locked_bytes"] == 0 and t["unlocked_bytes"] == 32 * MiB
    assert t["mlock_failures"] == 2 and t["last_mlock_errno"] == 12 and t["rlimit_memlock"] > 0
    assert proc.stderr.count("paddle_ext: mlock of 16777216 B refused (ENOMEM") == 1
    assert "continues with pageable memory" in proc.stderr
    # require: the refusal is an out-of-memory error after the free-idle retry...
    r = out["require"]
    assert (r["code"], r["name"], r["oom_retries"]) == (12, "ENOMEM", 1)
    assert re.search(r"mlock of 12582912 B, RLIMIT_MEMLOCK \d+ B", r["message"])  # the last try: the bare request
    assert "could not grow by 16777216 B for a request of 12582912 B" in r["message"]
    # ...and a small request is still locked: the chunk is refused, the bare request fits the limit.
    assert out["require_small"] == 4096
