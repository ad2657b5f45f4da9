"""Runs a rank script under `python -m paddle.distributed.launch` on gloo.

Every run has a deadline; on expiry the launcher's whole process group (the
launcher and every rank) is killed, so a hang fails the test instead of CI.
"""

from __future__ import annotations

import os
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


def launch(script: str, *args: str, nproc: int = 2, timeout: float = 120.0,
           env: dict[str, str] | None = None) -> LaunchResult:
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
