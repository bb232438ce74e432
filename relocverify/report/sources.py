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
import os
import posixpath

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

    def __init__(self, starts: list[int], ends: list[int], cus: list[int], dwarf) -> None:
        self._starts, self._ends, self._cus, self._dwarf = starts, ends, cus, dwarf
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
        except (ELFError, OSError, ValueError, KeyError):
            return cls([], [], [], None)
        return cls([r[0] for r in ranges], [r[1] for r in ranges], [r[2] for r in ranges], dwarf)

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
        try:
            name = self._dwarf.get_CU_at(offset).get_top_DIE().attributes.get("DW_AT_name")
        except (ELFError, KeyError, ValueError, IndexError):
            return "(unreadable compile unit)"
        if name is None:
            return "(unnamed compile unit)"
        value = name.value.decode("utf-8", "replace") if isinstance(name.value, bytes) else str(name.value)
        return source_directory(value)
