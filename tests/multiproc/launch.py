"""Runs a rank script under `python -m paddle.distributed.launch` on gloo.

Every run has a deadline; on expiry the launcher's whole process group (the
launcher and every rank) is terminated, then killed, so a hang fails the test instead
of CI, with each rank's C++ stack in its log.

A run whose job store lost its port is run again (twice at most): the launcher picks
PADDLE_MASTER's port by binding and closing a socket, and rank 0's TCPStore binds it
seconds later, after Python and Paddle start; meanwhile any process may take it (gloo's
pairs bind ephemeral ports all the time, and CI runs four chains of legs side by side),
though the harness has the launcher pick it below the ephemeral range (PORT_RANGE), where
only a process asking for that very number can.
Measured in CI: 2.6.2, "Bind network on IP_ANY:46022 failed" in fleet.init; 3.3.1, rank 0
aborted by libuv ("uv__finish_close: Assertion") in CreateOrGetGlobalTCPStore, the
libuv server's failed construction (its stack read from the core file). Nothing of the
plugin has run by then, so the retry hides no behaviour of it.

A run in which a rank died of a signal (SIGSEGV, SIGABRT, ...) after its script and
every exit handler returned (scripts/_rank_entry.py prints a mark then) is run again
once: what crashed is the interpreter's teardown or a C++ static destructor, not what
the script checks; the rerun must pass whole. Measured in CI, rarely: SIGSEGV (2.6.2,
8 ranks) and SIGABRT (3.3.1, 2 ranks) after the last line; not reproduced here (26
launches of that 8-rank job, three at a time: 208 rank exits). Each such crash is reported as a warning (in pytest's summary) with the crashed
rank's stack from its core file where the machine writes one into the working directory
(each launch has its own, a temporary folder removed after it: a core file of another job
running beside it, e.g. another CI leg's, is never read or removed).
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
RANK_ENTRY = os.path.join(SCRIPTS, "_rank_entry.py")
FINISHED_MARK = "paddle_ext-tests: the rank script and its exit handlers returned"  # _rank_entry.py's
MASTER_LINE = "paddle_ext-tests: PADDLE_MASTER="  # _rank_entry.py's first line: the job store's address


@dataclass
class LaunchResult:
    returncode: int
    elapsed: float
    output: str               # the launcher's own stdout + stderr
    logs: dict[int, str]      # rank -> workerlog text
    timed_out: bool
    crash_stack: str = ""     # a rank died of a crash signal: its stack (core_stack)

    def all_text(self) -> str:
        return self.output + "".join(self.logs.values())

    def describe(self) -> str:
        tails = "\n".join(f"--- rank {r} ---\n{text[-3000:]}" for r, text in sorted(self.logs.items()))
        stack = f"\n--- the crashed rank's stack ---\n{self.crash_stack}" if self.crash_stack else ""
        return (f"rc={self.returncode} elapsed={self.elapsed:.1f}s timed_out={self.timed_out}\n"
                f"{self.output[-2000:]}\n{tails}{stack}")


MASTER_PORT_RETRIES = 2
EXIT_CRASH_RELAUNCHES = 1
TERM_GRACE = 5.0  # seconds between SIGTERM and SIGKILL of a job past its deadline
CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE)


def launch(script: str, *args: str, nproc: int = 2, timeout: float = 120.0,
           env: dict[str, str] | None = None) -> LaunchResult:
    port_retries = crash_relaunches = 0
    while True:
        work_dir = tempfile.mkdtemp(prefix="paddle_ext_launch_")
        try:
            result = _launch_once(script, *args, nproc=nproc, timeout=timeout, env=env, work_dir=work_dir)
            crashed = crashed_rank(result)
            if crashed is not None:
                result.crash_stack = core_stack(work_dir)
        finally:  # its logs are read, and a core file (hundreds of MB) goes with it
            shutil.rmtree(work_dir, ignore_errors=True)
        port = lost_master_port(result)
        if port is not None and port_retries < MASTER_PORT_RETRIES:
            port_retries += 1
            print(f"tests.multiproc.launch: {script}: the job store's port {port} was taken before it "
                  "bound it; launching again", file=sys.stderr, flush=True)
        elif exit_crash(result) and crash_relaunches < EXIT_CRASH_RELAUNCHES:
            crash_relaunches += 1
            rank, sig = crashed
            warnings.warn(f"tests.multiproc.launch: {script} {' '.join(args)}: rank {rank} died of "
                          f"{signal.Signals(sig).name} after its script and exit handlers returned (in the "
                          "interpreter's teardown or a C++ static destructor); launching again. Its stack:\n"
                          f"{result.crash_stack}", RuntimeWarning, stacklevel=2)
        else:
            return result


def crashed_rank(result: LaunchResult) -> tuple[int, int] | None:
    """(rank, signal) when the launcher reports that a rank died of a crash signal (it
    names the first failed rank and its exit code, -signal), else None."""
    if result.returncode == 0 or result.timed_out:
        return None
    failed = re.search(r"Container rank (\d+) status \S+ cmd .*? code (-\d+)", result.output)
    if failed is None or -int(failed.group(2)) not in CRASH_SIGNALS:
        return None
    return int(failed.group(1)), -int(failed.group(2))


def exit_crash(result: LaunchResult) -> bool:
    """Whether the run failed only because a rank crashed after FINISHED_MARK: after its
    script and every exit handler returned."""
    crashed = crashed_rank(result)
    return crashed is not None and FINISHED_MARK in result.logs.get(crashed[0], "")


def core_stack(directory: str) -> str:
    """The crashed thread's stack (gdb) from the newest core file ("core" or "core.PID",
    an ELF file) in `directory`, a launch's own working directory (so no other job's
    core, e.g. a CI leg's beside it, is read), which is then removed."""
    cores = [os.path.join(directory, p) for p in os.listdir(directory) if re.fullmatch(r"core(\.\d+)?", p)]
    cores = [p for p in cores if _is_elf(p)]
    if not cores:
        with open("/proc/sys/kernel/core_pattern") as f:
            return f"no core file in {directory} (core_pattern: {f.read().strip()})"
    core = max(cores, key=os.path.getmtime)
    try:
        if shutil.which("gdb") is None:
            return f"{core}: no gdb to read it"
        out = subprocess.run(["gdb", "-batch", "-nx", "-ex", "bt 30", sys.executable, core],
                             capture_output=True, text=True, timeout=120).stdout
        frames = [line for line in out.splitlines() if line.startswith("#")]
        if len(frames) > 1 and frames[0] == frames[1]:  # gdb shows frame #0 on loading the core too
            frames = frames[1:]
        return "\n".join(frames)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{core}: {err}"
    finally:
        os.remove(core)


def _is_elf(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def lost_master_port(result: LaunchResult) -> int | None:
    """PADDLE_MASTER's port when the run failed because rank 0's job store could not bind
    it (another process took it after the launcher chose it), else None."""
    if result.returncode == 0 or result.timed_out:
        return None
    master = (re.search(r"'PADDLE_MASTER': '[^':]*:(\d+)'", result.output)  # the launcher's report
              or re.search(rf"^{re.escape(MASTER_LINE)}[^:\s]*:(\d+)$", result.all_text(), re.MULTILINE))
    if master is None:
        return None
    port = master.group(1)
    # 2.6's store: "Bind network ... failed"; 3.x's libuv server: its constructor fails
    # and its destructor trips libuv's assertion (SIGABRT), the line after "create
    # libuv server at port: P" with no other store's line between (measured: 3.3.1,
    # a master TCPStore on a port another socket listens on).
    bind_failed = re.compile(rf"Bind network on IP_ANY:{port} failed|address already in use[^\n]*:{port}\b"
                             rf"|create libuv server at port: {port}\n(?:(?![^\n]*create libuv server)[^\n]*\n){{0,3}}"
                             r"[^\n]*uv__finish_close: Assertion", re.IGNORECASE)
    return int(port) if bind_failed.search(result.all_text()) else None


def launcher_port_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> dict[str, str]:
    """PORT_RANGE for the launcher (every Paddle release reads it; default 35100:64000):
    the 12000 ports below the kernel's ephemeral range, where no port-0 bind (gloo's
    pairs, any process's outgoing connection) can take the job store's port between the
    launcher's choice and rank 0's bind. {} where that range leaves no room."""
    try:
        with open(path) as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return {}
    return {"PORT_RANGE": f"{low - 12001}:{low - 1}"} if low > 13000 else {}


def _allow_core_files() -> None:
    """A rank that crashes leaves a core file (core_stack reads it), as far as the hard limit allows."""
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


def communicate_by(proc: subprocess.Popen, timeout: float) -> tuple[str, bool]:
    """(output, timed out) of a launcher started in a session of its own, which is ended
    past `timeout`: SIGTERM first (Paddle's handler writes each rank's C++ stack into its
    workerlog, which says where a hang sits), SIGKILL for whatever still runs TERM_GRACE
    seconds later."""
    try:
        return proc.communicate(timeout=timeout)[0], False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            return proc.communicate(timeout=TERM_GRACE)[0], True
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.communicate()[0], True


def _launch_once(script: str, *args: str, nproc: int, timeout: float,
                 env: dict[str, str] | None, work_dir: str) -> LaunchResult:
    """One launch whose working directory, log folder and core files' folder is work_dir."""
    full_env = dict(os.environ)
    full_env.update({"OMP_NUM_THREADS": "1", "PADDLE_EXT_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                     **launcher_port_range()})
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
           "--log_dir", work_dir, RANK_ENTRY, os.path.join(SCRIPTS, script), *args]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, cwd=work_dir, start_new_session=True,
                            preexec_fn=_allow_core_files)
    try:
        output, timed_out = communicate_by(proc, timeout)
    finally:
        try:  # ranks the launcher left behind
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    elapsed = time.monotonic() - start
    logs = {}
    for rank in range(nproc):
        path = os.path.join(work_dir, f"workerlog.{rank}")
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                logs[rank] = f.read()
    return LaunchResult(proc.returncode, elapsed, output, logs, timed_out)
