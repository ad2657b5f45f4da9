"""Importing paddle_ext from a checkout that is not built in place stops at once and
says what to run; `python -m paddle_ext doctor` there exits non-zero without a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def unbuilt_checkout(tmp_path) -> str:
    """The checkout's Python files, setup.py and patches/, without anything a build made."""
    tree = tmp_path / "checkout"
    shutil.copytree(os.path.join(ROOT, "paddle_ext"), tree / "paddle_ext",
                    ignore=shutil.ignore_patterns("*.so", "lib", "__pycache__"))
    shutil.copytree(os.path.join(ROOT, "patches"), tree / "patches", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "setup.py"), tree / "setup.py")
    return str(tree)


def run(args: list[str], cwd: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_doctor_in_unbuilt_checkout_says_what_to_run(tmp_path):
    tree = unbuilt_checkout(tmp_path)
    proc = run(["-m", "paddle_ext", "doctor"], tree)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert f"importing paddle-ext from its source tree ({tree})" in proc.stderr
    assert "pip install -e ." in proc.stderr
    assert "paddle_ext._C" in proc.stderr and "libpaddle_ext_ops.so" in proc.stderr


def test_import_in_unbuilt_checkout_raises_import_error(tmp_path):
    tree = unbuilt_checkout(tmp_path)
    proc = run(["-c", "import paddle_ext"], tree)
    assert proc.returncode == 1
    assert "SourceTreeImportError: paddle_ext: you are importing paddle-ext from its source tree" in proc.stderr
    proc = run(["-c", "from paddle_ext import _source_tree as s; print(issubclass(s.SourceTreeImportError, ImportError))"], ROOT)
    assert proc.stdout.strip() == "True"


def test_built_checkout_imports():
    proc = run(["-c", "import paddle_ext, paddle_ext.patches"], ROOT)
    assert proc.returncode == 0, proc.stderr
