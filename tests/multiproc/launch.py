"""Runs a rank script under `python -m paddle.distributed.launch` on gloo.

Every run has a deadline; on expiry the launcher's whole process group (the
launcher and every rank) is terminated, then killed, so a hang fails the test instead
of CI, with each rank's C++ stack in its log.

A run whose job store lost its port is run again (twice at most): the launcher picks
PADDLE_MASTER's port by binding and closing a socket, and rank 0's TCPStore binds it
seconds later, after Python and Paddle start; meanwhile any process may take it (gloo's
pairs bind ephemeral ports all the time, and CI runs three legs side by side). Measured
once in CI (2.6.2: "Bind network on IP_ANY:46022 failed" in fleet.init). Nothing of the
plugin has run by then, so the retry hides no behaviour of it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


@dataclass
class LaunchResult:
    returncode: int
    elapsed: float
    output: str               # the launcher's own stdout + stderr
    logs: dict[int, str]      # rank -> workerlog text
    timed_out: bool

    def all_text(self) -> str:
        return self.output + "".join(self.logs.values())

    def describe(self) -> str:
        tails = "\n".join(f"--- rank {r} ---\n{text[-3000:]}" for r, text in sorted(self.logs.items()))
        return f"rc={self.returncode} elapsed={self.elapsed:.1f}s timed_out={self.timed_out}\n{self.output[-2000:]}\n{tails}"


MASTER_PORT_RETRIES = 2
TERM_GRACE = 5.0  # seconds between SIGTERM and SIGKILL of a job past its deadline


def launch(script: str, *args: str, nproc: int = 2, timeout: float = 120.0,
           env: dict[str, str] | None = None) -> LaunchResult:
    for attempt in range(MASTER_PORT_RETRIES + 1):
        result = _launch_once(script, *args, nproc=nproc, timeout=timeout, env=env)
        port = lost_master_port(result)
        if port is None or attempt == MASTER_PORT_RETRIES:
            return result
        print(f"tests.multiproc.launch: {script}: the job store's port {port} was taken before it bound it; "
              "launching again", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def lost_master_port(result: LaunchResult) -> int | None:
    """PADDLE_MASTER's port when the run failed because rank 0's job store could not bind
    it (another process took it after the launcher chose it), else None."""
    if result.returncode == 0 or result.timed_out:
        return None
    master = re.search(r"'PADDLE_MASTER': '[^':]*:(\d+)'", result.output)
    if master is None:
        return None
    port = master.group(1)
    bind_failed = re.compile(rf"Bind network on IP_ANY:{port} failed|address already in use[^\n]*:{port}\b",
                             re.IGNORECASE)
    return int(port) if bind_failed.search(result.all_text()) else None


def _launch_once(script: str, *args: str, nproc: int, timeout: float,
                 env: dict[str, str] | None) -> LaunchResult:
    log_dir = tempfile.mkdtemp(prefix="paddle_ext_launch_")
    full_env = dict(os.environ)
    full_env.update({"OMP_NUM_THREADS": "1", "PADDLE_EXT_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
           "--log_dir", log_dir, os.path.join(SCRIPTS, script), *args]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, start_new_session=True)
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        # SIGTERM first: Paddle's handler writes each rank's C++ stack into its workerlog,
        # which says where a hang sits; whatever still runs after a few seconds is killed
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=TERM_GRACE)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
    finally:
        try:  # ranks the launcher left behind
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    elapsed = time.monotonic() - start
    logs = {}
    for rank in range(nproc):
        path = os.path.join(log_dir, f"workerlog.{rank}")
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                logs[rank] = f.read()
    return LaunchResult(proc.returncode, elapsed, output, logs, timed_out)
