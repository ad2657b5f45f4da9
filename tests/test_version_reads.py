"""No module outside paddle_ext/compat reads Paddle's version: every version difference lives
in paddle_ext.compat (issue 40), and this is what makes that promise checkable.

The check walks the AST of every .py under paddle_ext/ and patches/ except paddle_ext/compat/
and refuses, wherever it appears:

- ``paddle.__version__`` and any ``__version__`` read on ``paddle`` or a name ``paddle`` was
  imported as (``paddle_ext.__version__``, the plugin's own version, is fine);
- ``paddle.version`` and everything under it (``full_version``, ``major``, ``commit`` ...), and
  importing it (``import paddle.version``, ``from paddle import version``,
  ``from paddle.version import ...``);
- ``importlib.metadata.version("paddlepaddle...")`` (any call named ``version`` whose first
  argument is a string starting with "paddlepaddle");
- ``paddle_version`` called or named as an attribute (``compat.paddle_version()``,
  ``paddle_version()``, ``compat.paddle_version`` passed along) or imported by name; a local
  variable or parameter that merely has that name (``_requirements.pins_for(paddle_version)``
  is handed the string, it reads nothing) and a dict key such as ``info["paddle_version"]``
  (the op library's recorded build version) are not reads;
- ``version_string()`` anywhere but inside an f-string: showing the version in a message is
  display, comparing it or passing it on is a version decision;
- ``paddle_before`` (the raw comparison compat's modules are written with), except where
  ALLOWED names the file.

Outside compat, code asks compat a named question instead (``compat.tensors_share_host_memory()``,
``compat.is_running_release(recorded)``, ``compat.release_description()`` for the doctor), which
this check allows. tools/, bench/, setup.py and tests are outside its scope: they run without
paddle_ext (build and install time) or describe the releases they test.
"""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCANNED = ("paddle_ext", "patches")
COMPAT = os.path.join("paddle_ext", "compat")

# (file, rule) pairs the check lets through, each with why. A pair that no longer matches
# anything fails test_allow_list_is_current, so the list cannot outlive its reasons.
ALLOWED = {
    ("patches/_unit.py", "paddle_before"):
        "PatchUnit.native_from: a unit declares the first release that ships it as data, and the "
        "one generic native() asks compat.paddle_before",
}


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


class _VersionReads(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self.paddle_names = {"paddle"}
        self.in_fstring = 0

    def _add(self, node: ast.AST, rule: str) -> None:
        self.found.append((node.lineno, rule))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "paddle" and alias.asname:
                self.paddle_names.add(alias.asname)
            if alias.name == "paddle.version" or alias.name.startswith("paddle.version."):
                self._add(node, "paddle.version")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module == "paddle.version" or module.startswith("paddle.version."):
            self._add(node, "paddle.version")
        for alias in node.names:
            if module == "paddle" and alias.name == "version":
                self._add(node, "paddle.version")
            if alias.name in ("paddle_version", "version_string", "paddle_before"):
                self._add(node, alias.name)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        self.in_fstring += 1
        self.generic_visit(node)
        self.in_fstring -= 1

    def visit_Attribute(self, node: ast.Attribute) -> None:
        root = _root_name(node)
        if node.attr == "__version__" and root in self.paddle_names:
            self._add(node, "paddle.__version__")
        elif (node.attr == "version" and isinstance(node.value, ast.Name)
              and node.value.id in self.paddle_names):
            self._add(node, "paddle.version")
        elif node.attr == "paddle_version":
            self._add(node, "paddle_version")
        elif node.attr == "paddle_before":
            self._add(node, "paddle_before")
        elif node.attr == "version_string" and not self.in_fstring:
            self._add(node, "version_string")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if isinstance(func, ast.Name) and name in ("paddle_version", "paddle_before"):
            self._add(node, name)
        elif isinstance(func, ast.Name) and name == "version_string" and not self.in_fstring:
            self._add(node, "version_string")
        elif (name == "version" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and node.args[0].value.startswith("paddlepaddle")):
            self._add(node, "metadata.version(paddlepaddle)")
        self.generic_visit(node)


def version_reads(source: str) -> list[tuple[int, str]]:
    """(line, rule) for each read of Paddle's version in `source` (see the module docstring)."""
    visitor = _VersionReads()
    visitor.visit(ast.parse(source))
    return sorted(visitor.found)


def _scanned_files() -> list[str]:
    out = []
    for top in SCANNED:
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            rel = os.path.relpath(folder, ROOT)
            if rel == COMPAT or rel.startswith(COMPAT + os.sep):
                dirs[:] = []
                continue
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            out += [os.path.join(rel, f).replace(os.sep, "/") for f in files if f.endswith(".py")]
    return sorted(out)


def _all_reads() -> list[tuple[str, int, str]]:
    reads = []
    for path in _scanned_files():
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            reads += [(path, line, rule) for line, rule in version_reads(f.read())]
    return reads


def test_no_module_outside_compat_reads_paddles_version():
    offenders = [f"{path}:{line}: {rule}" for path, line, rule in _all_reads() if (path, rule) not in ALLOWED]
    assert offenders == [], ("Paddle's version is read outside paddle_ext/compat; give the difference a named "
                             "function in the compat module of its subsystem:\n" + "\n".join(offenders))


def test_allow_list_is_current():
    used = {(path, rule) for path, _, rule in _all_reads()}
    assert sorted(set(ALLOWED) - used) == []


def test_the_walk_sees_the_package_and_the_units_but_not_compat():
    files = _scanned_files()
    assert "paddle_ext/__main__.py" in files and "paddle_ext/ops/_library.py" in files
    assert "patches/_unit.py" in files
    assert not [f for f in files if f.startswith("paddle_ext/compat/")]


def test_compat_compares_versions_only_through_paddle_before():
    """Inside compat, only version.py touches paddle_version() (and __init__.py re-exports it);
    the other modules ask paddle_before (or a predicate built on it), so "before 3.0" is
    written once."""
    folder = os.path.join(ROOT, COMPAT)
    offenders = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py") and name not in ("version.py", "__init__.py"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                offenders += [f"{name}:{line}" for line, rule in version_reads(f.read()) if rule == "paddle_version"]
    assert offenders == []


def test_every_compat_name_called_outside_compat_is_one_it_exports():
    """What moved out of compat (no version difference: paddle_ext.upstream, devices, ...)
    is called at its home: every `compat.<name>` written outside the package is a name of
    compat.__all__, and compat answers no other name."""
    import re

    from paddle_ext import compat

    called = set()
    for top in ("paddle_ext", "patches", "tests"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            if os.path.relpath(folder, ROOT).startswith(COMPAT):
                continue
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(folder, name), encoding="utf-8") as f:
                        called |= set(re.findall(r"\bcompat\.([A-Za-z_]\w*)", f.read()))
    assert sorted(called - set(compat.__all__) - {"no_such_name", "__all__"}) == []
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        compat.no_such_name  # noqa: B018


@pytest.mark.parametrize("source, rule", [
    ("import paddle\nif paddle.__version__ < '3.0': pass\n", "paddle.__version__"),
    ("import paddle as pd\nv = pd.__version__\n", "paddle.__version__"),
    ("import paddle\nmajor = int(paddle.version.major)\n", "paddle.version"),
    ("import paddle\nc = getattr(paddle.version, 'commit', '')\n", "paddle.version"),
    ("from paddle import version\n", "paddle.version"),
    ("from paddle.version import full_version\n", "paddle.version"),
    ("import paddle.version\n", "paddle.version"),
    ("from importlib import metadata\nv = metadata.version('paddlepaddle-gpu')\n", "metadata.version(paddlepaddle)"),
    ("from paddle_ext import compat\nif compat.paddle_version() < (3, 0, 0): pass\n", "paddle_version"),
    ("from paddle_ext import compat\nunits.apply(config, compat.paddle_version)\n", "paddle_version"),
    ("from paddle_ext.compat import paddle_version\n", "paddle_version"),
    ("from paddle_ext import compat\nok = compat.version_string() == built\n", "version_string"),
    ("from paddle_ext import compat\npins = pins_for(compat.version_string())\n", "version_string"),
    ("from paddle_ext import compat\nif compat.paddle_before(3, 1): pass\n", "paddle_before"),
])
def test_the_check_refuses_each_form(source, rule):
    assert [r for _, r in version_reads(source)] == [rule]


@pytest.mark.parametrize("source", [
    "import paddle_ext\nprint(paddle_ext.__version__)\n",
    "from paddle_ext import compat\nraise RuntimeError(f'Paddle {compat.version_string()} is installed')\n",
    "from paddle_ext import compat\nif not compat.tensors_share_host_memory(): pass\n",
    "from paddle_ext import compat\nok = compat.is_running_release(info['paddle_version'])\n",
    "def pins_for(paddle_version):\n    return PINS.get('.'.join(paddle_version.split('.')[:2]), ())\n",
    "import paddle\nx = paddle.to_tensor([1.0])\n",
])
def test_the_check_lets_named_questions_and_display_through(source):
    assert version_reads(source) == []


def test_the_check_finds_an_offender_in_a_scanned_tree(tmp_path, monkeypatch):
    """The walk itself, over a tree with one offender outside compat and the same line inside
    compat: only the first is reported."""
    offending = "from paddle_ext import compat\nif compat.paddle_version() < (3, 0, 0): pass\n"
    (tmp_path / "paddle_ext" / "compat").mkdir(parents=True)
    (tmp_path / "patches").mkdir()
    (tmp_path / "paddle_ext" / "staging.py").write_text(offending)
    (tmp_path / "paddle_ext" / "compat" / "host_memory.py").write_text(offending)
    monkeypatch.setitem(globals(), "ROOT", str(tmp_path))
    assert _all_reads() == [("paddle_ext/staging.py", 2, "paddle_version")]
    with pytest.raises(AssertionError, match=r"paddle_ext/staging.py:2: paddle_version"):
        test_no_module_outside_compat_reads_paddles_version()
