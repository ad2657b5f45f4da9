"""Python's zlib beside Paddle 2.6's libpaddle.so.

2.6.2's libpaddle.so carries a zlib 1.2.8 of its own and exports it (nm -D: inflate,
inflateReset2, deflateInit2_, ...), and also needs the system's libz.so.1 (DT_NEEDED).
`import paddle` loads libz.so.1 as that dependency, in libpaddle.so's lookup scope,
where libpaddle.so comes first: libz.so.1's calls into itself (its inflateInit2_ calls
inflateReset2, deflateInit2_ calls deflateReset, ...: PLT calls, zlib is not linked
-Bsymbolic) are bound to the 1.2.8 copy, 17 of them (LD_DEBUG=bindings, zlib 1.2.13,
Debian 12), whose state structs differ. Python's zlib and binascii modules, imported
later, reuse that libz.so.1: `import paddle, zlib; zlib.decompress(zlib.compress(...))`
dies of SIGSEGV, and libraries that decompress at import (newer pyarrow, scipy, aiohttp,
scikit-learn) fail with "inconsistent stream state" or crash. Upstream: issue #70538;
PR #64447 moved the bundled copy to 1.2.11 after 2.6; 3.3.1's libpaddle.so links no
libz and exports no zlib (measured). RTLD_DEEPBIND around `import zlib` does not help
(measured: libz.so.1 is not loaded again, its bindings stay).

So `import paddle_ext`, where Paddle's core library needs libz.so.1
(compat.paddle_links_system_zlib):
- before Paddle: imports zlib and binascii, which load libz.so.1 in their own scope,
  where it binds to itself; libpaddle.so then finds it loaded and keeps its own copy.
- after Paddle: writes back the addresses of libz.so.1's own definitions into the
  slots of its calls into itself that the loader bound to libpaddle.so (what the loader
  writes when libz.so.1 comes first), making a read-only (RELRO) page writable for the
  write only. Compression objects made before that (between `import paddle` and
  `import paddle_ext`) keep a state the 1.2.8 copy set up: import paddle_ext first.
PADDLE_EXT_ZLIB=off leaves both alone. Elsewhere (3.x) nothing happens. The doctor
reports the state (report()). Linux, x86-64 and AArch64 (glibc's dlinfo / dladdr).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

from paddle_ext import _elf, compat, paddle_files

SWITCH = "PADDLE_EXT_ZLIB"  # "off": leave libz.so.1's bindings as the loader made them
SONAME = "libz.so.1"
_RTLD_DI_LINKMAP = 2

# What `import paddle_ext` did about libz.so.1, for the doctor.
decision = ""


@dataclass(frozen=True)
class Binding:
    """A call of libz.so.1 into one of its own functions that lands in another object."""

    symbol: str
    slot: int  # the slot's address in this process
    own: int  # the address of libz.so.1's own definition
    target: str  # the object the slot points into


class _LinkMap(ctypes.Structure):  # the public head of glibc's struct link_map (<link.h>)
    _fields_ = [("l_addr", ctypes.c_size_t), ("l_name", ctypes.c_char_p)]


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "dlinfo"):  # glibc < 2.34 keeps it in libdl
        libc = ctypes.CDLL("libdl.so.2", use_errno=True)
    return libc


def loaded_libz() -> tuple[int, str] | None:
    """(load base, path) of the libz.so.1 this process has loaded; None if none is."""
    try:
        handle = ctypes.CDLL(SONAME, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None
    link_map = ctypes.POINTER(_LinkMap)()
    if _libc().dlinfo(ctypes.c_void_p(handle._handle), _RTLD_DI_LINKMAP, ctypes.byref(link_map)) != 0:
        return None
    return link_map.contents.l_addr, link_map.contents.l_name.decode()


def foreign_bindings() -> list[Binding]:
    """libz.so.1's calls into its own functions that the loader bound to another object
    (none where libz.so.1 is not loaded, or bound to itself)."""
    libz = loaded_libz()
    if libz is None:
        return []
    base, path = libz
    libc = _libc()
    out = []
    for slot in _elf.ElfFile(path).self_bound_slots():
        address = base + slot.offset
        value = ctypes.c_size_t.from_address(address).value
        info = _DlInfo()
        if not libc.dladdr(ctypes.c_void_p(value), ctypes.byref(info)) or info.dli_fbase == base:
            continue
        out.append(Binding(slot.symbol, address, base + slot.value,
                           info.dli_fname.decode() if info.dli_fname else "?"))
    return out


def into_paddle(bindings: list[Binding]) -> list[Binding]:
    """Those bindings that land in Paddle's core library."""
    core = paddle_files.paddle_core_library()
    return [b for b in bindings if core is not None and _same_file(b.target, core)]


def rebind(bindings: list[Binding]) -> int:
    """Points each binding's slot at libz.so.1's own definition; returns how many."""
    libz = loaded_libz()
    relro = _elf.ElfFile(libz[1]).relro() if libz else None
    libc = _libc()
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = os.sysconf("SC_PAGE_SIZE")
    for b in bindings:
        start = b.slot - b.slot % page
        protection = _page_protection(start)
        writable = protection is not None and protection & 2
        if not writable:  # a RELRO page (libz.so.1 linked -z now): writable for this write only
            if libc.mprotect(start, page, 3) != 0:
                raise OSError(ctypes.get_errno(), f"mprotect of libz.so.1's slot for {b.symbol} "
                              f"(RELRO {relro}) failed")
        ctypes.c_size_t.from_address(b.slot).value = b.own
        if not writable:
            libc.mprotect(start, page, protection if protection is not None else 1)
    return len(bindings)


def prepare() -> str:
    """What `import paddle_ext` does (see the module docstring); returns it in words."""
    if _switched_off():
        return f"left as the loader bound it ({SWITCH}=off)"
    if not compat.paddle_links_system_zlib():
        return "nothing to do: Paddle's libpaddle.so does not link libz.so.1"
    if not _core_loaded():
        try:
            import binascii  # noqa: F401  (both load libz.so.1, in their own scope)
            import zlib  # noqa: F401
        except ImportError as err:  # a Python built without zlib
            return f"nothing to do: {err}"
        return "zlib imported by paddle_ext before Paddle: libz.so.1 bound to itself"
    try:
        bindings = into_paddle(foreign_bindings())
        if not bindings:
            return "libz.so.1 was loaded before Paddle: bound to itself"
        return (f"{rebind(bindings)} of libz.so.1's calls into itself rebound from libpaddle.so's "
                "zlib 1.2.8 by paddle_ext (Paddle was imported first)")
    except (OSError, _elf.ElfError) as err:
        return f"could not rebind libz.so.1 ({err})"


def problem() -> str | None:
    """The doctor's complaint: libz.so.1 bound into Paddle's core library, or None."""
    try:
        bindings = into_paddle(foreign_bindings())
    except (OSError, _elf.ElfError) as err:
        return f"zlib: libz.so.1's bindings could not be read ({err})"
    if not bindings:
        return None
    names = ", ".join(sorted({b.symbol for b in bindings}))
    fix = "import paddle_ext (or zlib) before paddle" + (f", or unset {SWITCH}" if _switched_off() else "")
    return (f"zlib: {len(bindings)} of libz.so.1's calls into itself are bound to libpaddle.so's zlib 1.2.8 "
            f"({names}): Python's zlib crashes or fails; {fix}")


def report() -> str:
    """The doctor's line: the libz.so.1 loaded here and what paddle_ext did about it."""
    libz = loaded_libz()
    where = f"{SONAME} at {libz[1]}" if libz else f"{SONAME} not loaded"
    state = "BROKEN" if problem() else "ok"
    return f"zlib: {state}; {where}; {decision}"


def _switched_off() -> bool:
    return os.environ.get(SWITCH, "").lower() in ("off", "0", "false", "no")


def _core_loaded() -> bool:
    core = paddle_files.paddle_core_library()
    if core is None:
        return False
    core = os.path.realpath(core)
    try:
        with open("/proc/self/maps") as f:
            return any(line.rstrip("\n").endswith(core) for line in f)
    except OSError:
        return False


def _page_protection(address: int) -> int | None:
    """PROT_* bits of the mapping holding address, from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                span, perms = line.split()[:2]
                lo, hi = (int(x, 16) for x in span.split("-"))
                if lo <= address < hi:
                    return (1 if perms[0] == "r" else 0) | (2 if perms[1] == "w" else 0) | (4 if perms[2] == "x" else 0)
    except OSError:
        pass
    return None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)
