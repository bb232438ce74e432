"""The image stage's values: a kernel as sections and symbols.

``Image`` is what every later stage reads; ``loader.load_image`` makes one
from an ELF vmlinux or a bzImage (see ``loader`` for the formats).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple

from ..errors import ImageError, InputError
from ..inputs import open_input

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
ET_EXEC = 2
ET_DYN = 3


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


class Symbol(NamedTuple):
    """A named address.  ``size`` is None when it came from System.map.

    A value like the frozen dataclasses around it, made a ``NamedTuple`` because an image has so many: a
    vmlinux's 116 thousand cost 0.12-0.17 s to make as a frozen dataclass (each field set through
    ``object.__setattr__``), a quarter of loading it, and a few hundredths as tuples."""

    name: str
    address: int
    size: int | None
    kind: str  # 'func' | 'object' | 'other'


@dataclass(frozen=True)
class ImageSource:
    """How to load an image again, elsewhere (``image.source.load_source``): a Dask worker gets
    this instead of the image, loads it from the same path, and checks its sha256."""

    kind: str  # "image" (vmlinux, bzImage or user-space ELF) | "module"
    path: str
    identity: str  # the sha256 the loaded image must have
    system_map: str | None = None
    kernel: "ImageSource | None" = None  # a module's kernel
    base: int = 0  # where a module is laid out


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
    source: ImageSource | None = field(default=None, compare=False)  # how to load it again
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



class OpenInput:
    """An input file opened through ``inputs.open_input`` (a regular file of bounded size; no FIFO or
    device), its failures one-line ImageErrors."""

    def __init__(self, path: str, what: str) -> None:
        self.path, self.what = path, what

    def __enter__(self):
        try:
            self.handle = open_input(self.path, self.what)
        except InputError as exc:
            raise ImageError(str(exc)) from None
        return self.handle

    def __exit__(self, *exc) -> None:
        self.handle.close()


def one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:200]

