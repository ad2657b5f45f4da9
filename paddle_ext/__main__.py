"""Command line: python -m paddle_ext {doctor,patches,schedule}."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def _patches_text() -> str:
    import paddle_ext

    paddle_ext.enable()
    return format_table(("unit", "upstream", "status", "title"), paddle_ext.patch_table())


def cmd_patches(args: argparse.Namespace) -> int:
    print(_patches_text())
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    import paddle_ext
    from paddle_ext import compat, cpu_math, zlib_binding
    from paddle_ext.ops import _library

    print(f"paddle_ext {paddle_ext.__version__}")
    print(compat.release_description())
    problems = compat.dependency_problems()
    print("dependencies: " + ("; ".join(f"BROKEN: {p}" for p in problems) if problems else "ok"))
    print(zlib_binding.report())
    problems += [p for p in [zlib_binding.problem()] if p]
    try:
        from paddle_ext import _C

        info = _C.build_info()
        print(f"runtime paddle_ext._C: {info['compiler']}, C++{info['cplusplus'] // 100 % 100}, "
              f"backends {', '.join(info['backends'])}")
    except ImportError as err:
        print(f"runtime paddle_ext._C: NOT BUILT ({err})")
    info = _library.build_info()
    if info is None:
        print("op library: NOT BUILT")
        return 1
    kernels = "CPU + CUDA" if info["with_cuda"] else "CPU + ROCm" if info["with_rocm"] else "CPU"
    try:
        threads = f"{_library.get_num_threads()} CPU threads"
    except _library.OpLibraryError as err:  # built for another Paddle release
        print(f"op library: NOT USABLE: {err}")
        return 1
    print(f"op library: built against Paddle {info['paddle_version']}, kernels {kernels}, "
          f"ops {', '.join(info['ops'])}; {threads}")
    print("\n".join(cpu_math.report()))
    print()
    print(_patches_text())
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m paddle_ext")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="Paddle version and build, compiled backends, the patch table").set_defaults(fn=cmd_doctor)
    sub.add_parser("patches", help="the patch series and each unit's status").set_defaults(fn=cmd_patches)
    from paddle_ext.pipeline.schedule import cli as schedule_cli

    schedule = sub.add_parser("schedule", help="generate, validate, simulate and draw a pipeline schedule")
    schedule_cli.configure_parser(schedule)
    schedule.set_defaults(fn=schedule_cli.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
