"""Build of paddle-ext.

Two native parts:
- paddle_ext._C, the csrc/runtime module: CMake + pybind11, needs no Paddle;
- paddle_ext/lib/libpaddle_ext_ops.so, the custom-op library: built through
  paddle.utils.cpp_extension against the Paddle installed in the target
  environment (tools/build_ops.py). Paddle is not a dependency of this package
  (users bring paddlepaddle or paddlepaddle-gpu), so it is looked up outside
  pip's isolated build environment.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build import build
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
OPS_LIBRARY = "paddle_ext.lib.libpaddle_ext_ops"

NO_PADDLE = """
paddle-ext needs PaddlePaddle installed before it is built: its operators are
compiled against the Paddle you run. Install one first, then paddle-ext:

    pip install paddlepaddle==3.3.1                     # CPU
    pip install paddlepaddle-gpu==3.3.1                 # CUDA (see paddlepaddle.org.cn)
    pip install paddlepaddle==2.6.2 "protobuf<5"        # Paddle 2.6
    pip install paddlepaddle==3.0.0 "protobuf<7"        # Paddle 3.0 - 3.2
    pip install .                                      # then this package

(looked for `import paddle` with {python})
`python -m build` builds in a venv of its own, which cannot see your Paddle: run
`python -m build --no-isolation` in the environment that has it (with setuptools,
wheel, pybind11, cmake and ninja installed), or `pip wheel .` there.
"""


def _environments() -> list[dict[str, str]]:
    """The environment as given, then without pip's build isolation.

    pip isolates a build by putting an overlay on PYTHONPATH whose
    sitecustomize hides the target's site-packages; the same interpreter
    without that overlay sees the user's packages, Paddle included.
    """
    given = dict(os.environ)
    bare = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    return [given, bare] if given != bare else [given]


PROBE = (
    "import json, os, paddle; print(json.dumps({'version': paddle.__version__, "
    "'commit': getattr(paddle.version, 'commit', ''), 'dir': os.path.dirname(paddle.__file__), "
    "'cuda': paddle.is_compiled_with_cuda(), 'rocm': paddle.is_compiled_with_rocm()}))"
)


def find_paddle() -> tuple[dict, dict[str, str]] | None:
    for env in _environments():
        proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
        if proc.returncode == 0:
            return json.loads(proc.stdout.strip().splitlines()[-1]), env
    return None


@functools.cache
def paddle_probe() -> tuple[dict, dict[str, str]] | None:
    return find_paddle()


def paddle_info() -> tuple[dict, dict[str, str]]:
    """The target's Paddle; stops the build with NO_PADDLE when there is none."""
    found = paddle_probe()
    if found is None:
        sys.stderr.write(NO_PADDLE.format(python=sys.executable))
        raise SystemExit(1)
    return found


def _requirements():
    """paddle_ext/_requirements.py, loaded without importing the package (it needs Paddle)."""
    import runpy
    import types

    return types.SimpleNamespace(**runpy.run_path(os.path.join(ROOT, "paddle_ext", "_requirements.py")))


def install_requires() -> list[str]:
    deps = ["numpy"]
    if os.environ.get("PADDLE_EXT_SKIP_PADDLE_PROBE") == "1":
        return deps
    found = paddle_probe()
    if found is None:  # an sdist needs no Paddle; a build stops in BuildNative.run
        return deps
    return deps + _requirements().install_requirements(found[0]["version"])


def _which(tool: str) -> str:
    found = shutil.which(tool)
    return os.path.realpath(found) if found else ""


def _tree_digest(*paths: str) -> str:
    """Content hash of files and folders under ROOT (Paddle's cpp_extension only
    tracks the .cc files it is given, not the headers they include)."""
    digest = hashlib.sha256()
    for path in paths:
        full = os.path.join(ROOT, path)
        files = [full] if os.path.isfile(full) else sorted(
            os.path.join(d, f) for d, _, names in os.walk(full) for f in names)
        for name in files:
            digest.update(os.path.relpath(name, ROOT).encode() + b"\0")
            with open(name, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def keyed_build_dir(parent: str, prefix: str, identity: dict[str, str]) -> str:
    """The build folder of this target interpreter, emptied unless its last build
    had the same identity.

    identity names everything the folder's contents depend on (the interpreter,
    the tools and their paths, the Paddle built against, the sources). pip's
    isolated builds thus start afresh each time, since their cmake, ninja and
    pybind11 live in a temporary environment that a cached configuration would
    name after it is gone (CMake's cache did: a second venv's `pip install .`
    failed on the first one's deleted ninja). Folders of interpreters that no
    longer exist are removed.
    """
    python = identity["python"]
    path = os.path.join(parent, f"{prefix}-{hashlib.sha256(python.encode()).hexdigest()[:12]}")
    os.makedirs(parent, exist_ok=True)
    for name in os.listdir(parent):
        stamp = os.path.join(parent, name, "identity.json")
        if name.startswith(prefix + "-") and os.path.exists(stamp):
            with open(stamp) as f:
                recorded = json.load(f)
            if recorded != identity and (name == os.path.basename(path)
                                         or not os.path.exists(recorded.get("python", ""))):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "identity.json"), "w") as f:
        json.dump(identity, f, indent=1, sort_keys=True)
    return path


def compiler_identity() -> dict[str, str]:
    return {
        # The venv's own interpreter path (not its symlink's target): one per environment.
        "python": os.path.abspath(sys.executable),
        "python_version": sys.version,
        "cxx": os.environ.get("CXX", "") or _which("c++"),
        "cxxflags": os.environ.get("CXXFLAGS", ""),
        "ccache": _which("ccache"),
    }


class CleanBuild(build):
    """build/lib is rebuilt from nothing each time: a wheel then never carries a
    file (a module since removed, another Paddle's op library) that an earlier
    build left there. Object files stay, in build/temp's keyed folders."""

    def run(self) -> None:
        if os.path.isdir(self.build_lib):
            shutil.rmtree(self.build_lib)
        super().run()


class CMakeExtension(Extension):
    def __init__(self, name: str, sourcedir: str):
        super().__init__(name, sources=[])
        self.sourcedir = sourcedir


class PaddleOpsLibrary(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class BuildNative(build_ext):
    def run(self) -> None:
        paddle_info()  # before compiling anything: without Paddle, stop at once
        super().run()

    def get_ext_filename(self, fullname: str) -> str:
        if fullname == OPS_LIBRARY:
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def copy_extensions_to_source(self) -> None:
        # Editable installs copy each extension's file into the source tree;
        # the op library also needs its folder and its build_info.json.
        build_py = self.get_finalized_command("build_py")
        ops_dir = os.path.dirname(build_py.get_package_dir("paddle_ext")) or "."
        target = os.path.join(ops_dir, "paddle_ext", "lib")
        os.makedirs(target, exist_ok=True)
        super().copy_extensions_to_source()
        built = os.path.join(self.build_lib, *OPS_LIBRARY.split(".")[:-1], "build_info.json")
        self.copy_file(built, os.path.join(target, "build_info.json"))

    def build_extension(self, ext: Extension) -> None:
        if isinstance(ext, CMakeExtension):
            self._build_cmake(ext)
        elif isinstance(ext, PaddleOpsLibrary):
            self._build_ops(ext)
        else:
            super().build_extension(ext)

    def _build_cmake(self, ext: CMakeExtension) -> None:
        import pybind11

        out_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        identity = {
            **compiler_identity(), "cmake": _which("cmake"), "ninja": _which("ninja"),
            "pybind11": pybind11.get_cmake_dir(), "out_dir": out_dir,
            **{k: os.environ.get(k, "") for k in ("PADDLE_EXT_WITH_CUDA", "PADDLE_EXT_WITH_HIP")},
        }
        build_dir = keyed_build_dir(os.path.abspath(self.build_temp), "cmake", identity)
        config = [
            "cmake", "-S", ext.sourcedir, "-B", build_dir, "-G", "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={identity['ninja']}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            "-DCMAKE_BUILD_TYPE=Release",
        ]
        if identity["ccache"]:  # as Paddle's cpp_extension does for the op library
            config.append(f"-DCMAKE_CXX_COMPILER_LAUNCHER={identity['ccache']}")
        subprocess.check_call(config)
        subprocess.check_call(["cmake", "--build", build_dir, "--parallel"])

    def _build_ops(self, ext: PaddleOpsLibrary) -> None:
        info, env = paddle_info()
        import setuptools

        out_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        # The sources' digest is part of the key because cpp_extension's own
        # check sees only the .cc files, not the headers they include.
        identity = {
            **compiler_identity(), **{f"paddle_{k}": str(v) for k, v in info.items()},
            "sources": _tree_digest("csrc/ops", "tools/build_ops.py"),
        }
        build_dir = keyed_build_dir(os.path.abspath(self.build_temp), "ops", identity)
        subprocess.check_call(
            [
                sys.executable, os.path.join(ROOT, "tools", "build_ops.py"),
                "--root", ROOT, "--out-dir", out_dir, "--build-dir", build_dir,
                "--extra-path", os.path.dirname(os.path.dirname(setuptools.__file__)),
            ],
            env=env,
        )


setup(
    packages=find_packages(include=["paddle_ext", "paddle_ext.*"]) + ["paddle_ext.patches"],
    package_dir={"paddle_ext.patches": "patches"},
    package_data={"paddle_ext.patches": ["series"], "paddle_ext": ["py.typed"]},
    install_requires=install_requires(),
    ext_modules=[CMakeExtension("paddle_ext._C", os.path.join(ROOT, "csrc")), PaddleOpsLibrary(OPS_LIBRARY)],
    cmdclass={"build": CleanBuild, "build_ext": BuildNative},
    zip_safe=False,
)
