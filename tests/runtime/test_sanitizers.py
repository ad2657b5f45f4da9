"""The multithread stress (tests/runtime/native/stress.cc: 50 threads x 50
random sizes x 10 allocations on one pool, with out-of-memory retries, gated
frees and a thread calling empty_cache) under ThreadSanitizer and under
AddressSanitizer + UBSan. The binaries are cached in build/sanitizers and
rebuilt only when the runtime's sources change (about 20 s each on 2 cores);
PADDLE_EXT_SKIP_SANITIZERS=1 skips them."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "runtime", "native", "run_sanitized.sh")
CXX = os.environ.get("CXX", "g++")


def sanitizer_works(flag: str) -> bool:
    if shutil.which(CXX) is None:
        return False
    probe = subprocess.run([CXX, f"-fsanitize={flag}", "-x", "c++", "-", "-o", os.devnull],
                           input="int main() { return 0; }\n", capture_output=True, text=True)
    return probe.returncode == 0


@pytest.mark.skipif(os.environ.get("PADDLE_EXT_SKIP_SANITIZERS") == "1", reason="PADDLE_EXT_SKIP_SANITIZERS=1")
@pytest.mark.parametrize("kind, flag", [("tsan", "thread"), ("asan", "address,undefined")])
def test_stress_is_clean_under_sanitizer(kind, flag):
    if not sanitizer_works(flag):
        pytest.skip(f"{CXX} cannot link -fsanitize={flag} here")
    proc = subprocess.run(["bash", SCRIPT, kind, os.path.join(ROOT, "build", "sanitizers")],
                          capture_output=True, text=True, timeout=600)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report[-4000:]
    assert "pattern errors 0, stats consistent" in report
    assert "WARNING: ThreadSanitizer" not in report and "ERROR: AddressSanitizer" not in report
    assert "runtime error:" not in report  # UBSan
