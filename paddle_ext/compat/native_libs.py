"""Version differences in Paddle's native libraries, read from the files without importing
Paddle: 2.6.2's libpaddle.so links the system's zlib beside a copy of its own."""

from __future__ import annotations

import functools

from paddle_ext import paddle_files


@functools.cache
def paddle_links_system_zlib() -> bool:
    """Whether Paddle's core library needs the system's libz.so.1 (DT_NEEDED), read from the
    file without importing Paddle. 2.6.2's does, and also carries and exports a zlib 1.2.8 of
    its own (nm -D: inflate, inflateReset2, deflateInit2_ ...; upstream issue #70538; PR
    #64447 moved that copy to 1.2.11 after 2.6): libz.so.1, loaded in libpaddle.so's scope,
    binds its calls into itself to that copy (paddle_ext.zlib_binding). 3.3.1's links no
    libz and exports no zlib (measured)."""
    from paddle_ext import _elf

    path = paddle_files.paddle_core_library()
    if path is None:
        return False
    try:
        return "libz.so.1" in _elf.ElfFile(path).needed()
    except (OSError, _elf.ElfError):
        return False
