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
import hashlib
import json
import marshal
import mmap
import os
import stat
import struct
import threading

from ..collector import paused
from ..environment import default_cache_dir
from ..errors import ImageError, InputError
from ..outputs import write_atomic
from ..x86.registers import KERNEL_HALF
from . import bzimage
from .elf import elf_extent, read_elf
from .image import Image, ImageSource, OpenInput
from .symbols import load_system_map

# --- entry point ---------------------------------------------------------

def load_image(path: str | os.PathLike, system_map: str | os.PathLike | None = None) -> Image:
    """Load a vmlinux ELF or a bzImage, with symbols from ``system_map`` if given."""
    with paused():  # a kernel's ~200 k symbols and sections, none in a reference cycle
        return _load_image(os.fspath(path), system_map)


def _load_image(path: str, system_map: str | os.PathLike | None) -> Image:
    with OpenInput(path, "kernel image") as handle:
        opened = os.fstat(handle.fileno())  # the file as read: what the content hash is remembered under
        try:
            if not stat.S_ISREG(opened.st_mode):
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
        hashing = _Hashing(opened, buffer)
        try:
            elf = read_elf(path, buffer, from_payload=format_ == "bzimage", memo=SymbolFiles())
            symbols, source = elf.symbols, elf.symbol_table
            notes: list[str] = []
            if system_map is not None:
                symbols, map_notes = load_system_map(system_map, elf.sections)
                source = "system.map"
                notes.extend(map_notes)
        finally:
            hashing.join()
        identity = hashing.digest(elf.extent)
    finally:
        if isinstance(buffer, mmap.mmap):
            buffer.close()
    past = _symbols_past_their_section(symbols, elf.sections)
    if past:
        notes.append(f"{past} function symbol(s) run past the end of their section: each function ends there")
    return Image(path=path, identity=identity, format=format_, compression=compression,
                 sections=elf.sections, symbols=symbols, symbol_source=source,
                 notes=tuple(notes), source=ImageSource("image", os.path.abspath(path), identity,
                                                        None if system_map is None else os.path.abspath(system_map)))


#: How many files' hashes the memo keeps (the newest).
HASH_MEMO_ENTRIES = 256


class _Hashing:
    """SHA-256 of the image's bytes (``buffer[:extent]``): the identity a store keys its rows by.

    A whole debug vmlinux (about 600 MB) takes about 0.35 s to hash: the hash is remembered in
    ``<cache>/index/sha256.json`` under the open file's device, inode, size, modification *and change*
    time (the change time cannot be set back by a user: any write to the file moves it), and recomputed
    whenever any of them differs.  A hash not remembered is made on a thread of its own while the caller
    parses the symbols (hashlib lets go of the interpreter's lock over a large buffer), over the extent the
    section headers give (``_header_extent``); ``digest`` checks it against the extent the parse found, and
    hashes again in the rare case they differ."""

    def __init__(self, st: os.stat_result, buffer):
        self.st, self.buffer, self.memo = st, buffer, _hash_memo()
        self.extent = _header_extent(buffer)
        self.made: str | None = None
        self.thread = None
        if self.extent is not None and self._known(self.extent) is None:
            self.thread = threading.Thread(target=self._hash, name="relocverify-image-hash", daemon=True)
            self.thread.start()

    def _known(self, extent: int) -> str | None:
        known = self.memo.get(_memo_key(self.st, extent))
        return known if isinstance(known, str) and len(known) == 64 else None

    def _hash(self) -> None:
        self.made = hashlib.sha256(memoryview(self.buffer)[:self.extent]).hexdigest()

    def join(self) -> None:
        """The thread ended (before the buffer is closed)."""
        if self.thread is not None:
            self.thread.join()

    def digest(self, extent: int) -> str:
        known = self._known(extent)
        if known is not None:
            return known
        digest = self.made if extent == self.extent and self.made is not None else \
            hashlib.sha256(memoryview(self.buffer)[:extent]).hexdigest()
        self._remember(_memo_key(self.st, extent), digest)
        return digest

    def _remember(self, key: str, digest: str) -> None:
        memo = self.memo
        memo[key] = digest
        try:
            os.makedirs(os.path.dirname(_memo_path()), exist_ok=True)
            write_atomic(_memo_path(), json.dumps(dict(list(memo.items())[-HASH_MEMO_ENTRIES:])))
        except Exception:  # noqa: BLE001 - a cache that cannot be written only costs the next run the hash
            pass


def _header_extent(buffer) -> int | None:
    """``elf.elf_extent`` of an ELF64 in ``buffer`` from its section header table alone, or None when that
    cannot be read so (not ELF64, extended numbering, a table past the end)."""
    head = bytes(buffer[:64])
    if len(head) < 64 or head[:6] != b"\x7fELF\x02\x01":
        return None
    shoff = struct.unpack_from("<Q", head, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
    if shentsize != _SHDR_SIZE or not shoff or not shnum or shoff + shnum * _SHDR_SIZE > len(buffer):
        return None
    table = bytes(buffer[shoff:shoff + shnum * _SHDR_SIZE])
    return elf_extent(shoff, shnum * shentsize, _section_extents(table))


def _section_extents(table: bytes) -> list[tuple[int, int, int]]:
    """(type, offset, size) of each section of a section header table."""
    return [struct.unpack_from("<I", table, at + 4) + struct.unpack_from("<QQ", table, at + 0x18)
            for at in range(0, len(table), _SHDR_SIZE)]


def remembered_identity(path: str | os.PathLike) -> str | None:
    """The identity ``load_image`` gives the ELF file at ``path``, when its hash is remembered, read from
    the file's status and its section headers alone (a few kilobytes, where loading a debug vmlinux
    reads and parses its 600 MB), its extent by ``elf.elf_extent`` as loading computes it; None when
    it is not remembered, or the file is not a plain ELF64 file (a bzImage, extended section
    numbering, a header past the end, a truncated section).  What ``engine.run.again`` needs to answer the same command
    again without loading the image."""
    try:
        with open(os.fspath(path), "rb") as handle:
            st = os.fstat(handle.fileno())
            head = handle.read(64)
            if not stat.S_ISREG(st.st_mode) or len(head) < 64 or head[:6] != b"\x7fELF\x02\x01":
                return None
            shoff = struct.unpack_from("<Q", head, 0x28)[0]
            shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
            if shentsize != _SHDR_SIZE or not shoff or not shnum:
                return None
            handle.seek(shoff)
            table = handle.read(shnum * _SHDR_SIZE)
    except OSError:
        return None
    if len(table) != shnum * _SHDR_SIZE:
        return None
    extent = elf_extent(shoff, shnum * shentsize, _section_extents(table))
    if extent > st.st_size:
        return None  # truncated: loading it says so
    known = _hash_memo().get(_memo_key(st, extent))
    return known if isinstance(known, str) and len(known) == 64 else None


_SHDR_SIZE = 64  # an ELF64 section header


def _memo_key(st: os.stat_result, extent: int) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{extent}"


def _memo_path() -> str:
    return os.path.join(default_cache_dir(), "index", "sha256.json")


def _hash_memo() -> dict:
    try:
        with open(_memo_path()) as fh:
            memo = json.load(fh)
    except (OSError, ValueError):
        return {}
    return memo if isinstance(memo, dict) else {}


class SymbolFiles:
    """Symbol tables parsed before (``elf.SymbolMemo``), a file each in ``<cache>/index/symbols/``, named by the
    digest of the tables' bytes: the rows, marshalled, behind a check of their own.  The newest
    ``SYMBOL_FILES`` are kept.  Like the content hashes beside them, a file that cannot be read or written only
    costs a parse; one whose check fails is parsed again and replaced."""

    def __init__(self, directory: str | None = None):
        self.directory = directory or os.path.join(default_cache_dir(), "index", "symbols")

    def _path(self, key: bytes) -> str:
        return os.path.join(self.directory, key.hex() + ".marshal")

    def get(self, key: bytes) -> list | None:
        try:
            with open(self._path(key), "rb") as fh:
                data = fh.read()
        except OSError:
            return None
        head, blob = data[:len(_SYMBOLS_MAGIC) + 16], data[len(_SYMBOLS_MAGIC) + 16:]
        if head != _SYMBOLS_MAGIC + hashlib.blake2b(key + blob, digest_size=16).digest():
            return None
        try:
            rows = marshal.loads(blob)
        except (EOFError, ValueError, TypeError):
            return None
        if not isinstance(rows, list):
            return None
        try:
            os.utime(self._path(key))  # the newest are kept
        except OSError:
            pass
        return rows

    def put(self, key: bytes, rows: list) -> None:
        blob = marshal.dumps(rows)
        try:
            os.makedirs(self.directory, exist_ok=True)
            write_atomic(self._path(key), _SYMBOLS_MAGIC + hashlib.blake2b(key + blob, digest_size=16).digest() + blob)
            kept = sorted((e.stat().st_mtime_ns, e.path) for e in os.scandir(self.directory)
                          if e.name.endswith(".marshal"))
            for _, old in kept[:-SYMBOL_FILES]:
                os.remove(old)
        except Exception:  # noqa: BLE001 - a cache that cannot be written only costs the next run the parse
            pass


#: How many images' symbol tables ``SymbolFiles`` keeps (a vmlinux's is about 6 MB).
SYMBOL_FILES = 16
_SYMBOLS_MAGIC = b"RVSYM1\n"


def _symbols_past_their_section(symbols, sections) -> int:
    code = sorted(((s.address, s.address + len(s.data)) for s in sections if s.executable and s.data))
    starts = [lo for lo, _ in code]
    n = 0
    for sym in symbols:
        if sym.kind == "object" or not sym.size:
            continue
        i = bisect.bisect_right(starts, sym.address) - 1
        if i >= 0 and code[i][0] <= sym.address < code[i][1] and sym.address + sym.size > code[i][1]:
            n += 1
    return n


#: A kernel's text averages a function every few hundred bytes; a symbol source naming fewer than one per
#: ``MAX_MEAN_FUNCTION`` bytes of text (a System.map with only _stext and _etext) would turn the text into a few
#: giant "functions".
MAX_MEAN_FUNCTION = 64 << 10


def require_kernel(image: Image) -> None:
    """Refuse an image that is not a kernel with usable function symbols, with the reason (``InputError``):
    code below the kernel half (a user program, a core file), no function symbols (a stripped vmlinux without
    its System.map), or too few of them for its text."""
    text = [s for s in image.iter_executable_sections()]
    if not any(s.address >= KERNEL_HALF for s in text):
        lowest = min((s.address for s in text), default=0)
        raise InputError(f"{image.path}: not a kernel: its code is linked at {lowest:#x}, below the kernel half "
                         f"({KERNEL_HALF:#x}) (a user-space program or a core file?)")
    if image.symbol_source in ("none", "dynsym"):
        raise InputError(f"{image.path}: a stripped kernel (no function symbols): pass its System.map or "
                         f"/proc/kallsyms with --system-map")
    size = sum(len(s.data) or s.nobits_size for s in text if s.address >= KERNEL_HALF)
    funcs = sum(1 for sym in image.symbols if sym.kind == "func" and any(
        s.address <= sym.address < s.address + (len(s.data) or s.nobits_size) for s in text))
    if size > 1 << 20 and funcs * MAX_MEAN_FUNCTION < size:
        raise InputError(f"{image.path}: its symbols name {funcs} function(s) for {size / 2**20:.1f} MiB of kernel "
                         f"text: not a usable symbol source (a System.map with only _stext/_etext?)")

