"""A rank script for the harness's own test (tests/test_launch_harness.py): with
argv `DIR WHEN`, rank 1 dies of SIGSEGV once (the first launch that finds no DIR/crashed),
WHEN = "teardown": in the interpreter's teardown, after every exit handler ran;
WHEN = "script": in the script itself."""

import os
import signal
import sys


class _KillAtTeardown:
    """Collected when the sys module's attributes are cleared, after the exit handlers
    (it holds what it calls: the os module may be torn down by then)."""

    def __init__(self) -> None:
        self.kill, self.pid, self.signal = os.kill, os.getpid(), signal.SIGSEGV

    def __del__(self) -> None:
        self.kill(self.pid, self.signal)


def main() -> None:
    directory, when = sys.argv[1], sys.argv[2]
    rank = int(os.environ["PADDLE_TRAINER_ID"])
    flag = os.path.join(directory, "crashed")
    print(f"rank {rank}: done", flush=True)
    if rank != 1 or os.path.exists(flag):
        return
    with open(flag, "w"):
        pass
    if when == "script":
        os.kill(os.getpid(), signal.SIGSEGV)
    sys.paddle_ext_kill_at_teardown = _KillAtTeardown()


if __name__ == "__main__":
    main()
