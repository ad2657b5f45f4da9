"""Runs one rank's script as __main__ and, once it returned and every exit handler
(Paddle's, the plugin's) ran, prints FINISHED_MARK.

What a rank does after that mark is only the interpreter's teardown and the C++ static
destructors: launch.py tells a crash there (a signal after the mark) from a failure of
the script itself. First it prints the job store's address (MASTER_LINE): launch.py
tells a job whose store lost its port from the store's own error text on that port.
Usage: python _rank_entry.py SCRIPT [ARGS...]
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys

FINISHED_MARK = "paddle_ext-tests: the rank script and its exit handlers returned"
MASTER_LINE = "paddle_ext-tests: PADDLE_MASTER="

_returned = False


def _mark_finished() -> None:
    if _returned:
        print(FINISHED_MARK, flush=True)


def main() -> None:
    global _returned
    if len(sys.argv) < 2:
        raise SystemExit("usage: _rank_entry.py SCRIPT [ARGS...]")
    print(MASTER_LINE + os.environ.get("PADDLE_MASTER", ""), flush=True)
    # registered before the script imports anything: exit handlers run last-registered
    # first, so this one runs after all of theirs
    atexit.register(_mark_finished)
    sys.argv = sys.argv[1:]  # the script sees its own argv (runpy sets argv[0] to it)
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as end:
        _returned = end.code in (None, 0)
        raise
    _returned = True


if __name__ == "__main__":
    main()
