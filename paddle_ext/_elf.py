"""The few facts paddle_ext reads from a shared library's ELF file: the libraries it
needs (DT_NEEDED), the GOT slots through which it calls symbols it defines itself,
and its RELRO range. Reads by seeking (Paddle's libpaddle.so is hundreds of MB; only
headers and a few small tables are read). ELF64 little-endian, x86-64 and AArch64:
other files raise ElfError. Standard library only, imports no Paddle.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO

# e_machine -> (GLOB_DAT, JUMP_SLOT, ABS64) relocation types: the ones that hold a
# symbol's address in a slot of the data segment.
_SLOT_RELOCATIONS = {62: (6, 7, 1), 183: (1025, 1026, 257)}
_SHT_RELA, _SHT_DYNAMIC = 4, 6
_PT_GNU_RELRO = 0x6474E552
_DT_NEEDED, _DT_NULL = 1, 0
_SHN_UNDEF = 0


class ElfError(ValueError):
    """Not a file this reader understands (not ELF64 little-endian x86-64 / AArch64)."""


@dataclass(frozen=True)
class Slot:
    """A relocated slot holding the address of a symbol the file itself defines."""

    symbol: str
    offset: int  # the slot's address, relative to the load base
    value: int  # what the loader writes there when the file binds to itself, relative to the base


@dataclass(frozen=True)
class _Section:
    type: int
    offset: int
    size: int
    link: int
    entsize: int


class ElfFile:
    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                raise ElfError(f"{path}: not an ELF64 little-endian file")
            self.machine = struct.unpack_from("<H", head, 18)[0]
            if self.machine not in _SLOT_RELOCATIONS:
                raise ElfError(f"{path}: machine {self.machine} (only x86-64 and AArch64 are read)")
            phoff, shoff = struct.unpack_from("<QQ", head, 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 0x36)
            self._segments = [struct.unpack("<IIQQQQQQ", _read(f, phoff + i * phentsize, 56)) for i in range(phnum)]
            self._sections = []
            for i in range(shnum):
                fields = struct.unpack("<IIQQQQIIQQ", _read(f, shoff + i * shentsize, 64))
                self._sections.append(_Section(fields[1], fields[4], fields[5], fields[6], fields[9]))

    def needed(self) -> list[str]:
        """The DT_NEEDED entries, in order."""
        out = []
        with open(self.path, "rb") as f:
            for dynamic in (s for s in self._sections if s.type == _SHT_DYNAMIC):
                strtab = self._sections[dynamic.link]
                table = _read(f, dynamic.offset, dynamic.size)
                for tag, value in struct.iter_unpack("<qQ", table):
                    if tag == _DT_NULL:
                        break
                    if tag == _DT_NEEDED:
                        out.append(_string(f, strtab.offset + value))
        return out

    def self_bound_slots(self) -> list[Slot]:
        """The slots (GOT / PLT entries, absolute pointers) whose symbol this file defines:
        where the dynamic loader may bind the file's calls into itself to another object
        that defines the same name earlier in the lookup scope."""
        glob_dat, jump_slot, abs64 = _SLOT_RELOCATIONS[self.machine]
        out = []
        with open(self.path, "rb") as f:
            for rela in (s for s in self._sections if s.type == _SHT_RELA and s.link):
                symtab = self._sections[rela.link]
                strtab = self._sections[symtab.link]
                for r_offset, r_info, r_addend in struct.iter_unpack("<QQq", _read(f, rela.offset, rela.size)):
                    kind, index = r_info & 0xFFFFFFFF, r_info >> 32
                    if kind not in (glob_dat, jump_slot, abs64) or index == 0:
                        continue
                    name, _, _, shndx, value, _ = struct.unpack("<IBBHQQ", _read(f, symtab.offset + index * 24, 24))
                    if shndx == _SHN_UNDEF:
                        continue
                    out.append(Slot(_string(f, strtab.offset + name), r_offset,
                                    value + (r_addend if kind == abs64 else 0)))
        return out

    def relro(self) -> tuple[int, int] | None:
        """(start, size) of the range the loader makes read-only after relocating (PT_GNU_RELRO),
        relative to the load base; None without one."""
        for p_type, _, _, vaddr, _, _, memsz, _ in self._segments:
            if p_type == _PT_GNU_RELRO:
                return vaddr, memsz
        return None


def _read(f: BinaryIO, offset: int, size: int) -> bytes:
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise ElfError(f"{f.name}: truncated at offset {offset}")
    return data


def _string(f: BinaryIO, offset: int) -> str:
    f.seek(offset)
    chunk = b""
    while b"\0" not in chunk:
        more = f.read(256)
        if not more:
            break
        chunk += more
    return chunk.split(b"\0", 1)[0].decode("utf-8", "replace")
