"""Which code path Paddle's MKL takes on this CPU, and the AVX2 one on AMD; and
whether Paddle's AVX-512-only CPU kernels can run here (has_avx512f).

Paddle's x86-64 CPU wheels ship MKL 2019.0.5, which runs its generic (SSE)
kernels on every CPU that is not Intel's, AVX2 and FMA or not: a 64x512x512
float32 matmul ran ~3x slower on this project's AMD EPYC than with the AVX2
kernels. That MKL still honours MKL_DEBUG_CPU_TYPE=5 (AVX2), read once, at its
first computation (Paddle loads the library only then, too). So `import paddle_ext` sets it, on AMD CPUs with AVX2 and FMA
only, when the environment does not already set it and PADDLE_EXT_MKL_AMD is not
"off". Importing paddle_ext before paddle always works; after paddle it still
works if no Paddle computation ran yet; after one, MKL has chosen for good and
paddle_ext warns (set the variable before Python starts). Intel CPUs: nothing
changes. Imports no Paddle.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import warnings

from paddle_ext import paddle_files

MKL_VARIABLE = "MKL_DEBUG_CPU_TYPE"
AVX2 = "5"
SWITCH = "PADDLE_EXT_MKL_AMD"  # "off": leave MKL's own choice
PATH_NAMES = {0: "generic (SSE)", 5: "AVX2"}
MATMUL_SHAPE = (64, 512, 512)


def mkl_code_path(decide: bool = True) -> int | None:
    """The code path Paddle's MKL dispatches to (its mkl_serv_get_cpu_type, numbered as
    MKL_DEBUG_CPU_TYPE: 0 generic, 5 AVX2 ...). MKL decides at its first computation,
    from MKL_DEBUG_CPU_TYPE as it is then; decide=True decides now if it has not
    (argument 1: measured: 0 answers -1 while undecided), decide=False answers None
    then. None too without that MKL, or before `import paddle` loaded it (it needs
    the libiomp5 that Paddle loads first)."""
    import ctypes

    path = paddle_files.mkl_library_path()
    fn = getattr(ctypes.CDLL(path), "mkl_serv_get_cpu_type", None) if path and mkl_loaded() else None
    if fn is None:
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    code = int(fn(1 if decide else 0))
    return None if code < 0 else code


def mkl_loaded() -> bool:
    """Whether this process has loaded Paddle's MKL (an `import paddle` does)."""
    try:
        with open("/proc/self/maps") as f:
            return "libmklml_intel.so" in f.read()
    except OSError:
        return False


# What import paddle_ext did about MKL's path, for the doctor.
decision = ""


@functools.cache
def cpu() -> tuple[str, str, frozenset]:
    """(vendor id, model name, flags) of this machine's first CPU, from /proc/cpuinfo."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields.get("vendor_id", "?"), fields.get("model name", "?"), frozenset(fields.get("flags", "").split())


def wants_avx2_path() -> bool:
    """AMD with AVX2 and FMA: where MKL's AVX2 kernels run and give correct results."""
    vendor, _, flags = cpu()
    return vendor == "AuthenticAMD" and {"avx2", "fma"} <= flags


def has_avx512f() -> bool | None:
    """Whether this CPU runs AVX-512F code; None where /proc/cpuinfo cannot tell (not
    Linux). Some of Paddle's x86-64 CPU kernels are written in AVX-512 intrinsics with
    no other path and no run-time check (phi::fusion::RmsNormAvxKernel behind
    fused_rms_norm's float32 forward, FusedLayerNormAvxKernel): on a CPU without
    AVX-512F (AMD before Zen 4, many Intel desktop parts) a call stops the process
    with SIGILL. Measured on this project's AMD EPYC (Zen 1) with Paddle 3.3.1."""
    vendor, _, flags = cpu()
    if vendor == "?" and not flags:
        return None
    return "avx512f" in flags


def prefer_avx2_path() -> str:
    """Sets MKL_DEBUG_CPU_TYPE=5 for Paddle's MKL on AMD (see the module docstring);
    returns what it did, in words."""
    if MKL_VARIABLE in os.environ:
        return f"{MKL_VARIABLE}={os.environ[MKL_VARIABLE]} as the environment set it"
    if not wants_avx2_path():
        return "MKL's own choice (not an AMD CPU with AVX2 and FMA)"
    if os.environ.get(SWITCH, "").lower() in ("off", "0", "false", "no"):
        return f"MKL's own choice ({SWITCH}=off)"
    os.environ[MKL_VARIABLE] = AVX2
    said = f"{MKL_VARIABLE}={AVX2} set by paddle_ext (AMD CPU with AVX2 and FMA)"
    decided = mkl_code_path(decide=False) if mkl_loaded() else None
    if decided is not None and decided != int(AVX2):
        warnings.warn(
            "paddle_ext: Paddle's MKL already chose its generic code path (a Paddle computation "
            "ran before paddle_ext was imported), ~3x slower on this AMD CPU: import paddle_ext "
            f"before paddle, or start Python with {MKL_VARIABLE}={AVX2}", RuntimeWarning, stacklevel=3)
        return said + ", too late: MKL had already chosen"
    return said


def path_name(code: int) -> str:
    return PATH_NAMES.get(code, f"type {code}")


def expected_path() -> str:
    """The path MKL will take when it first computes, from the environment as it is now."""
    if MKL_VARIABLE in os.environ:
        value = os.environ[MKL_VARIABLE]
        return path_name(int(value)) if value.isdigit() else f"{MKL_VARIABLE}={value}"
    return path_name(0) if cpu()[0] == "AuthenticAMD" else "MKL's own choice for this CPU"


def describe() -> str:
    """One line: the CPU and the path Paddle's MKL takes (read from MKL once Paddle loaded
    it, at its first computation; before that, the path it will take)."""
    vendor, model, _ = cpu()
    code = mkl_code_path()
    if code is not None:
        path = path_name(code)
    elif paddle_files.mkl_library_path() is None:
        path = "none (this Paddle ships no MKL)"
    else:
        path = f"{expected_path()}, once Paddle loads MKL at its first computation"
    return f"CPU {model} ({vendor}); Paddle's MKL code path: {path} ({decision})"


def matmul_gflops(repeats: int = 50) -> float:
    """Median float32 GFLOP/s of a 64x512x512 Paddle matmul, at Paddle's thread setting."""
    import statistics
    import time

    import numpy as np
    import paddle

    m, k, n = MATMUL_SHAPE
    rng = np.random.default_rng(0)
    a = paddle.to_tensor(rng.standard_normal((m, k), dtype=np.float32))
    b = paddle.to_tensor(rng.standard_normal((k, n), dtype=np.float32))
    samples = []
    for i in range(repeats + 5):
        start = time.perf_counter()
        paddle.matmul(a, b).numpy()
        if i >= 5:
            samples.append(time.perf_counter() - start)
    return 2 * m * k * n / statistics.median(samples) / 1e9


CHILD = "from paddle_ext import cpu_math; import sys; print(cpu_math.matmul_gflops(), cpu_math.mkl_code_path())"


def gflops_in_child(mkl_type: str | None) -> tuple[float, int | None]:
    """matmul_gflops() in a fresh interpreter whose MKL takes the path mkl_type names
    (None: MKL's own choice), since a process cannot switch once MKL chose."""
    env = {k: v for k, v in os.environ.items() if k != MKL_VARIABLE}
    if mkl_type is None:
        env[SWITCH] = "off"
    else:
        env[MKL_VARIABLE] = mkl_type
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    return float(out[-2]), None if out[-1] == "None" else int(out[-1])


def avx512_note() -> list[str]:
    """The doctor's line on a CPU without AVX-512F (see has_avx512f)."""
    if has_avx512f() is not False:
        return []
    return ["  no AVX-512F: Paddle's float32 CPU kernels of fused_rms_norm and fused_layer_norm stop the "
            "process with SIGILL on this CPU; with paddle_ext enabled, fused_rms_norm runs the plugin's kernel"]


def report() -> list[str]:
    """The doctor's lines: path, measured rate, and on AMD the other path's rate beside it;
    then Paddle's kernels that cannot run on this CPU."""
    return _mkl_report() + avx512_note()


def _mkl_report() -> list[str]:
    if paddle_files.mkl_library_path() is None:
        return [describe()]
    here = matmul_gflops()  # Paddle loads MKL here, and MKL chooses its path
    code = mkl_code_path()
    lines = [describe()]
    shape = "x".join(map(str, MATMUL_SHAPE))
    lines.append(f"  float32 matmul {shape}: {here:.1f} GFLOP/s on this path")
    if not wants_avx2_path():
        return lines
    other, other_code = gflops_in_child(None if code == int(AVX2) else AVX2)
    other_name = "no MKL" if other_code is None else path_name(other_code)
    lines.append(f"  {other_name} path (measured in a child process): {other:.1f} GFLOP/s")
    if code != int(AVX2) and other > here:
        lines.append(f"  SLOW PATH: this AMD CPU runs MKL's AVX2 kernels {other / here:.1f}x faster: import "
                     f"paddle_ext before paddle, or set {MKL_VARIABLE}={AVX2} before starting Python")
    return lines
