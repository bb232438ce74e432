"""Where an address comes from in the kernel's source tree, for grouping rejections.

``SourceNames.open(path)`` reads the image's DWARF ``.debug_aranges`` (address
ranges to compile units) and names an address by its compile unit's
``DW_AT_name`` directory (``arch/x86/kernel``); only the compile units asked
for are read.  Without DWARF (a stripped image, a bzImage, a missing file) it
falls back to the symbol-name prefix up to the first ``_`` (``ext4``,
``tcp``), and ``kind`` says which of the two the report shows.
"""

from __future__ import annotations

import bisect
import mmap
import os
import posixpath
import struct

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

DWARF = "DWARF compile-unit directory (DW_AT_name of the CU in .debug_aranges)"
PREFIX = "symbol-name prefix (up to the first '_'; the image has no DWARF address ranges)"


def name_prefix(function: str) -> str:
    """The subsystem guess from a symbol name: its text up to the first '_' after any leading ones."""
    stripped = function.lstrip("_.")
    head = stripped.split("_", 1)[0].split(".", 1)[0]
    return head or function or "?"


def source_directory(cu_name: str) -> str:
    """``arch/x86/kernel/head64.c`` -> ``arch/x86/kernel``; build-path prefixes before the tree are dropped."""
    path = cu_name.replace("\\", "/")
    for marker in ("/arch/", "/kernel/", "/drivers/", "/fs/", "/mm/", "/net/", "/lib/", "/block/", "/security/",
                   "/crypto/", "/init/", "/ipc/", "/sound/", "/virt/", "/certs/", "/io_uring/"):
        if posixpath.isabs(path) and marker in path:
            path = path[path.index(marker) + 1:]
            break
    return posixpath.dirname(path) or path


class SourceNames:
    """Names an address by its source directory (DWARF) or its function's name prefix."""

    def __init__(self, starts: list[int], ends: list[int], cus: list[int], dwarf, reader=None) -> None:
        self._starts, self._ends, self._cus, self._dwarf, self._reader = starts, ends, cus, dwarf, reader
        self._names: dict[int, str] = {}
        self.kind = DWARF if starts else PREFIX

    @classmethod
    def open(cls, path: str | None) -> "SourceNames":
        if not path or not os.path.isfile(path):
            return cls([], [], [], None)
        try:
            fh = open(path, "rb")
            elf = ELFFile(fh)
            if elf.get_section_by_name(".debug_aranges") is None:
                fh.close()
                return cls([], [], [], None)
            dwarf = elf.get_dwarf_info(relocate_dwarf_sections=False)
            ranges = sorted((e.begin_addr, e.begin_addr + e.length, e.info_offset)
                            for e in dwarf.get_aranges().entries if e.length)
            reader = CompileUnitNames.open(fh, elf)
        except (ELFError, OSError, ValueError, KeyError):
            return cls([], [], [], None)
        return cls([r[0] for r in ranges], [r[1] for r in ranges], [r[2] for r in ranges], dwarf, reader)

    def name(self, address: int, function: str) -> str:
        if not self._starts:
            return name_prefix(function)
        i = bisect.bisect_right(self._starts, address) - 1
        if i < 0 or address >= self._ends[i]:
            return "(no compile unit)"
        cu = self._cus[i]
        hit = self._names.get(cu)
        if hit is None:
            hit = self._names[cu] = self._cu_directory(cu)
        return hit

    def _cu_directory(self, offset: int) -> str:
        fast = self._reader.name(offset) if self._reader is not None else None
        if fast is not None:
            return source_directory(fast)
        try:
            name = self._dwarf.get_CU_at(offset).get_top_DIE().attributes.get("DW_AT_name")
        except (ELFError, KeyError, ValueError, IndexError):
            return "(unreadable compile unit)"
        if name is None:
            return "(unnamed compile unit)"
        value = name.value.decode("utf-8", "replace") if isinstance(name.value, bytes) else str(name.value)
        return source_directory(value)


# DWARF constants the compile-unit reader needs (DWARF 5, section 7.5).
DW_AT_NAME = 0x03
_FIXED = {0x01: 8, 0x05: 2, 0x06: 4, 0x07: 8, 0x0B: 1, 0x0C: 1, 0x0E: 4, 0x10: 4, 0x11: 1, 0x12: 2, 0x13: 4,
          0x14: 8, 0x17: 4, 0x19: 0, 0x1E: 16, 0x1F: 4, 0x20: 8, 0x21: 0, 0x25: 1, 0x26: 2, 0x27: 3, 0x28: 4,
          0x29: 1, 0x2A: 2, 0x2B: 3, 0x2C: 4}
_ULEB = {0x0D, 0x0F, 0x15, 0x1A, 0x1B, 0x22, 0x23}
DW_FORM_STRING, DW_FORM_STRP, DW_FORM_LINE_STRP, DW_FORM_ADDR = 0x08, 0x0E, 0x1F, 0x01


def _uleb(buf, p: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        b = buf[p]
        p += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, p


class CompileUnitNames:
    """The ``DW_AT_name`` of a compile unit read from its first DIE alone (pyelftools parses the unit's
    whole abbreviation table first, ~20 ms a unit).  Reads 32-bit DWARF 2-5 with the name in ``strp``,
    ``line_strp`` or ``string`` form from uncompressed sections; anything else answers None, and the
    caller asks pyelftools."""

    def __init__(self, data, sections: dict[str, tuple[int, int]]):
        self._data, self._sections = data, sections

    @classmethod
    def open(cls, fh, elf) -> "CompileUnitNames | None":
        sections = {}
        for name in (".debug_info", ".debug_abbrev", ".debug_str", ".debug_line_str"):
            sec = elf.get_section_by_name(name)
            if sec is None or sec["sh_flags"] & 0x800:  # SHF_COMPRESSED
                continue
            sections[name] = (sec["sh_offset"], sec["sh_size"])
        if ".debug_info" not in sections or ".debug_abbrev" not in sections:
            return None
        return cls(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), sections)

    def _cstr(self, section: str, offset: int) -> str | None:
        if section not in self._sections:
            return None
        base, size = self._sections[section]
        if offset >= size:
            return None
        end = self._data.find(b"\0", base + offset, base + size)
        return None if end < 0 else self._data[base + offset:end].decode("utf-8", "replace")

    def name(self, offset: int) -> str | None:
        try:
            return self._name(offset)
        except (IndexError, struct.error, KeyError):
            return None

    def _name(self, offset: int) -> str | None:
        d = self._data
        info = self._sections[".debug_info"][0]
        p = info + offset
        if struct.unpack_from("<I", d, p)[0] >= 0xFFFFFFF0:
            return None  # 64-bit DWARF
        version = struct.unpack_from("<H", d, p + 4)[0]
        if version >= 5:
            addr_size, abbrev = d[p + 7], struct.unpack_from("<I", d, p + 8)[0]
            p += 12
        else:
            abbrev, addr_size = struct.unpack_from("<I", d, p + 6)[0], d[p + 10]
            p += 11
        code, p = _uleb(d, p)
        q = self._sections[".debug_abbrev"][0] + abbrev
        while True:  # the abbreviation with this code, its (attribute, form) list
            c, q = _uleb(d, q)
            if c == 0:
                return None
            _, q = _uleb(d, q)
            q += 1  # children flag
            attrs = []
            while True:
                at, q = _uleb(d, q)
                form, q = _uleb(d, q)
                if form == 0x21:
                    _, q = _uleb(d, q)  # implicit_const: the value is in the abbreviation
                if at == 0 and form == 0:
                    break
                attrs.append((at, form))
            if c == code:
                break
        for at, form in attrs:
            if at == DW_AT_NAME:
                if form == DW_FORM_STRP:
                    return self._cstr(".debug_str", struct.unpack_from("<I", d, p)[0])
                if form == DW_FORM_LINE_STRP:
                    return self._cstr(".debug_line_str", struct.unpack_from("<I", d, p)[0])
                if form == DW_FORM_STRING:
                    end = d.find(b"\0", p)
                    return d[p:end].decode("utf-8", "replace")
                return None
            if form == DW_FORM_STRING:
                p = d.find(b"\0", p) + 1
            elif form == DW_FORM_ADDR:
                p += addr_size
            elif form in _FIXED:
                p += _FIXED[form]
            elif form in _ULEB:
                _, p = _uleb(d, p)
            elif form == 0x18:  # exprloc
                n, p = _uleb(d, p)
                p += n
            else:
                return None
        return None
