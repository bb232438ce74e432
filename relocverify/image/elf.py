"""Sections and symbols of an x86-64 ELF, read with pyelftools (section
headers) and struct (the symbol table: a vmlinux has ~120k symbols, too
many for one pyelftools object each).

Every failure is an ``ImageError`` with one line that says what is wrong."""

from __future__ import annotations

import hashlib
import io
import mmap
import struct
from operator import itemgetter
from typing import NamedTuple, Protocol

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from ..errors import ImageError
from .image import (EM_X86_64, ET_DYN, ET_EXEC, ET_REL, SHF_EXECINSTR, SHT_DYNSYM, SHT_NOBITS, SHT_NULL, SHT_REL, SHT_RELA,
                    SHT_STRTAB, SHT_SYMTAB, Section, Symbol, one_line)

# --- ELF -----------------------------------------------------------------

class Elf(NamedTuple):
    sections: tuple[Section, ...]
    symbols: tuple[Symbol, ...]
    extent: int  # bytes of the buffer that belong to the ELF
    symbol_table: str = "none"  # 'elf' (.symtab), 'dynsym' (only the exported ones), or 'none'


_DROPPED_TYPES = {SHT_NULL, SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_REL, SHT_DYNSYM}
_DROPPED_PREFIXES = (".debug", ".zdebug", ".rela", ".rel.")

_SYMBOL_KINDS = {0: "other", 1: "object", 2: "func", 10: "func"}  # NOTYPE, OBJECT, FUNC, GNU_IFUNC


def read_elf(path: str, buffer, from_payload: bool, memo: SymbolMemo | None = None) -> Elf:
    """The ELF in ``buffer``; ``memo``: symbol tables parsed before (``_parse_symtab``)."""
    what = "decompressed bzImage payload" if from_payload else "ELF"
    _check_elf_header(path, buffer, what)
    try:
        return _parse_elf(path, buffer, what, memo)
    except (ELFError, struct.error, ValueError, IndexError, UnicodeDecodeError, AttributeError) as exc:
        raise ImageError(f"{path}: malformed {what}: {one_line(exc)}") from None


def _check_elf_header(path: str, buffer, what: str) -> None:
    size = len(buffer)
    if size < 64:
        raise ImageError(f"{path}: truncated {what}: {size} bytes, shorter than an ELF header")
    ident = bytes(buffer[:16])
    if ident[4] != 2 or ident[5] != 1:
        raise ImageError(f"{path}: not a 64-bit little-endian ELF (class {ident[4]}, data {ident[5]}); "
                         "relocverify reads x86-64 kernels only")
    (e_type, e_machine, _, _, _, e_shoff, _, _, _, _, e_shentsize, e_shnum,
     e_shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", buffer, 16)
    if e_machine != EM_X86_64:
        raise ImageError(f"{path}: ELF machine {e_machine} is not x86-64 (62)")
    if e_type == ET_REL:
        raise ImageError(f"{path}: a relocatable object (a .ko module?) has no link-time addresses; "
                         "pass a linked vmlinux")
    if e_type not in (ET_EXEC, ET_DYN):  # ET_CORE (a core dump), ET_NONE, OS- and processor-specific types
        kind = {0: "an ELF of no type (ET_NONE)", 4: "a core dump (ET_CORE)"}.get(e_type, f"an ELF of type {e_type:#x}")
        raise ImageError(f"{path}: {kind}, not a program or a kernel: pass an executable, a shared library or a "
                         f"vmlinux")
    if e_shoff == 0:
        raise ImageError(f"{path}: {what} has no section headers; relocverify needs them")
    if e_shentsize != 64:
        raise ImageError(f"{path}: bad ELF header: e_shentsize {e_shentsize}, expected 64")
    if e_shoff + 64 > size:
        raise ImageError(f"{path}: truncated {what}: section headers at {e_shoff:#x} lie past "
                         f"the end of the file ({size:#x} bytes)")
    if e_shnum == 0:  # extended numbering: the count is in section 0's sh_size
        e_shnum = struct.unpack_from("<Q", buffer, e_shoff + 32)[0]
    if e_shstrndx == 0xFFFF:
        e_shstrndx = struct.unpack_from("<I", buffer, e_shoff + 40)[0]
    if e_shoff + e_shnum * 64 > size:
        raise ImageError(f"{path}: truncated or corrupt {what}: {e_shnum} section headers at "
                         f"{e_shoff:#x} need {e_shnum * 64:#x} bytes, the file has {size:#x}")
    if e_shstrndx >= e_shnum:
        raise ImageError(f"{path}: bad ELF header: section name table index {e_shstrndx} "
                         f"of {e_shnum} sections")


def _parse_elf(path: str, buffer, what: str, memo: SymbolMemo | None = None) -> Elf:
    size = len(buffer)
    stream = io.BytesIO(buffer) if isinstance(buffer, (bytes, bytearray)) else _MmapStream(buffer)
    elf = ELFFile(stream)
    header = elf.header
    sections: list[Section] = []
    symtab = dynsym = None
    raw = []
    for index, sec in enumerate(elf.iter_sections()):
        sh = sec.header
        kind, offset, length = sh["sh_type"], sh["sh_offset"], sh["sh_size"]
        type_number = kind if isinstance(kind, int) else _SHT_NUMBERS.get(kind, -1)
        raw.append((sec.name, type_number, offset, length, sh["sh_link"]))
        if type_number != SHT_NOBITS and length and offset + length > size:
            raise ImageError(f"{path}: truncated {what}: section {sec.name or index} ends at "
                             f"{offset + length:#x}, past the end of the file ({size:#x})")
        if type_number == SHT_SYMTAB:
            symtab = index
        if type_number == SHT_DYNSYM:
            dynsym = index
        if type_number in _DROPPED_TYPES or sec.name.startswith(_DROPPED_PREFIXES):
            continue
        flags = sh["sh_flags"]
        nobits = type_number == SHT_NOBITS
        data = b"" if nobits else bytes(buffer[offset:offset + length])
        sections.append(Section(name=sec.name, address=sh["sh_addr"], data=data,
                                executable=bool(flags & SHF_EXECINSTR), flags=flags,
                                offset=offset, nobits_size=length if nobits else 0))
    _refuse_conflicting_code(path, sections)
    # .symtab, else (a stripped executable or library) the exported functions of .dynsym
    table = symtab if symtab is not None else dynsym
    symbols = _parse_symtab(path, buffer, raw, table, memo) if table is not None else ()
    kind = "none" if not symbols else "elf" if table == symtab else "dynsym"
    extent = elf_extent(header["e_shoff"], elf.num_sections() * header["e_shentsize"],
                        ((t, offset, length) for _, t, offset, length, _ in raw))
    return Elf(tuple(sections), symbols, extent, kind)


def elf_extent(shoff: int, table_size: int, headers) -> int:
    """How many bytes from the start belong to the ELF: to the end of its section header table
    (``table_size`` bytes at ``shoff``) or of its furthest section with contents, whichever is
    further.  ``headers``: each section's (type, offset, size).  What an image's identity hashes
    (``loader.load_image``, ``loader.remembered_identity``): a bzImage's decompressed ELF is
    followed by its relocations, which are not the ELF."""
    return max([shoff + table_size] + [offset + length for kind, offset, length in headers
                                       if kind != SHT_NOBITS and length])


def _refuse_conflicting_code(path: str, sections: list[Section]) -> None:
    """Two executable sections that claim the same addresses with different bytes: which bytes run there is
    not known, so no verdict could stand for them."""
    code = sorted((s for s in sections if s.executable and s.data), key=lambda s: s.address)
    for a, b in zip(code, code[1:]):
        lo, hi = b.address, min(a.address + len(a.data), b.address + len(b.data))
        if lo < hi and a.data[lo - a.address:hi - a.address] != b.data[lo - b.address:hi - b.address]:
            raise ImageError(f"{path}: executable sections {a.name} and {b.name} both map {lo:#x}..{hi:#x} with "
                             f"different bytes: which ones run is not known")


_SHT_NUMBERS = {"SHT_NULL": 0, "SHT_PROGBITS": 1, "SHT_SYMTAB": 2, "SHT_STRTAB": 3,
                "SHT_RELA": 4, "SHT_HASH": 5, "SHT_DYNAMIC": 6, "SHT_NOTE": 7,
                "SHT_NOBITS": 8, "SHT_REL": 9, "SHT_DYNSYM": 11}


class _MmapStream:
    """A read-only file-like view of an mmap, for pyelftools."""

    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer, self.position = buffer, 0

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.position, 2: len(self.buffer)}[whence]
        self.position = base + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def read(self, size: int = -1) -> bytes:
        end = len(self.buffer) if size is None or size < 0 else self.position + size
        data = self.buffer[self.position:end]
        self.position += len(data)
        return data


class SymbolMemo(Protocol):
    """Symbol tables parsed before, by a digest of their bytes (``loader.SymbolFiles``): ``get`` gives the
    (name, address, size, kind) rows ``_parse_symtab`` made, or None; ``put`` keeps them."""

    def get(self, key: bytes) -> list | None: ...

    def put(self, key: bytes, rows: list) -> None: ...


#: What a symbol memo's key covers besides the tables' bytes: a change to ``_symbol_rows`` changes it.
SYMTAB_FORMAT = b"symtab-1"
#: The smallest symbol table (bytes; about 2,700 symbols) a memo is asked about: smaller ones parse in a few ms.
MEMO_FROM = 64 << 10


def _parse_symtab(path: str, buffer, raw: list, index: int, memo: SymbolMemo | None = None) -> tuple[Symbol, ...]:
    """Elf64_Sym records, read straight with struct: a vmlinux has ~120k of them, too many for one pyelftools
    object each.  With ``memo``, the rows of tables with the same bytes (the symbol and the string table)
    are read back instead: parsing a vmlinux's took 0.15-0.2 s, reading its rows back 0.03 s."""
    _, _, offset, length, link = raw[index]
    if link >= len(raw):
        raise ImageError(f"{path}: bad symbol table: string table index {link} out of range")
    _, _, str_offset, str_length, _ = raw[link]
    strings = bytes(buffer[str_offset:str_offset + str_length])
    table = bytes(buffer[offset:offset + length - length % 24])
    if len(table) < MEMO_FROM:
        memo = None  # parsed in a few milliseconds: not worth a file
    key = None
    if memo is not None:
        key = hashlib.blake2b(SYMTAB_FORMAT + len(table).to_bytes(8, "little") + table + strings,
                              digest_size=16).digest()
        rows = memo.get(key)
        if rows is not None:
            return tuple(map(Symbol._make, rows))
    rows = _symbol_rows(path, table, strings)
    if memo is not None:
        memo.put(key, rows)
    return tuple(map(Symbol._make, rows))


def _symbol_rows(path: str, table: bytes, strings: bytes) -> list[tuple[str, int, int, str]]:
    """The (name, address, size, kind) of each named symbol of a kind we keep, sorted by (address, name)."""
    rows = []
    for st_name, st_info, _, st_shndx, st_value, st_size in struct.iter_unpack("<IBBHQQ", table):
        kind = _SYMBOL_KINDS.get(st_info & 0xF)
        if kind is None or st_shndx == 0 or not st_name:
            continue
        end = strings.find(b"\0", st_name)
        if st_name >= len(strings) or end < 0:
            raise ImageError(f"{path}: bad symbol table: name offset {st_name:#x} outside the string table")
        rows.append((strings[st_name:end].decode("utf-8", "replace"), st_value, st_size, kind))
    rows.sort(key=_ADDRESS_NAME)
    return rows


_ADDRESS_NAME = itemgetter(1, 0)

