"""The image stage (relocverify.image) and the kernel fetcher (relocverify.fetch).

Fast tests build a tiny real ELF with gcc/ld, wrap it in a bzImage with each
supported compressor, and feed hostile inputs; every failure must be one
``ImageError`` line.  Slow tests load the real Debian 6.1 kernels in all three
modes (dbg vmlinux; vmlinuz + System.map; stripped vmlinux alone), fetching
them first if the cache does not have them.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import struct
import subprocess
import tarfile

import pytest

import elfbuild
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relocverify.image import apt as apt_module
from relocverify.errors import FetchError, ImageError
from conftest import TEST_KERNELS
from relocverify.image.fetch import KERNELS, KernelSpec, fetch, strip_elf, stripped_copy
from relocverify.image.bzimage import LZ4_LEGACY_MAGIC
from relocverify.image.image import Image, Section, Symbol
from relocverify.image.loader import load_image
from relocverify.image.symbols import load_system_map

TEXT = 0xFFFFFFFF81000000

ASM = r"""
    .section .text, "ax"
    .globl _stext
_stext:
    .globl f_one
    .type f_one, @function
f_one:
    push %rbp
    movq counter(%rip), %rax
    pop %rbp
    ret
    .size f_one, .-f_one
    int3
    int3
    .globl f_two
    .type f_two, @function
f_two:
    xor %eax, %eax
    ret
    .size f_two, .-f_two

    .section .rodata, "a"
    .asciz "tiny kernel"

    .section .data, "aw"
counter:
    .quad 42

    .section .bss, "aw", @nobits
    .globl big_buffer
big_buffer:
    .skip 4096
"""

LINKER_SCRIPT = """
SECTIONS {
  . = 0xffffffff81000000;
  .text : { *(.text) }
  .rodata : { *(.rodata) }
  .data : { *(.data) }
  .bss : { *(.bss) }
  /DISCARD/ : { *(.note.gnu.property) *(.comment) }
}
"""


def build_elf(directory, asm: str = ASM, script: str = LINKER_SCRIPT):
    return elfbuild.build_elf(directory, asm, script)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_elf(tmp_path_factory.mktemp("tiny"))


# --- bzImage construction -----------------------------------------------------

def lz4_legacy(data: bytes) -> bytes:
    import lz4.block

    out = bytearray(struct.pack("<I", LZ4_LEGACY_MAGIC))
    for start in range(0, len(data), 8 << 20):
        block = lz4.block.compress(data[start:start + (8 << 20)], store_size=False)
        out += struct.pack("<I", len(block)) + block
    return bytes(out)


def zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=19).compress(data)


COMPRESSORS = {
    "xz": lambda d: lzma.compress(d, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32,
                                  filters=[{"id": lzma.FILTER_X86}, {"id": lzma.FILTER_LZMA2}]),
    "lzma": lambda d: lzma.compress(d, format=lzma.FORMAT_ALONE),
    "gzip": gzip.compress,
    "bzip2": bz2.compress,
    "zstd": zstd,
    "lz4": lz4_legacy,
}


def bzimage(payload: bytes, setup_sects: int = 2, version: int = 0x20F, length: int | None = None) -> bytes:
    """A minimal bzImage: setup header, then ``payload`` at payload_offset."""
    setup = bytearray((setup_sects + 1) * 512)
    setup[0x1F1] = setup_sects
    struct.pack_into("<H", setup, 0x1FE, 0xAA55)
    setup[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", setup, 0x206, version)
    payload_offset = 0x3C0
    struct.pack_into("<II", setup, 0x248, payload_offset, len(payload) if length is None else length)
    return bytes(setup) + bytes(payload_offset) + payload + bytes(512)


def wrap(elf: bytes, compression: str, trailer: bytes = b"RELOCS\0\0") -> bytes:
    """The kernel's payload: compress(vmlinux.bin + relocs), then size_append."""
    inner = elf + trailer
    return bzimage(COMPRESSORS[compression](inner) + struct.pack("<I", len(inner)))


def error_of(call, *args) -> str:
    with pytest.raises(ImageError) as info:
        call(*args)
    message = str(info.value)
    assert "\n" not in message and message
    return message


# --- ELF --------------------------------------------------------------------------

def test_elf_sections_symbols_and_identity(tiny):
    image = load_image(tiny)
    assert image.format == "elf" and image.compression is None
    assert image.identity == hashlib.sha256(tiny.read_bytes()).hexdigest()
    assert image.symbol_source == "elf" and image.has_symbols()
    text = image.get_section(".text")
    assert text.address == TEXT and text.executable
    assert [s.name for s in image.iter_executable_sections()] == [".text"]
    assert image.symbol_address("f_one") == TEXT
    assert image.symbol_address("no_such_symbol") is None
    f_two = next(s for s in image.symbols if s.name == "f_two")
    assert f_two.kind == "func" and f_two.size == 3
    assert next(s for s in image.symbols if s.name == "counter").kind == "other"
    assert not image.has_section(".symtab") and not image.has_section(".strtab")


def test_read_spans_sections_and_nobits(tiny):
    image = load_image(tiny)
    assert image.read(TEXT, 1) == b"\x55"  # push %rbp
    bss = image.get_section(".bss")
    assert bss.data == b"" and bss.size == 4096
    assert image.read(image.symbol_address("big_buffer"), 16) == bytes(16)
    assert image.read(image.get_section(".rodata").address, 4) == b"tiny"
    error_of(image.read, 0x1234, 4)
    text = image.get_section(".text")
    error_of(image.read, text.end - 2, 4)


def test_stripped_elf_has_no_symbols(tiny, tmp_path):
    stripped = tmp_path / "stripped"
    stripped.write_bytes(strip_elf(tiny.read_bytes()))
    image = load_image(stripped)
    assert image.symbol_source == "none" and not image.has_symbols()
    assert image.symbol_address("f_one") is None
    assert image.get_section(".text").data == load_image(tiny).get_section(".text").data


def test_python_strip_matches_objcopy(tiny, tmp_path):
    if not shutil.which("objcopy"):
        pytest.fail("this test compares with binutils objcopy: apt-get install binutils")
    ours = tmp_path / "ours"
    ours.write_bytes(strip_elf(tiny.read_bytes()))
    theirs = stripped_copy(tiny, tmp_path / "theirs")
    mine, binutils = load_image(ours), load_image(theirs)
    assert binutils.symbol_source == "none"
    assert [(s.name, s.address, s.data) for s in mine.sections if s.alloc] == \
        [(s.name, s.address, s.data) for s in binutils.sections if s.alloc]


# --- bzImage ----------------------------------------------------------------------

@pytest.mark.parametrize("compression", sorted(COMPRESSORS))
def test_bzimage_each_compressor(tiny, tmp_path, compression):
    elf = tiny.read_bytes()
    path = tmp_path / f"vmlinuz-{compression}"
    path.write_bytes(wrap(elf, compression))
    image = load_image(path)
    assert image.format == "bzimage" and image.compression == compression
    assert image.identity == hashlib.sha256(elf).hexdigest()  # the relocs trailer is not the ELF
    assert image.get_section(".text").data == load_image(tiny).get_section(".text").data
    assert image.symbol_source == "elf"


@pytest.mark.parametrize("told", ["right", "short", "none"])
def test_the_identity_is_the_hash_of_the_elf_however_its_extent_was_first_read(tiny, tmp_path, monkeypatch, told):
    """The content hash is made on a thread over the extent the section headers give (``loader._Hashing``),
    while the symbols are parsed; an extent read otherwise from the headers (here a byte short), or none, is
    hashed again over the extent the parse found."""
    from relocverify.image import loader

    true_extent = loader._header_extent(tiny.read_bytes())
    fake = {"right": lambda buffer: true_extent, "short": lambda buffer: true_extent - 1,
            "none": lambda buffer: None}[told]
    monkeypatch.setenv("RELOCVERIFY_CACHE", str(tmp_path / "home"))  # nothing remembered
    monkeypatch.setattr(loader, "_header_extent", fake)
    path = tmp_path / "vmlinux"
    path.write_bytes(tiny.read_bytes() + b"trailing bytes past the ELF")
    assert load_image(path).identity == hashlib.sha256(tiny.read_bytes()).hexdigest()
    assert load_image(path).identity == hashlib.sha256(tiny.read_bytes()).hexdigest()  # remembered


def test_lz4_legacy_multi_block(tmp_path, tiny):
    """A payload over 8 MiB spans two lz4 legacy blocks."""
    elf = tiny.read_bytes()
    path = tmp_path / "vmlinuz"
    path.write_bytes(wrap(elf, "lz4", trailer=bytes(9 << 20)))
    assert load_image(path).identity == hashlib.sha256(elf).hexdigest()


def test_bzimage_with_system_map(tiny, tmp_path):
    path = tmp_path / "vmlinuz"
    path.write_bytes(wrap(strip_elf(tiny.read_bytes()), "gzip"))
    system_map = tmp_path / "System.map"
    system_map.write_text(f"{TEXT:016x} T _stext\n{TEXT:016x} T f_one\n{TEXT + 8:016x} t f_two\n"
                          f"{TEXT + 0x100000:016x} D far_data\n")
    image = load_image(path, system_map)
    assert image.symbol_source == "system.map"
    assert image.symbol_address("f_two") == TEXT + 8
    kinds = {s.name: (s.kind, s.size) for s in image.symbols}
    assert kinds["f_one"] == ("func", None) and kinds["far_data"] == ("object", None)


@pytest.mark.parametrize("mutate, expected", [
    (lambda b: b[:0x300], "truncated bzImage"),
    (lambda b: b[:0x202] + b"XXXX" + b[0x206:], "not an ELF vmlinux or a bzImage"),
    (lambda b: b[:0x206] + struct.pack("<H", 0x204) + b[0x208:], "boot protocol 2.04"),
])
def test_bzimage_header_errors(tiny, tmp_path, mutate, expected):
    path = tmp_path / "vmlinuz"
    path.write_bytes(mutate(wrap(tiny.read_bytes(), "xz")))
    assert expected in error_of(load_image, path)


def test_bzimage_payload_errors(tmp_path):
    cases = {
        "corrupt xz": (b"\xfd7zXZ\x00" + b"\x01" * 64, "corrupt xz payload"),
        "not elf": (gzip.compress(b"MZ not an elf at all"), "is not an ELF"),
        "lzo": (b"\x89LZO\x00\r\n\x1a\n" + bytes(64), "lzo"),
        "unknown": (b"\x00\x01\x02\x03" + bytes(64), "unknown bzImage payload compression"),
        "lz4 cut": (struct.pack("<II", LZ4_LEGACY_MAGIC, 5000) + bytes(100), "truncated lz4 block"),
        "zstd": (b"\x28\xb5\x2f\xfd" + bytes(32), "corrupt zstd payload"),
    }
    for name, (payload, expected) in cases.items():
        path = tmp_path / name.replace(" ", "_")
        path.write_bytes(bzimage(payload))
        assert expected in error_of(load_image, path), name
    assert "scripts/extract-vmlinux" in error_of(load_image, tmp_path / "lzo")


# --- hostile inputs -------------------------------------------------------------------

def patched(data: bytes, offset: int, fmt: str, *values) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, *values)
    return bytes(out)


def test_hostile_files(tiny, tmp_path):
    elf = tiny.read_bytes()
    e_shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    cases = {
        "empty": (b"", "not an ELF vmlinux or a bzImage"),
        "garbage": (os.urandom(4096).replace(b"\x7fELF", b"xxxx"), "not an ELF vmlinux or a bzImage"),
        "elf magic only": (b"\x7fELF", "shorter than an ELF header"),
        "truncated": (elf[:1000], "truncated"),
        "huge e_shnum": (patched(elf, 0x3C, "<H", 0xFFFF), "section headers"),
        "bad shstrndx": (patched(elf, 0x3E, "<H", 0x7FFF), "section name table index"),
        "32-bit": (patched(elf, 4, "<B", 1), "not a 64-bit little-endian ELF"),
        "arm64": (patched(elf, 0x12, "<H", 183), "is not x86-64"),
        "a module": (patched(elf, 0x10, "<H", 1), "pass a linked vmlinux"),
        "no section headers": (patched(elf, 0x28, "<Q", 0), "no section headers"),
        "shentsize": (patched(elf, 0x3A, "<H", 40), "e_shentsize"),
        "section past eof": (patched(elf, e_shoff + 64 + 0x18, "<Q", 1 << 40), "past the end of the file"),
    }
    for name, (data, expected) in cases.items():
        path = tmp_path / name.replace(" ", "_")
        path.write_bytes(data)
        assert expected in error_of(load_image, path), name


def test_unreadable_paths(tmp_path):
    assert "is a directory" in error_of(load_image, tmp_path)
    assert "no such file" in error_of(load_image, tmp_path / "missing")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)), min_size=1, max_size=8))
def test_mutated_elf_never_raises_anything_but_image_error(tiny, tmp_path, edits):
    data = bytearray(tiny.read_bytes())
    e_shoff = struct.unpack_from("<Q", data, 0x28)[0]
    for position, value in edits:  # aim half the edits at the section header table
        target = position % 64 if position < 2048 else e_shoff + position % (len(data) - e_shoff)
        data[target] = value
    path = tmp_path / "mutant"
    path.write_bytes(bytes(data))
    try:
        load_image(path)
    except ImageError as exc:
        assert "\n" not in str(exc)


# --- System.map ---------------------------------------------------------------------

def test_placeholder_system_map(tiny, tmp_path):
    placeholder = tmp_path / "System.map"
    placeholder.write_text("ffffffffffffffff B The real System.map is in the linux-image-<version>-dbg package\n")
    message = error_of(load_image, tiny, placeholder)
    assert "placeholder System.map" in message and "-dbg" in message


def test_system_map_errors(tiny, tmp_path):
    cases = {
        "empty": ("", "empty System.map"),
        "garbage": ("hello world\n", "not a System.map line"),
        "bad address": ("zzzz T foo\n", "bad address"),
        "zeros": ("0000000000000000 T a\n0000000000000000 T b\n", "kptr_restrict"),
        "other build": (f"{TEXT + 0x1234:016x} T _stext\n", "does not match this image"),
    }
    for name, (text, expected) in cases.items():
        path = tmp_path / name.replace(" ", "_")
        path.write_text(text)
        assert expected in error_of(load_image, tiny, path), name
    assert "System.map" in error_of(load_image, tiny, tmp_path / "missing.map")


def test_kaslr_kallsyms_is_rebased(tiny, tmp_path):
    shift = 0x1E000000
    kallsyms = tmp_path / "kallsyms"
    kallsyms.write_text(f"{TEXT + shift:016x} T _stext\n{TEXT + shift + 8:016x} t f_two\n"
                        f"0000000000001000 A fixed_percpu_data\n"
                        f"{0xFFFFFFFFC0000000:016x} t mod_func\t[some_module]\n")
    image = load_image(tiny, kallsyms)
    assert image.symbol_address("f_two") == TEXT + 8
    assert image.symbol_address("fixed_percpu_data") == 0x1000
    assert image.symbol_address("mod_func") is None
    assert any("rebased" in note for note in image.notes)


def test_map_kinds_follow_sections():
    sections = (Section(".text", TEXT, b"\x90" * 16, True, flags=0x6),)
    path_symbols, _ = load_system_map_from_text(
        f"{TEXT:016x} T a\n{TEXT + 4:016x} W b\n{TEXT + 0x100:016x} T past_text\n{TEXT:016x} A abs\n",
        sections)
    kinds = {s.name: s.kind for s in path_symbols}
    assert kinds == {"a": "func", "b": "func", "past_text": "other", "abs": "other"}


def load_system_map_from_text(text, sections, directory=None):
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".map", delete=False) as handle:
        handle.write(text)
    try:
        return load_system_map(handle.name, sections)
    finally:
        os.unlink(handle.name)


def test_image_is_a_pure_value():
    """An Image can be built from bytes alone (the pure core needs no files)."""
    text = Section(".text", TEXT, b"\xc3", True, flags=0x6)
    image = Image("mem", "0" * 64, "elf", None, (text,), (Symbol("f", TEXT, 1, "func"),), "elf")
    assert image.read(TEXT, 1) == b"\xc3" and image.section_at(TEXT) is text
    assert image.section_at(TEXT + 1) is None


# --- fetch (offline: synthetic .debs, a fake apt-get) ------------------------------------

def make_deb(path, members: dict[str, bytes]) -> None:
    """A .deb: ar with debian-binary, control.tar.xz, data.tar.xz."""
    def tar_xz(files):
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w:xz") as archive:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        return raw.getvalue()

    def ar_member(name, data):
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode()
        return header + data + (b"\n" if len(data) % 2 else b"")

    members = {"./usr/share/doc/x/README": b"padding first\n", **members}
    path.write_bytes(b"!<arch>\n" + ar_member("debian-binary", b"2.0\n") +
                     ar_member("control.tar.xz", tar_xz({"./control": b"Package: x\n"})) +
                     ar_member("data.tar.xz", tar_xz(members)))


@pytest.fixture
def fake_kernel(monkeypatch, tiny, tmp_path):
    spec = KernelSpec("test-kernel", "9.9.9-test", "linux-image-test-unsigned", "linux-image-test-dbg",
                      1, "synthetic packages for the fetch tests")
    monkeypatch.setitem(KERNELS, spec.name, spec)
    vmlinuz = wrap(strip_elf(tiny.read_bytes()), "xz")
    system_map = f"{TEXT:016x} T _stext\n".encode()
    debs = {
        f"{spec.unsigned}_1_amd64.deb": {f"./boot/vmlinuz-{spec.release}": vmlinuz,
                                          f"./boot/config-{spec.release}": b"CONFIG_SMP=y\n"},
        f"{spec.dbg}_1_amd64.deb": {f"./usr/lib/debug/boot/System.map-{spec.release}": system_map,
                                     f"./usr/lib/debug/boot/vmlinux-{spec.release}": tiny.read_bytes()},
    }
    store = tmp_path / "mirror"
    store.mkdir()
    for name, members in debs.items():
        make_deb(store / name, members)
    calls = []

    def fake_run(command, cwd):
        calls.append(command[1:])
        if command[1] == "update":
            return subprocess.CompletedProcess(command, 0, "", "")
        if ["update"] not in calls:
            return subprocess.CompletedProcess(command, 100, "", "E: Unable to locate package x")
        shutil.copy(next(store.glob(f"{command[2]}_*.deb")), cwd)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(apt_module, "_run", fake_run)  # apt-get, as image.apt runs it
    monkeypatch.setattr(apt_module.shutil, "which", lambda name: "/usr/bin/" + name)
    return spec, calls


def test_fetch_downloads_extracts_and_is_idempotent(fake_kernel, tmp_path, tiny):
    spec, calls = fake_kernel
    cache = tmp_path / "cache"
    kernel = fetch(spec.name, cache)
    assert calls[:3] == [["download", spec.unsigned], ["update"], ["download", spec.unsigned]]
    assert open(kernel.vmlinux, "rb").read() == tiny.read_bytes()
    assert load_image(kernel.vmlinuz, kernel.system_map).symbol_source == "system.map"
    manifest = json.loads((cache / spec.name / "manifest.json").read_text())
    for record in list(manifest["debs"].values()) + list(manifest["files"].values()):
        folder = cache if record["file"].endswith(".deb") else cache / spec.name
        assert hashlib.sha256((folder / record["file"]).read_bytes()).hexdigest() == record["sha256"]
        assert kernel.sha256s[record["file"]] == record["sha256"]
    stamp = os.stat(kernel.vmlinux).st_mtime_ns
    calls.clear()
    again = fetch(spec.name, cache, verify=True)
    assert calls == [] and again == kernel and os.stat(kernel.vmlinux).st_mtime_ns == stamp
    with open(kernel.vmlinux, "ab") as handle:  # a damaged file is extracted again
        handle.write(b"junk")
    fetch(spec.name, cache)
    assert open(kernel.vmlinux, "rb").read() == tiny.read_bytes()


def test_fetch_errors(monkeypatch, tmp_path, fake_kernel):
    assert "unknown kernel" in str(pytest.raises(FetchError, fetch, "no-such-kernel", tmp_path).value)
    spec, _ = fake_kernel
    monkeypatch.setattr(apt_module, "_run", lambda command, cwd: subprocess.CompletedProcess(
        command, 0 if command[1] == "update" else 100, "", "E: Unable to locate package x"))
    message = str(pytest.raises(FetchError, fetch, spec.name, tmp_path / "c").value)
    assert "apt-get download linux-image-test-unsigned failed" in message
    (tmp_path / "d").mkdir()
    for package in (spec.unsigned, spec.dbg):
        (tmp_path / "d" / f"{package}_1_amd64.deb").write_bytes(b"not a deb")
    message = str(pytest.raises(FetchError, fetch, spec.name, tmp_path / "d").value)
    assert "not a Debian package" in message


def test_kernel_table_rows_have_reasons():
    for spec in KERNELS.values():
        assert spec.reason and spec.approx_mb > 0
        assert spec.unsigned.endswith("-unsigned") and spec.dbg.endswith("-dbg")
        assert spec.release in spec.unsigned and spec.release in spec.dbg


# --- slow: the real Debian kernels -----------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", TEST_KERNELS)
def test_debian_kernel_loads_in_all_three_modes(debian_kernels, name, tmp_path):
    kernel, stripped = debian_kernels(name)
    dbg = load_image(kernel.vmlinux)
    packed = load_image(kernel.vmlinuz, kernel.system_map)
    bare = load_image(stripped)
    assert (dbg.symbol_source, packed.symbol_source, bare.symbol_source) == ("elf", "system.map", "none")
    assert dbg.identity == kernel.sha256s[os.path.basename(kernel.vmlinux)]
    assert packed.format == "bzimage"
    assert packed.compression == ("lz4" if "cloud" in name else "xz")
    reference = {s.name: s for s in dbg.sections if s.alloc}
    for image in (packed, bare):
        alloc = {s.name: s for s in image.sections if s.alloc}
        assert alloc.keys() == reference.keys()
        for section_name, section in alloc.items():
            assert (section.address, section.data) == (reference[section_name].address,
                                                        reference[section_name].data), section_name
    assert {s.name for s in dbg.iter_executable_sections()} >= {".text", ".init.text"}
    for symbol in ("_stext", "__noinstr_text_start", "__entry_text_start", "__x86_return_thunk"):
        assert dbg.symbol_address(symbol) == packed.symbol_address(symbol) is not None
    assert len(dbg.symbols) > 100_000 and len(packed.symbols) > 80_000
    placeholder = tmp_path / "System.map"
    placeholder.write_text("ffffffffffffffff B The real System.map is in the linux-image-<version>-dbg package\n")
    assert "placeholder" in error_of(load_image, kernel.vmlinuz, placeholder)


def _save_manifest_many_times(path: str, n: int) -> None:
    from relocverify.image.fetch import _Manifest

    manifest = _Manifest.load(__import__("pathlib").Path(path))
    for k in range(n):
        manifest.data["release"] = f"{os.getpid()}-{k}"
        manifest.save()


def test_two_processes_fetching_at_once_each_write_the_manifest_whole(tmp_path):
    """Two processes that fetch the same kernel save its manifest at the same time: each writes a
    temporary file of its own and renames it (one shared temporary name let one process rename the
    other's file away, a FileNotFoundError seen when two benchmarks started together)."""
    import multiprocessing

    path = tmp_path / "manifest.json"
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_save_manifest_many_times, args=(str(path), 300)) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert [w.exitcode for w in workers] == [0, 0, 0]
    assert json.loads(path.read_text())["release"].endswith("-299")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


def test_symbol_tables_parsed_before_are_read_back_by_their_bytes(tmp_path, monkeypatch):
    """``loader.SymbolFiles`` keeps parsed symbol tables by a digest of the symbol and string tables' bytes: a
    second load reads them back and gives the same image; a table whose names alone differ (the same symbol
    records, another string table) is not taken for the first; a damaged file is parsed again and replaced."""
    from relocverify.image import elf as elf_module
    from relocverify.image.loader import SymbolFiles

    monkeypatch.setenv("RELOCVERIFY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(elf_module, "MEMO_FROM", 0)  # the tiny ELF's table is kept too
    (tmp_path / "one").mkdir()
    one = build_elf(tmp_path / "one")
    data = open(one, "rb").read()
    assert data.count(b"f_two\0") == 1
    other = tmp_path / "other.elf"  # the same symbol records, one name changed in the string table
    other.write_bytes(data.replace(b"f_two\0", b"f_bis\0"))
    parsed = load_image(one)
    files = SymbolFiles()
    kept = os.listdir(files.directory)
    assert len(kept) == 1
    calls = []
    real = elf_module._symbol_rows
    monkeypatch.setattr(elf_module, "_symbol_rows", lambda *a: calls.append(a) or real(*a))
    again = load_image(one)
    assert again == parsed and again.symbols == parsed.symbols and not calls, "read back, not parsed"
    renamed = load_image(str(other))
    assert len(calls) == 1 and "f_bis" in {s.name for s in renamed.symbols} - {s.name for s in parsed.symbols}
    path = os.path.join(files.directory, kept[0])
    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0xFF
    open(path, "wb").write(bytes(data))
    assert load_image(one).symbols == parsed.symbols and len(calls) == 2, "a damaged file is parsed again"
    assert load_image(one).symbols == parsed.symbols and len(calls) == 2, "and replaced"
