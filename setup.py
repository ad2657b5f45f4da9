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

import json
import os
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
OPS_LIBRARY = "paddle_ext.lib.libpaddle_ext_ops"

NO_PADDLE = """
paddle-ext needs PaddlePaddle installed before it is built: its operators are
compiled against the Paddle you run. Install one first, then paddle-ext:

    pip install paddlepaddle==3.3.1                     # CPU
    pip install paddlepaddle-gpu==3.3.1                 # CUDA (see paddlepaddle.org.cn)
    pip install paddlepaddle==2.6.2 "protobuf<5"        # Paddle 2.6
    pip install .                                      # then this package

(looked for `import paddle` with {python})
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
    "import json, paddle; print(json.dumps({'version': paddle.__version__, "
    "'cuda': paddle.is_compiled_with_cuda(), 'rocm': paddle.is_compiled_with_rocm()}))"
)


def find_paddle() -> tuple[dict, dict[str, str]] | None:
    for env in _environments():
        proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
        if proc.returncode == 0:
            return json.loads(proc.stdout.strip().splitlines()[-1]), env
    return None


_PADDLE = None


def paddle_info() -> tuple[dict, dict[str, str]]:
    global _PADDLE
    if _PADDLE is None:
        _PADDLE = find_paddle()
        if _PADDLE is None:
            sys.stderr.write(NO_PADDLE.format(python=sys.executable))
            raise SystemExit(1)
    return _PADDLE


def install_requires() -> list[str]:
    deps = ["numpy"]
    if os.environ.get("PADDLE_EXT_SKIP_PADDLE_PROBE") == "1":  # sdist only
        return deps
    info, _ = paddle_info()  # fails here, early, when no Paddle is installed
    if info["version"].startswith("2."):
        # Paddle 2.6's DistributedStrategy breaks with protobuf >= 5, and with numpy 2
        # a rank that raises inside a pipeline step segfaults (in zlib's inflateReset2)
        # instead of reporting its error: both measured here with 2.6.2.
        deps += ["protobuf>=3.20,<5", "numpy<2"]
    return deps


class CMakeExtension(Extension):
    def __init__(self, name: str, sourcedir: str):
        super().__init__(name, sources=[])
        self.sourcedir = sourcedir


class PaddleOpsLibrary(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class BuildNative(build_ext):
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
        build_dir = os.path.join(os.path.abspath(self.build_temp), "cmake")
        os.makedirs(build_dir, exist_ok=True)
        config = [
            "cmake", "-S", ext.sourcedir, "-B", build_dir, "-G", "Ninja",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
            "-DCMAKE_BUILD_TYPE=Release",
        ]
        subprocess.check_call(config)
        subprocess.check_call(["cmake", "--build", build_dir, "--parallel"])

    def _build_ops(self, ext: PaddleOpsLibrary) -> None:
        info, env = paddle_info()
        import setuptools

        out_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        build_dir = os.path.join(os.path.abspath(self.build_temp), f"ops-paddle-{info['version']}")
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
    cmdclass={"build_ext": BuildNative},
    zip_safe=False,
)
