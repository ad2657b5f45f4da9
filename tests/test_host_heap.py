"""paddle_ext.host_heap: with freed memory kept, a step's worth of blocks allocated, filled
and freed again and again stops page-faulting; with glibc's defaults the freed top of the
heap goes back to the kernel (trim threshold 128 KiB) and every round faults it in again.
Through libc's malloc itself, which the setting governs (what Paddle's allocator asks of it
differs between releases). Each case runs in a fresh Python (the setting is per process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from paddle_ext import host_heap

ROUNDS = 20
PIECES, PIECE = 128, 64 << 10  # 8 MiB in 64 KiB blocks: each under glibc's mmap threshold
PROGRAM = f"""
import ctypes, resource
from paddle_ext import host_heap
kept = host_heap.keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def one_round():  # what a step does: many blocks made, used and freed
    blocks = [libc.malloc({PIECE}) for _ in range({PIECES})]
    for b in blocks:
        ctypes.memset(b, 1, {PIECE})
    for b in reversed(blocks):
        libc.free(b)
one_round()  # the first round grows the heap
rounds = []
for _ in range({ROUNDS}):
    before = faults()
    one_round()
    rounds.append(faults() - before)
# the median round: the kernel's own reclaim of idle pages (this VM's kdamond) may fault a
# kept block in again now and then
print(kept, {PIECES * PIECE}, sorted(rounds)[len(rounds) // 2])
"""


def run(switch: str) -> list[tuple[str, int, float]]:
    env = {**os.environ, host_heap.SWITCH: switch}
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith(("True", "False"))]
    return [(kept, int(nbytes), float(median_round)) for kept, nbytes, median_round in rows]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_kept_memory_stops_the_faults_that_glibc_defaults_take_every_round() -> None:
    default, kept = run("default"), run("keep")
    assert [k for k, _, _ in default] == ["False"] and [k for k, _, _ in kept] == ["True"]
    for (_, nbytes, faults_default), (_, _, faults_kept) in zip(default, kept):
        pages = nbytes / 4096
        assert faults_default > 0.5 * pages, (nbytes, faults_default)  # a round faults the heap in
        assert faults_kept < 0.05 * pages, (nbytes, faults_kept)       # reused: (almost) no faults


def test_a_bad_switch_is_refused_naming_the_variable_and_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(host_heap.SWITCH, "sometimes")
    monkeypatch.setattr(host_heap, "_STATE", {})
    with pytest.raises(ValueError, match=r"PADDLE_EXT_HOST_HEAP = 'sometimes' is not allowed: 'keep' or 'default'"):
        host_heap.keep_freed_memory()


WARM_PROGRAM = """
import ctypes, resource, sys
from paddle_ext import host_heap
host_heap.keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
PIECE = 64 << 10
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def made(count):
    blocks = [libc.malloc(PIECE) for _ in range(count)]
    for b in blocks:
        ctypes.memset(b, 1, PIECE)
    return blocks
def transient():  # a step's activations: 8 MiB made and freed
    for b in reversed(made(128)):
        libc.free(b)
warmer = host_heap.FirstStepWarmer()
if sys.argv[1] == "warm":
    warmer.begin()
transient()
states = made(64)  # the optimizer's first step: 4 MiB kept from now on, where activations were
warmer.end()
before = faults()
transient()  # the second step
print("faults", faults() - before, "faulted_in", warmer.faulted_in)
"""


def second_step(mode: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", WARM_PROGRAM, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    words = out.stdout.split()
    return int(words[words.index("faults") + 1]), int(words[words.index("faulted_in") + 1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_the_first_step_warmer_leaves_the_second_step_nothing_to_fault_in() -> None:
    cold, _ = second_step("cold")
    warm, faulted_in = second_step("warm")
    assert cold > 512, cold  # without it the second step grows the heap by the states' 4 MiB (1,024 pages)
    assert faulted_in >= 6 << 20, faulted_in  # the first step grew the heap by (most of) its 8 MiB
    assert warm < 0.1 * cold, (warm, cold)
