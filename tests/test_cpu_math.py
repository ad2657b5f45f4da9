"""Paddle's MKL code path: AVX2 on AMD once paddle_ext is imported, nothing changed on
Intel, results equal to the generic path's within float32 rounding (each path runs in
its own interpreter: MKL chooses once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from paddle_ext import cpu_math, paddle_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_mkl = pytest.mark.skipif(paddle_files.mkl_library_path() is None, reason="this Paddle ships no MKL")
needs_amd_avx2 = pytest.mark.skipif(not cpu_math.wants_avx2_path(), reason="not an AMD CPU with AVX2+FMA")

# A matmul in a fresh interpreter: the operands come from a seed, the product back as JSON.
CHILD = """
import json, sys
import numpy as np
if sys.argv[1] == "paddle_ext_first":
    import paddle_ext
import paddle
if sys.argv[1] == "paddle_first":
    paddle.matmul(paddle.ones([2, 2]), paddle.ones([2, 2]))  # MKL chooses here
    import paddle_ext
from paddle_ext import cpu_math
rng = np.random.default_rng(7)
a, b = rng.standard_normal((64, 512), dtype=np.float32), rng.standard_normal((512, 96), dtype=np.float32)
out = paddle.matmul(paddle.to_tensor(a), paddle.to_tensor(b)).numpy()
print(json.dumps({"path": cpu_math.mkl_code_path(), "env": cpu_math.os.environ.get("MKL_DEBUG_CPU_TYPE"),
                  "decision": cpu_math.decision, "out": out.tolist()}))
"""


def run_child(order: str, **env: str) -> dict:
    full = {k: v for k, v in os.environ.items() if k not in ("MKL_DEBUG_CPU_TYPE", cpu_math.SWITCH)}
    full.update(env, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-W", "always", "-c", CHILD, order], env=full,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["stderr"] = proc.stderr
    return result


def reference() -> np.ndarray:
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((64, 512), dtype=np.float32), rng.standard_normal((512, 96), dtype=np.float32)
    return a.astype(np.float64) @ b.astype(np.float64), np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)


@needs_mkl
@needs_amd_avx2
def test_amd_avx2_path_equals_generic_within_float32_rounding():
    fast = run_child("paddle_ext_first")
    generic = run_child("paddle_ext_first", PADDLE_EXT_MKL_AMD="off")
    assert (fast["path"], fast["env"]) == (5, "5"), fast
    assert generic["path"] == 0 and generic["env"] is None, generic
    exact, magnitude = reference()
    # float32 dot products of length 512: error bound k * eps * sum|a||b|, both paths.
    bound = 512 * np.finfo(np.float32).eps * magnitude
    for result in (fast, generic):
        assert np.all(np.abs(np.array(result["out"]) - exact) <= bound)
    diff = np.abs(np.array(fast["out"]) - np.array(generic["out"]))
    assert np.all(diff <= 2 * bound) and diff.max() > 0  # different kernels, same product


@needs_mkl
@needs_amd_avx2
def test_a_paddle_computation_before_the_import_keeps_the_generic_path_and_warns():
    late = run_child("paddle_first")
    assert late["path"] == 0, late
    assert "too late" in late["decision"] and "import paddle_ext before paddle" in late["stderr"]


@needs_mkl
def test_environment_setting_is_kept():
    result = run_child("paddle_ext_first", MKL_DEBUG_CPU_TYPE="0")
    assert result["path"] == 0 and result["env"] == "0"
    assert result["decision"] == "MKL_DEBUG_CPU_TYPE=0 as the environment set it"


def test_intel_cpu_changes_nothing(monkeypatch):
    monkeypatch.delenv("MKL_DEBUG_CPU_TYPE", raising=False)
    monkeypatch.delenv(cpu_math.SWITCH, raising=False)
    monkeypatch.setattr(cpu_math, "cpu", lambda: ("GenuineIntel", "Intel Xeon", frozenset({"avx2", "fma", "avx512f"})))
    assert cpu_math.prefer_avx2_path() == "MKL's own choice (not an AMD CPU with AVX2 and FMA)"
    assert "MKL_DEBUG_CPU_TYPE" not in os.environ
    monkeypatch.setattr(cpu_math, "cpu", lambda: ("AuthenticAMD", "AMD Opteron", frozenset({"sse4_2", "avx"})))
    assert not cpu_math.wants_avx2_path()
