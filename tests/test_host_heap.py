"""paddle_ext.host_heap: with freed memory kept, a CPU tensor allocated, filled and freed
again and again stops page-faulting; glibc's defaults fault on every round for blocks
above its thresholds. Each case runs in a fresh Python (the setting is per process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from paddle_ext import host_heap

ROUNDS = 20
PROGRAM = f"""
import resource, sys
import paddle
from paddle_ext import host_heap
kept = host_heap.keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
# 2 MiB and 8 MiB: above glibc's starting mmap threshold; a step's gradients and activations
for size in (1 << 19, 1 << 21):
    t = paddle.empty([size], dtype="float32"); t.fill_(1.0); del t  # the first round may grow the heap
    before = faults()
    for _ in range({ROUNDS}):
        t = paddle.empty([size], dtype="float32"); t.fill_(1.0); del t
    print(kept, size * 4, (faults() - before) / {ROUNDS})
"""


def run(switch: str) -> list[tuple[str, int, float]]:
    env = {**os.environ, host_heap.SWITCH: switch}
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith(("True", "False"))]
    return [(kept, int(nbytes), float(per_round)) for kept, nbytes, per_round in rows]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_kept_memory_stops_the_faults_that_glibc_defaults_take_every_round() -> None:
    default, kept = run("default"), run("keep")
    assert [k for k, _, _ in default] == ["False", "False"] and [k for k, _, _ in kept] == ["True", "True"]
    for (_, nbytes, faults_default), (_, _, faults_kept) in zip(default, kept):
        pages = nbytes / 4096
        assert faults_default > 0.5 * pages, (nbytes, faults_default)  # every round faults the block in
        assert faults_kept < 0.05 * pages, (nbytes, faults_kept)       # reused: (almost) no faults


def test_a_bad_switch_is_refused_naming_the_variable_and_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(host_heap.SWITCH, "sometimes")
    monkeypatch.setattr(host_heap, "_STATE", {})
    with pytest.raises(ValueError, match=r"PADDLE_EXT_HOST_HEAP = 'sometimes' is not allowed: 'keep' or 'default'"):
        host_heap.keep_freed_memory()
