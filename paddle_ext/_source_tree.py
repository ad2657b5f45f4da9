"""Stops an import of paddle_ext from a source checkout that was not built in place.

`python -m paddle_ext ...` from a checkout's root imports the checkout's
paddle_ext/ (the current directory comes first on sys.path), not the copy pip
installed. That tree has neither the compiled parts (paddle_ext._C,
paddle_ext/lib/libpaddle_ext_ops.so) nor paddle_ext.patches, which only an
install maps in from patches/. Running the installed copy instead would run
code other than the files in front of the user (they may have changed since the
install), so, as numpy and PyTorch do, the import stops at once and says what
to run. Imports no Paddle: it runs first, before anything else is imported.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(PACKAGE_DIR)


class SourceTreeImportError(ImportError):
    """paddle_ext was imported from a checkout that is not built in place."""


def is_source_checkout() -> bool:
    return all(os.path.isfile(os.path.join(ROOT, f)) for f in ("setup.py", os.path.join("patches", "series")))


def missing_parts() -> list[str]:
    """What an in-place build (`pip install -e .`) would have put into this tree."""
    missing = []
    if not glob.glob(os.path.join(PACKAGE_DIR, "_C*.so")):
        missing.append("paddle_ext._C")
    if not os.path.isfile(os.path.join(PACKAGE_DIR, "lib", "libpaddle_ext_ops.so")):
        missing.append("paddle_ext/lib/libpaddle_ext_ops.so")
    if importlib.util.find_spec("paddle_ext.patches") is None:
        missing.append("paddle_ext.patches (mapped from patches/ by an install)")
    return missing


def installed_copy() -> str | None:
    """Where another paddle_ext lies on sys.path, outside this checkout."""
    for entry in sys.path:
        path = os.path.abspath(entry or os.curdir)
        candidate = os.path.join(path, "paddle_ext", "__init__.py")
        if path != ROOT and os.path.isfile(candidate):
            return os.path.dirname(candidate)
    return None


def message(missing: list[str]) -> str:
    installed = installed_copy()
    elsewhere = (f"run it from another directory to use the installed paddle-ext ({installed})"
                 if installed else "or install it (`pip install .`) and run it from another directory")
    return (
        f"paddle_ext: you are importing paddle-ext from its source tree ({ROOT}), which is not "
        f"built in place (missing: {', '.join(missing)}).\n"
        "  Build this tree in place:  pip install -e .   (or `make setup`, which does that in .venv)\n"
        f"  or {elsewhere}.")


def check() -> None:
    """Raises SourceTreeImportError (under `python -m paddle_ext`: prints the message
    and exits with status 2, so no traceback hides it) when this is an unbuilt checkout."""
    if not is_source_checkout():
        return
    missing = missing_parts()
    if not missing:
        return
    if sys.argv[:1] == ["-m"]:  # `python -m paddle_ext ...`, while runpy finds __main__
        sys.stderr.write(message(missing) + "\n")
        raise SystemExit(2)
    raise SourceTreeImportError(message(missing))
