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

import hashlib
import mmap
import os
import stat

from ..errors import ImageError
from . import bzimage
from .elf import read_elf
from .image import Image, ImageSource, OpenInput
from .symbols import load_system_map

# --- entry point ---------------------------------------------------------

def load_image(path: str | os.PathLike, system_map: str | os.PathLike | None = None) -> Image:
    """Load a vmlinux ELF or a bzImage, with symbols from ``system_map`` if given."""
    path = os.fspath(path)
    with OpenInput(path, "kernel image") as handle:
        try:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise ImageError(f"{path}: not a regular file; pass a vmlinux or vmlinuz file")
            head = handle.read(0x400)
            if head[:4] == b"\x7fELF":
                buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
                format_, compression = "elf", None
            elif bzimage.is_bzimage(head):
                buffer = bzimage.payload(path, handle.read, head)
                format_, compression = "bzimage", bzimage.compression_of(path, buffer)
                buffer = bzimage.decompress(path, buffer, compression)
            else:
                raise ImageError(f"{path}: not an ELF vmlinux or a bzImage (starts with {head[:8].hex()}); "
                                 "pass vmlinux from the -dbg package or /boot/vmlinuz-*")
        except (OSError, ValueError) as exc:  # /proc files, special files, an empty file to mmap
            raise ImageError(f"{path}: cannot read as a kernel image: {exc}") from None
    try:
        elf = read_elf(path, buffer, from_payload=format_ == "bzimage")
        symbols, source = elf.symbols, elf.symbol_table
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
                 notes=tuple(notes), source=ImageSource("image", os.path.abspath(path), identity,
                                                        None if system_map is None else os.path.abspath(system_map)))

