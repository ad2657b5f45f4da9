"""Every difference between the supported Paddle releases (2.6.2, 3.0-3.3.x), and nothing else.

Each function lives in the module of the Paddle subsystem it reads (see the submodules);
this package re-exports them, so callers write `from paddle_ext import compat` and
`compat.name(...)`. Every Paddle-version difference lives in this package and nowhere
else: its modules compare versions only through `version.paddle_before` (or a named
predicate built on it), and no module outside it reads Paddle's version
(tests/test_version_reads.py). When a new difference turns up, it gets a function in the
module of its subsystem, re-exported here.
"""

from paddle_ext.compat._pending import *  # noqa: F403  (being sorted into subsystem modules)
from paddle_ext.compat.version import (
    SUPPORTED,
    dependency_problems,
    is_supported,
    paddle_before,
    paddle_version,
    version_string,
)

__all__ = [  # the version names; the rest come from _pending until it is sorted
    "SUPPORTED", "dependency_problems", "is_supported", "paddle_before", "paddle_version", "version_string",
]
