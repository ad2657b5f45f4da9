"""Layout rules of the source tree (issue 40), read from the files, nothing imported:
no import circle among paddle_ext's and patches/' modules, and no function in
paddle_ext/pipeline longer than MAX_FUNCTION_LINES.

The import rule. An edge A -> B is any `import` / `from ... import` in module A that
names module B of these packages, wherever it stands: at the top, under
`if TYPE_CHECKING:`, or inside a function. A TYPE_CHECKING or function-local import
that exists to dodge a circle is still a circle: the two modules still need each other
(neither can be read, tested or moved alone), and the circle comes back as an import
error the day someone moves the import up. A local import kept for start-up cost only
(Paddle, matplotlib) costs nothing here: it is an edge like any other and is fine as
long as it closes no loop.
- `from P import name` is an edge to the module P.name when there is one, else to P
  (the name then comes from P's __init__); relative imports are resolved first.
- Not an edge: the parent packages Python initialises on the way (`import a.b.c` runs
  a/__init__ and a/b/__init__). A package's __init__ re-exporting its submodules, which
  import each other by full name, is the normal layout, not a knot; a submodule that
  imports a name from its own package's __init__ is an edge to that __init__ (and a
  circle when the __init__ imports the submodule).
- Not seen: importlib.import_module with a computed name (patches/__init__ loads the
  units listed in the series that way).
- patches/ is installed as paddle_ext.patches (setup.py's package_dir); compiled
  extension modules (paddle_ext/_C) are modules without imports of their own.

The length rule: a function's length is its lines from `def` to its last line
(docstring, comments and blank lines included, decorators not), nested functions
counted in their enclosing one as well.
"""

from __future__ import annotations

import ast
import os
import textwrap
from typing import Dict, List, Set, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# source folder -> the module name it is installed as
PACKAGES = {"paddle_ext": "paddle_ext", "patches": "paddle_ext.patches"}
MAX_FUNCTION_LINES = 60
LENGTH_CHECKED = "paddle_ext/pipeline"

Edges = Dict[str, Dict[str, int]]  # module -> {imported module: line of the first import}


def modules(root: str, packages: Dict[str, str]) -> Dict[str, str]:
    """{module name: path} of every .py file (and compiled extension, path '') below
    the package folders."""
    out = {}
    for folder, name in packages.items():
        for dirpath, dirnames, files in os.walk(os.path.join(root, folder)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            rel = os.path.relpath(dirpath, os.path.join(root, folder))
            prefix = name if rel == "." else f"{name}.{rel.replace(os.sep, '.')}"
            for f in files:
                if f == "__init__.py":
                    out[prefix] = os.path.join(dirpath, f)
                elif f.endswith(".py"):
                    out[f"{prefix}.{f[:-3]}"] = os.path.join(dirpath, f)
                elif f.endswith((".so", ".pyd")):
                    out[f"{prefix}.{f.split('.')[0]}"] = ""
    return out


def _owner(name: str, known: Dict[str, str]) -> str | None:
    """The module `name` is, or the nearest package above it that is known."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.AST, module: str, is_package: bool, known: Dict[str, str]) -> List[str]:
    if isinstance(node, ast.Import):
        return [t for t in (_owner(a.name, known) for a in node.names) if t]
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    out = []
    for alias in node.names:
        target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else _owner(base, known)
        if target:
            out.append(target)
    return out


def import_graph(known: Dict[str, str]) -> Edges:
    """Every module's imports of the others (see the module docstring for the rule)."""
    graph: Edges = {}
    for module, path in known.items():
        graph[module] = {}
        if not path:
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):  # top level, TYPE_CHECKING blocks and functions alike
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(node, module, path.endswith("__init__.py"), known):
                    if target != module:
                        graph[module].setdefault(target, node.lineno)
    return graph


def circles(graph: Edges) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(graph: Edges, component: List[str], known: Dict[str, str]) -> str:
    members = set(component)
    lines = [f"import circle among {', '.join(component)}:"]
    for module in component:
        for target, line in sorted(graph[module].items()):
            if target in members:
                lines.append(f"  {os.path.relpath(known[module], ROOT)}:{line} imports {target}")
    return "\n".join(lines)


def long_functions(folder: str, limit: int) -> List[Tuple[str, str, int]]:
    """(path:line, name, length) of every function below `folder` longer than `limit`."""
    out = []
    for dirpath, _, files in os.walk(folder):
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > limit:
                        out.append((f"{os.path.relpath(path, ROOT)}:{node.lineno}", node.name, length))
    return sorted(out)


def test_no_import_circle():
    known = modules(ROOT, PACKAGES)
    assert "paddle_ext.pipeline.schedule.ir" in known and "paddle_ext.patches._unit" in known
    graph = import_graph(known)
    found = circles(graph)
    assert not found, "\n".join(describe(graph, c, known) for c in found)


def write_package(root, files: Dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_the_circle_check_counts_type_checking_and_local_imports(tmp_path):
    # a -> b at the top, b -> c under TYPE_CHECKING, c -> a inside a function (relative):
    # one circle; d only imports a (not in it); the package's __init__ re-exports a.
    write_package(tmp_path, {
        "pkg/__init__.py": "from pkg.a import thing\n",
        "pkg/a.py": "from pkg import b\nthing = 1\n",
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\n",
        "pkg/c.py": "def f():\n    from .a import thing\n    return thing\n",
        "pkg/d.py": "import pkg.a\n",
    })
    known = modules(str(tmp_path), {"pkg": "pkg"})
    graph = import_graph(known)
    assert graph["pkg.a"] == {"pkg.b": 1} and graph["pkg.b"] == {"pkg.c": 3} and graph["pkg.c"] == {"pkg.a": 2}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert "pkg/c.py:2 imports pkg.a" in describe(graph, ["pkg.a", "pkg.b", "pkg.c"], known).replace(
        str(tmp_path) + os.sep, "")


def test_the_circle_check_passes_a_package_layout_and_names_an_import_of_the_init(tmp_path):
    # __init__ imports its submodules, which import each other and the parent by full
    # name: no circle; a submodule taking a name from the __init__ that imports it is one.
    files = {
        "pkg/__init__.py": "from pkg.ir import X\nfrom pkg.use import y\n",
        "pkg/ir.py": "X = 1\n",
        "pkg/use.py": "from pkg.ir import X\nimport pkg.ir\ny = X\n",
    }
    write_package(tmp_path, files)
    assert circles(import_graph(modules(str(tmp_path), {"pkg": "pkg"}))) == []
    write_package(tmp_path, {"pkg/use.py": "from pkg import X\ny = X\n"})
    assert circles(import_graph(modules(str(tmp_path), {"pkg": "pkg"}))) == [["pkg", "pkg.use"]]


def test_no_function_in_the_pipeline_package_is_longer_than_60_lines():
    found = long_functions(os.path.join(ROOT, LENGTH_CHECKED), MAX_FUNCTION_LINES)
    assert not found, (f"functions in {LENGTH_CHECKED} longer than {MAX_FUNCTION_LINES} lines (split them into "
                       "named steps): " + "; ".join(f"{where} {name} ({n} lines)" for where, name, n in found))


def test_the_length_check_counts_from_def_to_the_last_line(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(58))
    (tmp_path / "m.py").write_text(
        f"def fits():\n    '''doc'''\n{body}\n\n\n@staticmethod\ndef too_long():\n    '''doc'''\n{body}\n    return 0\n")
    found = long_functions(str(tmp_path), MAX_FUNCTION_LINES)
    assert [(name, n) for _, name, n in found] == [("too_long", 61)]
    assert found[0][0].endswith("m.py:64")  # the def line, after fits() (lines 1-60) and the decorator
