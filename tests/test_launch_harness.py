"""The multi-process harness (tests/multiproc/launch.py) runs a job again only when its
job store lost the port the launcher chose for it, or when a rank crashed after its
script and every exit handler returned (once, with a warning); never for a failure of
the job."""

import os
import re
import shutil
import signal
import time
import warnings

import pytest

from tests.multiproc.launch import (
    FINISHED_MARK,
    MASTER_LINE,
    LaunchResult,
    crashed_rank,
    exit_crash,
    launch,
    launcher_port_range,
    lost_master_port,
)

LAUNCHER = ("LAUNCH INFO ------------------------- ERROR LOG DETAIL -------------------------\n"
            "{'PADDLE_MASTER': '127.0.0.1:46022', 'PADDLE_GLOBAL_RANK': '0'}\n")
BIND_FAILED = ("ValueError: (InvalidArgument) Bind network on IP_ANY:46022 failed.\n"
               "  [Hint: Expected sockfd > 0, but received sockfd:-1 <= 0:0.]\n")


def result(rc: int, rank0: str, output: str = LAUNCHER, timed_out: bool = False) -> LaunchResult:
    return LaunchResult(rc, 5.4, output, {0: rank0, 1: "Retry to connect to 127.0.0.1:46022"}, timed_out)


LIBUV_ABORTED = ("I1206 23:08:20.773634  8037 tcp_store.cc:336] create libuv server at port: 46022\n"
                 "python: /paddle/third_party/libuv/src/unix/core.c:314: uv__finish_close: Assertion "
                 "`handle->flags & UV_HANDLE_CLOSING' failed.\n")


def test_the_job_store_that_lost_its_port_is_named():
    assert lost_master_port(result(1, BIND_FAILED)) == 46022
    assert lost_master_port(result(1, "OSError: [Errno 98] Address already in use: 127.0.0.1:46022")) == 46022
    assert lost_master_port(result(250, LIBUV_ABORTED)) == 46022  # 3.x: the libuv server's constructor failed
    # the launcher's report names no master: the rank's first line (_rank_entry.py) does
    quiet = "LAUNCH INFO Exit code -6\n"
    assert lost_master_port(result(250, LIBUV_ABORTED, output=quiet)) is None
    assert lost_master_port(result(250, f"{MASTER_LINE}127.0.0.1:46022\n" + LIBUV_ABORTED, output=quiet)) == 46022


def test_the_launcher_picks_ports_below_the_ephemeral_range(tmp_path):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    assert launcher_port_range(str(ranges)) == {"PORT_RANGE": "20767:32767"}
    ranges.write_text("1024\t65535\n")
    assert launcher_port_range(str(ranges)) == {}  # no room below: the launcher's default
    assert launcher_port_range(str(tmp_path / "missing")) == {}


def test_a_libuv_abort_names_the_job_store_only_when_it_follows_that_stores_creation():
    other = LIBUV_ABORTED.replace("46022", "46023")  # a group store's server (another port)
    assert lost_master_port(result(250, other)) is None
    later = LIBUV_ABORTED.replace("\npython:", "\nI1206 create libuv server at port: 46023\npython:")
    assert lost_master_port(result(250, later)) is None
    assert lost_master_port(result(250, "create libuv server at port: 46022\nran for an hour\n" * 2
                                   + "AssertionError: grads differ\n")) is None


def test_a_taken_port_aborts_this_paddles_job_store_as_the_harness_expects():
    # the signature above, measured on the Paddle at hand (2.6: its own text, also matched)
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = f"from paddle.base import core; core.TCPStore('127.0.0.1', {port}, True, 2, 5)"
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    launcher = LAUNCHER.replace("46022", str(port))
    assert lost_master_port(result(run.returncode, run.stdout + run.stderr, output=launcher)) == port, run.stderr[-2000:]


def test_any_other_failure_is_the_jobs():
    assert lost_master_port(result(0, BIND_FAILED)) is None  # it ran
    assert lost_master_port(result(1, BIND_FAILED, timed_out=True)) is None
    assert lost_master_port(result(1, BIND_FAILED.replace("46022", "46023"))) is None  # another port: a gloo pair's
    assert lost_master_port(result(1, "AssertionError: grads differ")) is None
    assert lost_master_port(result(1, BIND_FAILED, output="LAUNCH INFO Exit code 1\n")) is None  # no master named


def failed(rank: int, code: int) -> str:
    return (f"LAUNCH ERROR Container failed !!!\nContainer rank {rank} status failed cmd ['python', '-u', "
            f"'_rank_entry.py'] code {code} log log/workerlog.{rank}\nLAUNCH INFO Exit code {code}\n")


def crashed(rc: int, output: str, rank1: str, timed_out: bool = False) -> LaunchResult:
    return LaunchResult(rc, 5.4, output, {0: f"done\n{FINISHED_MARK}\n", 1: rank1}, timed_out)


def test_a_crash_signal_after_the_mark_is_an_exit_crash_of_that_rank():
    res = crashed(245, failed(1, -11), f"done\n{FINISHED_MARK}\n")
    assert crashed_rank(res) == (1, signal.SIGSEGV) and exit_crash(res)
    res = crashed(250, failed(1, -6), f"done\n{FINISHED_MARK}\n")
    assert crashed_rank(res) == (1, signal.SIGABRT) and exit_crash(res)
    assert exit_crash(crashed(245, failed(0, -11), "done\n"))  # rank 0 finished; it is the one that crashed


def test_a_crash_before_the_mark_or_another_ending_is_the_jobs():
    res = crashed(245, failed(1, -11), "done\n")  # died in the script or an exit handler
    assert crashed_rank(res) == (1, signal.SIGSEGV) and not exit_crash(res)
    for res in (crashed(241, failed(1, -15), f"{FINISHED_MARK}\n"),  # terminated: not a crash
                crashed(1, failed(1, 1), f"{FINISHED_MARK}\n"),  # the script's exit code
                crashed(245, failed(1, -11), f"{FINISHED_MARK}\n", timed_out=True),
                crashed(245, "LAUNCH INFO Exit code -11\n", f"{FINISHED_MARK}\n")):  # no rank named
        assert crashed_rank(res) is None and not exit_crash(res), res.output


def _cores_here() -> bool:
    with open("/proc/sys/kernel/core_pattern") as f:
        return f.read().strip() in ("core", "core.%p") and shutil.which("gdb") is not None


def test_a_rank_crashing_in_teardown_is_launched_again_once_with_its_stack(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = launch("exit_crash.py", str(tmp_path), "teardown", timeout=60)
    assert res.returncode == 0, res.describe()
    assert os.path.exists(tmp_path / "crashed")  # the first launch crashed, the second did not
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "rank 1 died of SIGSEGV after its script and exit handlers returned" in messages[0]
    if _cores_here():
        assert "kill" in messages[0] and "Py_FinalizeEx" in messages[0], messages[0]


def test_a_rank_crashing_in_its_script_fails_the_launch(tmp_path, monkeypatch):
    # A core file of another job in the caller's working directory (CI's legs share the
    # tree root), newer than this launch: the harness neither reads nor removes it.
    other_job = tmp_path / "cwd" / "core"
    other_job.parent.mkdir()
    other_job.write_bytes(b"\x7fELF not a core of this launch")
    os.utime(other_job, (time.time() + 3600, time.time() + 3600))
    monkeypatch.chdir(other_job.parent)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = launch("exit_crash.py", str(tmp_path), "script", timeout=60)
    assert other_job.read_bytes() == b"\x7fELF not a core of this launch"
    assert os.listdir(other_job.parent) == ["core"]  # the ranks ran in the launch's own folder
    assert res.returncode != 0 and not res.timed_out, res.describe()
    assert FINISHED_MARK not in res.logs[1] and FINISHED_MARK in res.logs[0]
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]
    masters = {int(m) for m in re.findall(rf"^{re.escape(MASTER_LINE)}[^:\s]*:(\d+)$", res.all_text(), re.MULTILINE)}
    assert len(masters) == 1, res.describe()  # every rank names the job store's address first
    span = launcher_port_range().get("PORT_RANGE")
    if span:  # the launcher chose it below the ephemeral range
        low, high = map(int, span.split(":"))
        assert low <= masters.pop() <= high, span
    if _cores_here():  # the crash's stack comes with the failure, its core file is gone
        assert "kill" in res.crash_stack and "main" in res.crash_stack, res.crash_stack
        assert res.crash_stack in res.describe()


@pytest.fixture(autouse=True)
def _no_core_left_behind():
    before = set(os.listdir("."))
    yield
    assert not [p for p in set(os.listdir(".")) - before if p == "core" or p.startswith("core.")]
