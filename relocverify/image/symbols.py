"""Symbols from a System.map or /proc/kallsyms file."""

from __future__ import annotations

import bisect
import os

from ..errors import ImageError
from .image import KASLR_ALIGN, OpenInput, Section, Symbol

# --- System.map / kallsyms -------------------------------------------------

_FUNC_TYPES = frozenset("tTwW")
_OBJECT_TYPES = frozenset("dDbBrRvVgGsS")

#: Symbols whose System.map address must equal the start of a section.
_ANCHORS = (("_stext", ".text"), ("__start___ex_table", "__ex_table"),
            ("__alt_instructions", ".altinstructions"), ("__parainstructions", ".parainstructions"),
            ("__smp_locks", ".smp_locks"), ("_sinittext", ".init.text"))


def load_system_map(path: str | os.PathLike, sections: tuple[Section, ...] = ()) -> tuple[tuple[Symbol, ...], list[str]]:
    """Symbols from a System.map or /proc/kallsyms file.

    ``t/T/w/W`` symbols in an executable section are ``func``; data types are
    ``object``; the rest ``other``.  Module symbols (``[name]``) are skipped.
    If ``_stext`` is off from ``.text`` by a multiple of 2 MiB (a KASLR'd
    kallsyms) the kernel-image symbols are rebased; any other disagreement
    with the image's section addresses is an error.
    """
    path = os.fspath(path)
    with OpenInput(path, "System.map") as handle:
        text = handle.read(256 << 20)
    entries = _parse_map_lines(path, text)
    notes: list[str] = []
    by_name = {}
    for address, _, name in entries:
        by_name.setdefault(name, address)
    if len(entries) > 1 and all(address == 0 for address, _, _ in entries):
        raise ImageError(f"{path}: every address is zero (kptr_restrict hides them); "
                         "read /proc/kallsyms as root or use the build's System.map")
    sections_by_name = {s.name: s for s in sections}
    text_section = sections_by_name.get(".text")
    delta = 0
    if text_section is not None and "_stext" in by_name and by_name["_stext"] != text_section.address:
        delta = by_name["_stext"] - text_section.address
        if delta % KASLR_ALIGN:
            raise ImageError(f"{path}: System.map does not match this image: _stext is "
                             f"{by_name['_stext']:#x}, .text starts at {text_section.address:#x}; "
                             "pass the map from the same build")
        notes.append(f"System.map rebased by {-delta:#x} (KASLR-shifted kallsyms)")
    for symbol, section_name in _ANCHORS:
        section = sections_by_name.get(section_name)
        if section is not None and symbol in by_name and by_name[symbol] - delta != section.address:
            raise ImageError(f"{path}: System.map does not match this image: {symbol} is "
                             f"{by_name[symbol] - delta:#x}, section {section_name} starts at "
                             f"{section.address:#x}; pass the map from the same build")
    executable = sorted((s.address, s.end) for s in sections if s.executable and s.alloc)
    starts = [start for start, _ in executable]
    symbols = []
    for address, letter, name in entries:
        if delta and letter not in "aA" and address >= 0xFFFFFFFF80000000:
            address -= delta
        symbols.append(Symbol(name, address, None, _map_kind(letter, address, executable, starts)))
    symbols.sort(key=lambda s: (s.address, s.name))
    return tuple(symbols), notes


def _parse_map_lines(path: str, text: bytes) -> list[tuple[int, str, str]]:
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if b"System.map" in line and b"dbg" in line:
            raise ImageError(f"{path}: placeholder System.map (Debian's /boot one points to the -dbg "
                             "package): pass usr/lib/debug/boot/System.map-<version> from "
                             "linux-image-<version>-dbg")
        if len(parts) == 4 and parts[3].startswith(b"[") and parts[3].endswith(b"]"):
            continue  # a module symbol from /proc/kallsyms
        if len(parts) != 3 or len(parts[1]) != 1:
            raise ImageError(f"{path}:{number}: not a System.map line ({line[:60]!r}); "
                             "expected 'ffffffff81000000 T _stext'")
        try:
            address = int(parts[0], 16)
        except ValueError:
            raise ImageError(f"{path}:{number}: bad address {parts[0][:20]!r} in System.map") from None
        entries.append((address, parts[1].decode("ascii", "replace"),
                        parts[2].decode("utf-8", "replace")))
    if not entries:
        raise ImageError(f"{path}: empty System.map: pass the one from the -dbg package")
    return entries


def _map_kind(letter: str, address: int, executable: list, starts: list) -> str:
    if letter in _FUNC_TYPES:
        i = bisect.bisect_right(starts, address) - 1
        if not executable or (i >= 0 and address < executable[i][1]):
            return "func"
        return "other"
    if letter in _OBJECT_TYPES:
        return "object"
    return "other"

