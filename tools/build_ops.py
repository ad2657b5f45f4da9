"""Builds the custom-op library against the Paddle of the running interpreter.

setup.py runs this in a subprocess with the user's environment (outside pip's
isolated build env) so that the library is compiled against the Paddle that is
really installed. It goes through paddle.utils.cpp_extension, which knows that
Paddle's include dirs, ABI flags, and CUDA/ROCm compiler set-up.

Usage: python tools/build_ops.py --root REPO --out-dir DIR --build-dir DIR
Writes DIR/libpaddle_ext_ops.so and DIR/build_info.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys

LIBRARY_NAME = "libpaddle_ext_ops.so"


def op_sources(ops_dir: str, with_gpu: bool) -> list[str]:
    patterns = ["*_op.cc", "cpu/*.cc", "common/*.cc"]
    if with_gpu:
        patterns.append("gpu/*.cu")
    found: list[str] = []
    for pattern in patterns:
        found.extend(sorted(glob.glob(os.path.join(ops_dir, pattern))))
    return found


def mkl_link_flags(paddle_dir: str) -> list[str]:
    # x86-64 Paddle wheels ship MKL; kernels that want sgemm use it when present.
    libs = os.path.join(paddle_dir, "libs")
    if os.path.exists(os.path.join(libs, "libmklml_intel.so")):
        return [f"-L{libs}", "-l:libmklml_intel.so", f"-Wl,-rpath,{libs}"]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--extra-path", action="append", default=[],
                        help="appended to sys.path (the build env's setuptools)")
    args = parser.parse_args(argv)
    sys.path.extend(args.extra_path)
    # paddle's JIT builder runs `python setup.py build` in a child: give it the same path.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + args.extra_path)

    import paddle
    from paddle.utils.cpp_extension import load

    with_cuda = paddle.is_compiled_with_cuda()
    with_rocm = paddle.is_compiled_with_rocm()
    with_gpu = with_cuda or with_rocm
    ops_dir = os.path.join(args.root, "csrc", "ops")
    sources = op_sources(ops_dir, with_gpu)
    cflags = ["-O3", "-std=c++17", f"-I{ops_dir}"]
    if with_gpu:
        cflags.append("-DPADDLE_EXT_WITH_GPU")
    # No debug info for the C++ sources: setuptools takes Python's own CFLAGS, which say -g,
    # and with it the library's CPU build took 128 core-seconds instead of 74 (g++ 12; Paddle's
    # headers in every operator's unit, flash_attn_op.o 8 MB instead of 0.4 MB). Symbols stay.
    cxx_flags = [*cflags, "-g0"]
    os.makedirs(args.build_dir, exist_ok=True)
    module = load(
        name="paddle_ext_ops",
        sources=sources,
        extra_cxx_cflags=cxx_flags,
        extra_cuda_cflags=cflags,
        extra_ldflags=mkl_link_flags(os.path.dirname(paddle.__file__)),
        build_directory=args.build_dir,
        verbose=False,
    )
    built = os.path.join(args.build_dir, "paddle_ext_ops", "paddle_ext_ops.so")
    if not os.path.exists(built):
        built = glob.glob(os.path.join(args.build_dir, "**", "paddle_ext_ops*.so"), recursive=True)[0]
    os.makedirs(args.out_dir, exist_ok=True)
    shutil.copyfile(built, os.path.join(args.out_dir, LIBRARY_NAME))
    info = {
        "paddle_version": paddle.__version__,
        "paddle_commit": getattr(paddle.version, "commit", ""),
        "with_cuda": with_cuda,
        "with_rocm": with_rocm,
        "ops": sorted(n for n in dir(module) if n.startswith("pe_")),
        "sources": [os.path.relpath(s, args.root) for s in sources],
    }
    with open(os.path.join(args.out_dir, "build_info.json"), "w") as f:
        json.dump(info, f, indent=2)
    print(f"paddle_ext: built {LIBRARY_NAME} against Paddle {paddle.__version__} "
          f"({'CUDA' if with_cuda else 'ROCm' if with_rocm else 'CPU'}): {', '.join(info['ops'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
