"""Kernel modules (``.ko``, ``.ko.xz``, ``.ko.zst``): a relocatable object laid out at a base
address in module space and relocated, as the kernel's module loader does.

``load_module(path, kernel, base)`` places every allocated section at ``base`` and on (each
at its ``sh_addralign``), resolves the module's undefined symbols against the vmlinux's
(``kernel``: an ``Image``), and applies the ``.rela*`` records of every allocated section:
R_X86_64_64, PC32, PLT32, 32, 32S and PC64 (the ones x86-64 modules use; another type is
refused with its name).  So RIP-relative operands, call targets and the self-relative entries
of the module's own site tables (``__ex_table``, ``.altinstructions``, ``.return_sites``,
``__jump_table``, ``.static_call_sites``, ...) hold the values they have once loaded.  A symbol
neither the module nor the kernel defines (an export of another module) resolves to a
placeholder address far from the module and is listed in ``Image.notes``.

Every failure is an ``ImageError`` with one line, as for the other loaders.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import struct

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection

from ..errors import ImageError
from .image import SHF_ALLOC, SHF_EXECINSTR, Image, ImageSource, OpenInput, Section, Symbol, one_line

MODULES_VADDR = 0xFFFFFFFFC0000000  # where module space starts on x86-64
MODULE_BASE = 0xFFFFFFFFC0100000  # the first module's place in module space
UNRESOLVED = 0xFFFFFFFFFF000000  # where a symbol of another module is taken to be
MASK64 = (1 << 64) - 1

# R_X86_64_* -> (size, signed, pc-relative)
_RELOCS = {1: (8, False, False), 2: (4, True, True), 4: (4, True, True), 10: (4, False, False),
           11: (4, True, False), 24: (8, False, True)}
_RELOC_NAMES = {1: "R_X86_64_64", 2: "R_X86_64_PC32", 4: "R_X86_64_PLT32", 10: "R_X86_64_32",
                11: "R_X86_64_32S", 24: "R_X86_64_PC64"}


def read_object(path: str) -> bytes:
    """The object's bytes, decompressed when it is ``.ko.xz`` or ``.ko.zst``."""
    with OpenInput(path, "kernel module") as handle:
        data = handle.read()
    try:
        if data[:6] == b"\xfd7zXZ\x00":
            return lzma.decompress(data)
        if data[:4] == b"\x28\xb5\x2f\xfd":
            import zstandard

            return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    except (lzma.LZMAError, ValueError, OSError) as exc:
        raise ImageError(f"{path}: corrupt compressed module: {one_line(exc)}") from None
    return data


MODULES_END = UNRESOLVED  # module space ends where other modules' symbols are taken to be


def load_modules(paths, kernel: Image | None, base: int = MODULE_BASE):
    """``(path, image)`` of each module, laid out one after the other from ``base`` on the next
    MiB, as module_alloc spreads them; when module space (1 GiB) runs out, the next module starts
    at ``MODULE_BASE`` again.  Each module is verified on its own, so no two need coexist."""
    for path in paths:
        image = load_module(path, kernel, base)
        end = max((s.end for s in image.sections), default=base)
        if end > MODULES_END and base != MODULE_BASE:
            base = MODULE_BASE
            image = load_module(path, kernel, base)
            end = max((s.end for s in image.sections), default=base)
        yield path, image
        base = (end + 0xFFFFF) & ~0xFFFFF


def load_module(path: str | os.PathLike, kernel: Image | None, base: int = MODULE_BASE) -> Image:
    """The module at ``path`` laid out at ``base`` and relocated against ``kernel``'s symbols."""
    path = os.fspath(path)
    data = read_object(path)
    if data[:4] != b"\x7fELF":
        raise ImageError(f"{path}: not an ELF object (a .ko, .ko.xz or .ko.zst module)")
    try:
        return _load(path, bytearray(data), kernel, base)
    except (ELFError, struct.error, IndexError, KeyError, ValueError, AttributeError) as exc:
        raise ImageError(f"{path}: malformed module: {one_line(exc)}") from None


def _load(path: str, data: bytearray, kernel: Image | None, base: int) -> Image:
    elf = ELFFile(io.BytesIO(bytes(data)))
    if elf.header["e_type"] != "ET_REL" or elf.header["e_machine"] != "EM_X86_64":
        raise ImageError(f"{path}: not an x86-64 relocatable object (e_type {elf.header['e_type']})")
    addresses: dict[int, int] = {}
    contents: dict[int, bytearray] = {}
    at = base
    for index, sec in enumerate(elf.iter_sections()):
        flags = sec["sh_flags"]
        if not flags & SHF_ALLOC or not sec["sh_size"]:
            continue
        align = max(sec["sh_addralign"], 1)
        at = (at + align - 1) // align * align
        addresses[index] = at
        contents[index] = bytearray(b"" if sec["sh_type"] == "SHT_NOBITS" else sec.data())
        at += sec["sh_size"]
    symtab = elf.get_section_by_name(".symtab")
    if symtab is None:
        raise ImageError(f"{path}: a module without a symbol table")
    values, symbols, unresolved = [], [], []
    for sym in symtab.iter_symbols():
        shndx = sym["st_shndx"]
        if shndx == "SHN_UNDEF":
            name = sym.name
            address = kernel.symbol_address(name) if kernel is not None and name else None
            if address is None and name:
                unresolved.append(name)
                address = UNRESOLVED
            elif name.startswith("__x86_"):
                # the kernel's thunks a call site names (__x86_indirect_thunk_REG, __x86_return_thunk):
                # kept as symbols of the module's image, not functions, so its retpoline sites know
                # their register as the vmlinux's do
                symbols.append(Symbol(name, address, 0, "other"))
            values.append(address or 0)
        elif shndx == "SHN_ABS":
            values.append(sym["st_value"])
        elif isinstance(shndx, int) and shndx in addresses:
            value = addresses[shndx] + sym["st_value"]
            values.append(value)
            kind = {"STT_FUNC": "func", "STT_OBJECT": "object"}.get(sym["st_info"]["type"], "other")
            if sym.name and kind != "other" or (sym.name and sym["st_size"]):
                symbols.append(Symbol(sym.name, value, sym["st_size"], kind))
        else:
            values.append(0)
    for sec in elf.iter_sections():
        if not isinstance(sec, RelocationSection):
            continue
        target = sec["sh_info"]
        if not 0 < target < elf.num_sections():
            raise ImageError(f"{path}: the relocation section {sec.name} applies to section {target}, which the "
                             f"module does not have: its code would be verified unrelocated")
        if target not in addresses:
            continue  # relocations of a section the loader does not keep (debug info, .modinfo)
        buf, section_address = contents[target], addresses[target]
        for rel in sec.iter_relocations():
            kind = rel["r_info_type"]
            if kind == 0:
                continue
            if kind not in _RELOCS:
                raise ImageError(f"{path}: relocation type {kind} is not supported (x86-64 modules use "
                                 f"{', '.join(_RELOC_NAMES.values())})")
            size, signed, pcrel = _RELOCS[kind]
            offset = rel["r_offset"]
            if offset + size > len(buf):
                raise ImageError(f"{path}: a {_RELOC_NAMES[kind]} relocation at offset {offset:#x} of "
                                 f"{elf.get_section(target).name} runs past its end ({len(buf):#x} bytes)")
            value = values[rel["r_info_sym"]] + rel["r_addend"]
            if pcrel:
                value -= section_address + offset
            if size == 4:
                # as the kernel's apply_relocate_add: the value mod 2^64, read as signed where the field is
                v = (value & MASK64) - ((1 << 64) if signed and value & MASK64 & (1 << 63) else 0)
                fits = -(1 << 31) <= v < (1 << 31) if signed else 0 <= v < (1 << 32)
                if not fits:
                    raise ImageError(f"{path}: a {_RELOC_NAMES[kind]} relocation at {section_address + offset:#x} "
                                     f"does not fit in 32 bits: lay the module out nearer the kernel")
                buf[offset:offset + 4] = struct.pack("<I", v & 0xFFFFFFFF)
            else:
                buf[offset:offset + 8] = struct.pack("<Q", value & MASK64)
    sections = []
    for index, sec in enumerate(elf.iter_sections()):
        if index not in addresses:
            continue
        nobits = sec["sh_type"] == "SHT_NOBITS"
        sections.append(Section(name=sec.name, address=addresses[index], data=b"" if nobits else bytes(contents[index]),
                                executable=bool(sec["sh_flags"] & SHF_EXECINSTR), flags=sec["sh_flags"],
                                offset=sec["sh_offset"], nobits_size=sec["sh_size"] if nobits else 0))
    symbols.sort(key=lambda s: (s.address, s.name))
    notes = []
    if unresolved:
        notes.append(f"{len(unresolved)} symbol(s) of other modules taken at {UNRESOLVED:#x}: "
                     f"{', '.join(sorted(set(unresolved))[:5])}{' ...' if len(set(unresolved)) > 5 else ''}")
    identity = hashlib.sha256(bytes(data) + base.to_bytes(8, "little")).hexdigest()
    source = ImageSource("module", os.path.abspath(path), identity, kernel=None if kernel is None else kernel.source,
                         base=base)
    return Image(path=path, identity=identity, format="module", compression=None, sections=tuple(sections),
                 symbols=tuple(symbols), symbol_source="elf", notes=tuple(notes), source=source)

