"""The image stage: a kernel as sections and symbols.

``load_image(path, system_map=None)`` accepts

* an x86-64 ELF ``vmlinux``, unstripped (symbols from ``.symtab``) or
  stripped (no symbols unless a System.map is given);
* a ``vmlinuz``/bzImage: the x86 boot protocol setup header (``HdrS`` at
  0x202, protocol >= 2.08) locates the compressed payload, which is
  decompressed by its magic (xz, lz4 legacy frames, zstd, gzip, bzip2, lzma;
  lzo is recognised and refused with a way out) and must be an ELF;
* optionally a ``System.map`` or ``/proc/kallsyms`` file, whose symbols
  replace the ELF's (a KASLR-shifted kallsyms is rebased onto the image).

What is kept: every section except DWARF, relocation, symbol and string
tables (the symbols are parsed into ``Image.symbols``); ``SHT_NOBITS``
sections are kept with empty data and read back as zeros.  ELF relocations
are not applied: in a linked vmlinux the section contents already hold the
final link-time values (``--emit-relocs`` only leaves a record of them).

Every failure to read the input is an :class:`ImageError` with a one-line
message that says what is wrong and how to fix it; third-party exceptions
(pyelftools, struct, lzma, zlib, bz2, lz4, zstd) are converted here.
"""

from __future__ import annotations

import bisect
import bz2
import hashlib
import io
import lzma
import mmap
import os
import struct
import zlib
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from .errors import ImageError

SHF_WRITE = 0x1
SHF_ALLOC = 0x2
SHF_EXECINSTR = 0x4

SHT_NULL = 0
SHT_SYMTAB = 2
SHT_STRTAB = 3
SHT_RELA = 4
SHT_NOBITS = 8
SHT_REL = 9
SHT_DYNSYM = 11

EM_X86_64 = 62
ET_REL = 1

#: Ceiling on a decompressed bzImage payload; Debian's vmlinux.bin is ~60 MB.
MAX_PAYLOAD = 1 << 30

#: KASLR moves the kernel in steps of CONFIG_PHYSICAL_ALIGN (2 MiB on x86-64).
KASLR_ALIGN = 0x200000


@dataclass(frozen=True)
class Section:
    """One ELF section: its bytes as linked, at its link-time address.

    ``data`` is empty for ``SHT_NOBITS`` sections; ``size`` is the memory
    size either way.  ``offset`` is the file offset inside the ELF (inside
    the decompressed payload for a bzImage).
    """

    name: str
    address: int
    data: bytes
    executable: bool
    flags: int = 0
    offset: int = 0
    nobits_size: int = 0

    @property
    def size(self) -> int:
        return self.nobits_size or len(self.data)

    @property
    def end(self) -> int:
        return self.address + self.size

    @property
    def alloc(self) -> bool:
        return bool(self.flags & SHF_ALLOC)

    def contains(self, address: int, size: int = 1) -> bool:
        return self.address <= address and address + size <= self.end


@dataclass(frozen=True)
class Symbol:
    """A named address.  ``size`` is None when it came from System.map."""

    name: str
    address: int
    size: int | None
    kind: str  # 'func' | 'object' | 'other'


@dataclass(frozen=True)
class Image:
    """A loaded kernel image.

    ``identity`` is the sha256 of the ELF bytes (for a bzImage, of the
    decompressed ELF, trimmed of the relocation table appended after it).
    ``symbols`` are sorted by (address, name).  ``notes`` records what the
    loader assumed or adjusted (e.g. a rebased kallsyms).
    """

    path: str
    identity: str
    format: str  # 'elf' | 'bzimage'
    compression: str | None
    sections: tuple[Section, ...]
    symbols: tuple[Symbol, ...]
    symbol_source: str  # 'elf' | 'system.map' | 'none'
    notes: tuple[str, ...] = ()
    _by_name: dict = field(init=False, repr=False, compare=False)
    _mapped: tuple = field(init=False, repr=False, compare=False)
    _mapped_starts: list = field(init=False, repr=False, compare=False)
    _symbol_addresses: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, Section] = {}
        for section in self.sections:
            by_name.setdefault(section.name, section)
        mapped = tuple(sorted((s for s in self.sections if s.alloc and s.size),
                              key=lambda s: (s.address, s.name)))
        addresses: dict[str, int] = {}
        for symbol in self.symbols:
            addresses.setdefault(symbol.name, symbol.address)
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_mapped", mapped)
        object.__setattr__(self, "_mapped_starts", [s.address for s in mapped])
        object.__setattr__(self, "_symbol_addresses", addresses)

    def num_sections(self) -> int:
        return len(self.sections)

    def get_section(self, name: str) -> Section | None:
        return self._by_name.get(name)

    def has_section(self, name: str) -> bool:
        return name in self._by_name

    def iter_sections(self) -> Iterator[Section]:
        return iter(self.sections)

    def iter_executable_sections(self) -> Iterator[Section]:
        return (s for s in self.sections if s.executable and s.alloc and s.data)

    def has_symbols(self) -> bool:
        return bool(self.symbols)

    def symbol_address(self, name: str) -> int | None:
        """The address of ``name`` (the first one in address order)."""
        return self._symbol_addresses.get(name)

    def section_at(self, address: int) -> Section | None:
        """The allocated section holding ``address``, or None."""
        i = bisect.bisect_right(self._mapped_starts, address) - 1
        if i >= 0 and address < self._mapped[i].end:
            return self._mapped[i]
        return None

    def is_executable(self, address: int) -> bool:
        section = self.section_at(address)
        return section is not None and section.executable

    def read(self, address: int, size: int) -> bytes:
        """``size`` bytes at a link-time address, from one allocated section."""
        section = self.section_at(address)
        if section is None or not section.contains(address, size):
            raise ImageError(f"{self.path}: no section maps {size} bytes at {address:#x}")
        if not section.data:
            return bytes(size)
        start = address - section.address
        return section.data[start:start + size]


# --- entry point ---------------------------------------------------------

def load_image(path: str | os.PathLike, system_map: str | os.PathLike | None = None) -> Image:
    """Load a vmlinux ELF or a bzImage, with symbols from ``system_map`` if given."""
    path = os.fspath(path)
    with _OpenInput(path, "kernel image") as handle:
        head = handle.read(0x400)
        if head[:4] == b"\x7fELF":
            buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            format_, compression = "elf", None
        elif _is_bzimage(head):
            buffer = _bzimage_payload(path, handle.read, head)
            format_, compression = "bzimage", _compression_of(path, buffer)
            buffer = _decompress(path, buffer, compression)
        else:
            raise ImageError(f"{path}: not an ELF vmlinux or a bzImage (starts with {head[:8].hex()}); "
                             "pass vmlinux from the -dbg package or /boot/vmlinuz-*")
    try:
        elf = _read_elf(path, buffer, from_payload=format_ == "bzimage")
        symbols, source = elf.symbols, ("elf" if elf.symbols else "none")
        notes: list[str] = []
        if system_map is not None:
            symbols, map_notes = load_system_map(system_map, elf.sections)
            source = "system.map"
            notes.extend(map_notes)
        identity = hashlib.sha256(memoryview(buffer)[:elf.extent]).hexdigest()
    finally:
        if isinstance(buffer, mmap.mmap):
            buffer.close()
    return Image(path=path, identity=identity, format=format_, compression=compression,
                 sections=elf.sections, symbols=symbols, symbol_source=source,
                 notes=tuple(notes))


class _OpenInput:
    """``open(path, 'rb')`` whose failures are one-line ImageErrors."""

    def __init__(self, path: str, what: str) -> None:
        self.path, self.what = path, what

    def __enter__(self):
        if os.path.isdir(self.path):
            raise ImageError(f"{self.path}: is a directory, not a {self.what} file")
        try:
            self.handle = open(self.path, "rb")
        except FileNotFoundError:
            raise ImageError(f"{self.path}: no such file (expected a {self.what})") from None
        except OSError as exc:
            raise ImageError(f"{self.path}: cannot open {self.what}: {exc.strerror}") from None
        return self.handle

    def __exit__(self, *exc) -> None:
        self.handle.close()


# --- ELF -----------------------------------------------------------------

class _Elf(NamedTuple):
    sections: tuple[Section, ...]
    symbols: tuple[Symbol, ...]
    extent: int  # bytes of the buffer that belong to the ELF


_DROPPED_TYPES = {SHT_NULL, SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_REL, SHT_DYNSYM}
_DROPPED_PREFIXES = (".debug", ".zdebug", ".rela", ".rel.")

_SYMBOL_KINDS = {0: "other", 1: "object", 2: "func", 10: "func"}  # NOTYPE, OBJECT, FUNC, GNU_IFUNC


def _read_elf(path: str, buffer, from_payload: bool) -> _Elf:
    what = "decompressed bzImage payload" if from_payload else "ELF"
    _check_elf_header(path, buffer, what)
    try:
        return _parse_elf(path, buffer, what)
    except (ELFError, struct.error, ValueError, IndexError, UnicodeDecodeError, AttributeError) as exc:
        raise ImageError(f"{path}: malformed {what}: {_one_line(exc)}") from None


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


def _parse_elf(path: str, buffer, what: str) -> _Elf:
    size = len(buffer)
    stream = io.BytesIO(buffer) if isinstance(buffer, (bytes, bytearray)) else _MmapStream(buffer)
    elf = ELFFile(stream)
    header = elf.header
    extent = header["e_shoff"] + elf.num_sections() * header["e_shentsize"]
    sections: list[Section] = []
    symtab = None
    raw = []
    for index, sec in enumerate(elf.iter_sections()):
        sh = sec.header
        kind, offset, length = sh["sh_type"], sh["sh_offset"], sh["sh_size"]
        type_number = kind if isinstance(kind, int) else _SHT_NUMBERS.get(kind, -1)
        raw.append((sec.name, type_number, offset, length, sh["sh_link"]))
        if type_number != SHT_NOBITS and length:
            if offset + length > size:
                raise ImageError(f"{path}: truncated {what}: section {sec.name or index} ends at "
                                 f"{offset + length:#x}, past the end of the file ({size:#x})")
            extent = max(extent, offset + length)
        if type_number == SHT_SYMTAB:
            symtab = index
        if type_number in _DROPPED_TYPES or sec.name.startswith(_DROPPED_PREFIXES):
            continue
        flags = sh["sh_flags"]
        nobits = type_number == SHT_NOBITS
        data = b"" if nobits else bytes(buffer[offset:offset + length])
        sections.append(Section(name=sec.name, address=sh["sh_addr"], data=data,
                                executable=bool(flags & SHF_EXECINSTR), flags=flags,
                                offset=offset, nobits_size=length if nobits else 0))
    symbols = _parse_symtab(path, buffer, raw, symtab) if symtab is not None else ()
    return _Elf(tuple(sections), symbols, extent)


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


def _parse_symtab(path: str, buffer, raw: list, index: int) -> tuple[Symbol, ...]:
    """Elf64_Sym records, read straight with struct: a vmlinux has ~120k of
    them, too many for one pyelftools object each."""
    _, _, offset, length, link = raw[index]
    if link >= len(raw):
        raise ImageError(f"{path}: bad symbol table: string table index {link} out of range")
    _, _, str_offset, str_length, _ = raw[link]
    strings = bytes(buffer[str_offset:str_offset + str_length])
    table = bytes(buffer[offset:offset + length - length % 24])
    symbols = []
    for st_name, st_info, _, st_shndx, st_value, st_size in struct.iter_unpack("<IBBHQQ", table):
        kind = _SYMBOL_KINDS.get(st_info & 0xF)
        if kind is None or st_shndx == 0 or not st_name:
            continue
        end = strings.find(b"\0", st_name)
        if st_name >= len(strings) or end < 0:
            raise ImageError(f"{path}: bad symbol table: name offset {st_name:#x} outside the string table")
        symbols.append(Symbol(strings[st_name:end].decode("utf-8", "replace"), st_value, st_size, kind))
    symbols.sort(key=lambda s: (s.address, s.name))
    return tuple(symbols)


# --- bzImage ---------------------------------------------------------------

class _Codec(NamedTuple):
    name: str
    magic: bytes


#: Payload compressors of arch/x86/boot/compressed, told apart by magic.
CODECS = (
    _Codec("xz", b"\xfd7zXZ\x00"),
    _Codec("lz4", b"\x02\x21\x4c\x18"),   # lz4 legacy frame format (lz4 -l)
    _Codec("zstd", b"\x28\xb5\x2f\xfd"),
    _Codec("gzip", b"\x1f\x8b"),
    _Codec("bzip2", b"BZh"),
    _Codec("lzo", b"\x89LZO\x00"),
    _Codec("lzma", b"\x5d\x00\x00"),
)


def _is_bzimage(head: bytes) -> bool:
    return len(head) >= 0x250 and head[0x202:0x206] == b"HdrS"


def _bzimage_payload(path: str, read, head: bytes) -> bytes:
    """The compressed payload bytes, located by the setup header."""
    version = struct.unpack_from("<H", head, 0x206)[0]
    if version < 0x208:
        raise ImageError(f"{path}: boot protocol {version >> 8}.{version & 0xff:02d} has no "
                         "payload fields (needs 2.08+); extract vmlinux with scripts/extract-vmlinux")
    setup_sects = head[0x1F1] or 4
    payload_offset, payload_length = struct.unpack_from("<II", head, 0x248)
    start = (setup_sects + 1) * 512 + payload_offset
    rest = head + read()
    if payload_length == 0 or start + payload_length > len(rest):
        raise ImageError(f"{path}: truncated bzImage: payload {start:#x}+{payload_length:#x} "
                         f"runs past the end of the file ({len(rest):#x} bytes)")
    return rest[start:start + payload_length]


def _compression_of(path: str, payload: bytes) -> str:
    for codec in CODECS:
        if payload.startswith(codec.magic):
            return codec.name
    raise ImageError(f"{path}: unknown bzImage payload compression (magic {payload[:6].hex()})")


def _decompress(path: str, payload: bytes, compression: str) -> bytes:
    try:
        data = _DECOMPRESSORS[compression](payload)
    except ImageError as exc:
        raise ImageError(f"{path}: {exc}") from None
    except _codec_errors() as exc:
        raise ImageError(f"{path}: corrupt {compression} payload: {_one_line(exc)}") from None
    if not data:
        raise ImageError(f"{path}: corrupt {compression} payload: it decompresses to nothing")
    if len(data) > MAX_PAYLOAD:
        raise ImageError(f"{path}: {compression} payload inflates past {MAX_PAYLOAD >> 20} MiB; "
                         "not a kernel")
    if not data.startswith(b"\x7fELF"):
        raise ImageError(f"{path}: the decompressed {compression} payload is not an ELF "
                         f"(starts with {data[:8].hex()})")
    return data


def _codec_errors() -> tuple[type[BaseException], ...]:
    import lz4.block
    import zstandard

    return (lzma.LZMAError, zlib.error, OSError, ValueError, EOFError,
            lz4.block.LZ4BlockError, zstandard.ZstdError)


def _inflate_xz(payload: bytes) -> bytes:
    decompressor = lzma.LZMADecompressor(lzma.FORMAT_AUTO)
    return decompressor.decompress(payload, MAX_PAYLOAD + 1)


def _inflate_lzma(payload: bytes) -> bytes:
    decompressor = lzma.LZMADecompressor(lzma.FORMAT_ALONE)
    return decompressor.decompress(payload, MAX_PAYLOAD + 1)


def _inflate_gzip(payload: bytes) -> bytes:
    decompressor = zlib.decompressobj(wbits=31)
    return decompressor.decompress(payload, MAX_PAYLOAD + 1)


def _inflate_bzip2(payload: bytes) -> bytes:
    return bz2.BZ2Decompressor().decompress(payload, MAX_PAYLOAD + 1)


def _inflate_zstd(payload: bytes) -> bytes:
    import zstandard

    reader = zstandard.ZstdDecompressor(max_window_size=1 << 31).stream_reader(
        io.BytesIO(payload), read_across_frames=False)
    return reader.read(MAX_PAYLOAD + 1)


#: lz4 legacy frames: magic, then [u32 LE compressed size][block] until the
#: end; each block inflates to at most 8 MiB.  The kernel's size_append adds
#: a 4-byte uncompressed size after the last block.
LZ4_LEGACY_MAGIC = 0x184C2102
LZ4_LEGACY_BLOCK = 8 << 20


def _inflate_lz4(payload: bytes) -> bytes:
    import lz4.block

    out = []
    total = 0
    position, end = 4, len(payload)
    while end - position >= 4:
        (length,) = struct.unpack_from("<I", payload, position)
        if length == LZ4_LEGACY_MAGIC:  # a concatenated stream restarts
            position += 4
            continue
        if end - position == 4:  # the size_append trailer
            break
        if position + 4 + length > end:
            raise ImageError(f"truncated lz4 block of {length} bytes at payload offset {position:#x}; "
                             "the bzImage is cut short")
        block = payload[position + 4:position + 4 + length]
        out.append(lz4.block.decompress(block, uncompressed_size=LZ4_LEGACY_BLOCK))
        total += len(out[-1])
        if total > MAX_PAYLOAD:
            break
        position += 4 + length
    return b"".join(out)


def _refuse_lzo(payload: bytes) -> bytes:
    raise ImageError("lzo-compressed bzImage is not supported (no LZO library); decompress it "
                     "externally: scripts/extract-vmlinux vmlinuz > vmlinux, then pass vmlinux")


_DECOMPRESSORS = {
    "xz": _inflate_xz,
    "lz4": _inflate_lz4,
    "zstd": _inflate_zstd,
    "gzip": _inflate_gzip,
    "bzip2": _inflate_bzip2,
    "lzma": _inflate_lzma,
    "lzo": _refuse_lzo,
}


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
    with _OpenInput(path, "System.map") as handle:
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


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:200]
