"""bench/pipeline_vs_torch.py's own logic, without torch or a launch: the /proc and
getrusage accounting around a step (against threads this test runs and pages it
touches), the span breakdown, the added-time and efficiency arithmetic, the ABBA
order, the warm-step check, and the report's headline from synthetic rank files."""

from __future__ import annotations

import argparse
import mmap
import os
import re
import threading
import time

import pytest

from bench import pipeline_vs_torch as bench


def burn(seconds: float) -> None:
    """Spins on this thread's CPU for `seconds` of its own CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_schedstat_is_read_from_this_thread_and_checked():
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
        on_cpu, delay = bench.schedstat_fields(f.read())
    assert on_cpu > 0 and delay >= 0
    assert bench.schedstat_fields("123 456 7\n") == (123, 456)
    with pytest.raises(ValueError, match="schedstat: expected 3 numbers, got '12'"):
        bench.schedstat_fields("12")


def test_step_accounting_splits_main_other_started_and_ended_threads():
    before = bench.Snapshot((1.0, 10, 5, 100), (0.5, 2, 1), {1: (1_000, 50), 2: (500, 0), 3: (700, 0)})
    # main +3 ms CPU and +2 ms run_delay; thread 2 (gloo) +1 ms; thread 3 ended; 4 started, +0.5 ms;
    # the process's CPU grew by 3 + 1 + 0.5 + 1.5 (thread 3 before it ended) ms
    after = bench.Snapshot((1.006, 17, 9, 130), (0.503, 4, 2),
                           {1: (3_001_000, 2_000_050), 2: (1_000_500, 0), 4: (500_000, 0)})
    names = {1: "python", 2: "gloo-3", 3: "py:comm", 4: "gloo-12"}
    got = bench.step_accounting(before, after, 1, names)
    assert got["main_cpu"] == pytest.approx(3e-3) and got["preempt"] == pytest.approx(2e-3)
    assert got["other"] == pytest.approx(3e-3)
    assert got["other_ended"] == pytest.approx(1.5e-3)
    assert got["kinds"] == {"gloo": {"count": 2, "cpu": pytest.approx(1.5e-3)}}
    assert (got["threads"], got["started"], got["ended"]) == (2, 1, 1)
    assert (got["vcs"], got["ivcs"], got["main_vcs"], got["main_ivcs"], got["minflt"]) == (7, 4, 2, 1, 30)


def test_probe_sees_thread_cpu_ended_threads_and_page_faults(monkeypatch):
    monkeypatch.setattr(threading.Thread, "start", threading.Thread.start)  # the probe wraps it: undone after
    probe = bench.StepProbe()
    stop = threading.Event()
    live = threading.Thread(target=lambda: (burn(0.03), stop.wait()), name="bench-live-7")
    probe.start()
    live.start()
    ended = threading.Thread(target=burn, args=(0.03,))
    ended.start()
    ended.join()
    pages = mmap.mmap(-1, 1024 * mmap.PAGESIZE)  # 1024 new pages, touched one by one
    pages.madvise(mmap.MADV_NOHUGEPAGE)
    for i in range(0, len(pages), mmap.PAGESIZE):
        pages[i] = 1
    time.sleep(0.05)  # the live thread's burn is done by now
    got = probe.stop(0.1)
    stop.set()
    live.join()
    pages.close()
    assert got["step"] == 0.1
    assert got["other"] >= 0.055, got  # both threads' 30 ms (the ended one's counted too)
    assert got["other_ended"] >= 0.025, got
    assert got["kinds"]["py:bench-live"]["count"] == 1 and got["kinds"]["py:bench-live"]["cpu"] >= 0.025
    assert got["started"] == 1 and got["ended"] == 0 and got["py_started"] == 2
    assert got["minflt"] >= 1000, got
    assert got["main_cpu"] < 0.05


def test_thread_kind_groups_numbered_threads():
    assert bench.thread_kind("gloo-12") == bench.thread_kind("gloo-3") == "gloo"
    assert bench.thread_kind("py:paddle_ext-p2p-rank0-to1") == "py:paddle_ext-p2p-rank-to"
    assert bench.thread_kind("pt_gloo_runloop") == "pt_gloo_runloop"


class Act:
    def __init__(self, kind: str) -> None:
        self.kind = kind


def spans_of(*rows):
    return [(i, Act(kind), start, end) for i, (kind, start, end) in enumerate(rows)]


def test_span_breakdown_on_and_off_the_compute_thread():
    is_compute, is_transfer = (lambda a: a.kind in "FB"), (lambda a: a.kind in ("S", "R"))
    # blocking: R [0, 1), F [1, 3), S [3, 3.5), gap 0.5, B [4, 7)
    blocking = spans_of(("R", 0, 1), ("F", 1, 3), ("S", 3, 3.5), ("B", 4, 7))
    got = bench.span_breakdown(blocking, is_compute, is_transfer, transfers_here=True)
    assert got == {"compute": 5, "xfer": 1.5, "xfer_off": 0.0, "transfers": 2, "waits": 0.5}
    # threads: the transfer spans overlap compute; the compute thread's gaps are its waits
    threaded = spans_of(("R", 0, 1.5), ("F", 1.5, 3), ("S", 2.9, 4.2), ("B", 4, 7))
    got = bench.span_breakdown(threaded, is_compute, is_transfer, transfers_here=False)
    assert got == {"compute": 4.5, "xfer": 0.0, "xfer_off": pytest.approx(2.8), "transfers": 2, "waits": 1}
    assert bench.engine_python(10.0, got, {"optimizer": 2.0, "loss_broadcast": 0.5}) == pytest.approx(2.0)


def test_added_time_and_efficiency():
    assert bench.added_ms(0.080, 0.120, 2) == pytest.approx(20.0)
    assert bench.efficiency(0.080, 0.120, 2) == pytest.approx(0.75)
    assert bench.added_ms(0.060, 0.120, 2) == pytest.approx(0.0)


def test_abba_order():
    assert bench.abba_order(3) == [(0, "paddle"), (0, "torch"), (1, "torch"), (1, "paddle"),
                                   (2, "paddle"), (2, "torch")]
    assert bench._runs(2) == [(0, ["paddle", "torch"]), (1, ["torch", "paddle"])]


def test_warm_check_counts_untimed_steps_from_the_first():
    steps = [0.5, 0.103, 0.101, 0.099] + [0.1] * 20  # step 0 slow; steps 1-3 within 3%
    ratios, ok = bench.warm_check(steps, 4)
    assert ratios == pytest.approx([1.03, 1.01, 0.99]) and ok
    ratios, ok = bench.warm_check([0.5, 0.1, 0.105, 0.1] + [0.1] * 20, 4)
    assert ratios[1] == pytest.approx(1.05) and not ok
    with pytest.raises(ValueError, match="warm_check needs more than 4 steps, got 4"):
        bench.warm_check([0.1] * 4, 4)


def test_rows_and_arguments_are_checked():
    assert bench.parse_rows("16,64") == [16, 64]
    for bad in ("", "16,x", "0"):
        with pytest.raises(SystemExit, match=re.escape(f"--rows = {bad!r}: expected comma-separated integers >= 1")):
            bench.parse_rows(bad)
    with pytest.raises(SystemExit):
        bench.parse_args(["--layers", "15"])


def rank_file(rank: int, step_ms: list[float], framework: str) -> dict:
    steps = []
    for ms in step_ms:
        s = {"step": ms / 1e3, "main_cpu": 0.05, "preempt": 0.002, "other": 0.004, "other_ended": 0.001,
             "threads": 3, "started": 0, "py_started": 2, "ended": 0, "kinds": {"gloo": {"count": 3, "cpu": 0.003}},
             "vcs": 40, "ivcs": 5, "main_vcs": 10, "main_ivcs": 3, "minflt": 20}
        if framework == "paddle":
            s.update(compute=0.04, xfer=0.0, xfer_off=0.01, transfers=24, waits=0.01, opt=0.005, loss=0.001,
                     sync=0.0, py=0.004)
        steps.append(s)
    return {"steps": steps, "rank": rank, "kind": "interleaved" if framework == "paddle" else "Interleaved1F1B"}


def test_report_headline_from_rank_files(capsys):
    a = argparse.Namespace(warmup=4, pp=2)
    single = {"steps": [{"step": 0.120, "minflt": 5}] * 24, "math": "AVX2"}
    # paddle: rank 1 is the slower one each step -> pipelined 80 ms, added 80 - 60 = 20 ms
    paddle = {"ranks": [rank_file(0, [200, 81, 80, 80] + [78] * 20, "paddle"),
                        rank_file(1, [210, 82, 81, 80] + [80] * 20, "paddle")], "single": single}
    # torch: pipelined 100 ms, added 40 ms
    torch = {"ranks": [rank_file(r, [300] + [100] * 23, "torch") for r in range(2)], "single": single}
    ratio = bench.report_run(16, 0, {"paddle": paddle, "torch": torch}, a)
    out = capsys.readouterr().out
    assert ratio == pytest.approx(0.5)
    assert "rows 16, run 1: engine added 20.0 ms vs torch added 40.0 ms: ratio 0.50 (target <= 0.75) met" in out
    assert "efficiency engine 75.0%, torch 60.0%" in out
    assert "steps 1-3 / steady: 1.025, 1.012, 1.000 (target each <= 1.03: met)" in out
    s = bench.summarise(paddle, a)
    assert s["ranks"][0]["added"] == pytest.approx(18.0) and s["ranks"][1]["added"] == pytest.approx(20.0)
    assert s["ranks"][0]["kinds"] == {"gloo": {"count": 3, "cpu": 0.003}}
    assert os.linesep not in bench.table("torch", s)[0]
