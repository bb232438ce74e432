"""The cached guest: a kernel QEMU boots without KASLR, and an initramfs with what a run needs.

``build_guest(package)`` takes what ``relocverify package`` takes (a named kernel, a linux-image
``.deb`` with its ``-dbg``, or a directory; ``engine.verify.kernel_parts``) and returns a ``Guest``:

* ``kernel``: the kernel ELF, booted by QEMU through its PVH note (``XEN_ELFNOTE_PHYS32_ENTRY``):
  no decompressor runs, so there is no KASLR and ``/proc/kallsyms`` matches System.map.  It is
  the ELF inside the package's bzImage (``image.bzimage``), extracted once into
  ``<cache>/confirm/vmlinux-<release>-<key>.pvh`` and shared by the guests of that bzImage; a kernel ELF without
  the note is refused (a bzImage boots with KASLR unless told ``nokaslr``: give that ELF's bzImage);
* ``vmlinux`` and ``system_map``: the image sites are resolved against (the ``-dbg`` vmlinux with
  its symbols, as ``relocverify audit --package`` reads it);
* ``initrd``: a cpio archive (``initramfs.py``) with Debian's ``busybox-static`` and its applets,
  ``/init`` (``script.INIT``), the helper and the shipped triggers built statically with gcc
  (``triggers.PROGRAMS``), and the modules the triggers need with their dependencies (from each
  module's ``.modinfo``), in load order.

The guest lives in ``<cache>/confirm/guest-<release>-<key>/``, where the key digests every input
(the kernel's and busybox's file identities, the programs' sources, the modules, gcc's version,
``FORMAT``); ``guest.json`` is written last, so a directory without it is built again.  A run's
own files (its script, a user's trigger) go into a second archive appended to a copy of the
guest's (``run_initrd``): the kernel unpacks both.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..engine.verify import kernel_parts
from ..environment import default_cache_dir
from ..errors import InputError
from ..image import bzimage
from ..image.debian import unpacked
from ..image.fetch import KERNELS, fetch
from . import initramfs
from .script import INIT
from .triggers import PROGRAMS, needed_modules

FORMAT = 2
PROGRAM_DIR = Path(__file__).parent / "programs"
XEN_ELFNOTE_PHYS32_ENTRY = 18


@dataclass(frozen=True)
class Guest:
    package: str
    release: str
    directory: str
    kernel: str  # the ELF QEMU boots through its PVH note
    initrd: str  # the guest's initramfs (busybox, /init, /rv/bin, /rv/modules)
    vmlinux: str  # where sites are resolved: the image with its symbols
    system_map: str | None
    programs: tuple[str, ...]  # /rv/bin/NAME
    modules: tuple[str, ...]  # /rv/modules/NAME.ko, in load order
    module_paths: tuple[tuple[str, str], ...]  # every module of the package: (name, host path)


def confirm_cache(cache_dir: str | None = None) -> Path:
    return Path(cache_dir or default_cache_dir()) / "confirm"


def build_guest(package: str, dbg: str | None = None, cache_dir: str | None = None, say=None) -> Guest:
    """The cached guest of ``package``, built on first use (see the module doc)."""
    parts = kernel_parts(package, dbg, progress=say)
    if not parts.release:
        raise InputError(f"{package}: no kernel release found (no lib/modules/<release>, no boot/vmlinuz-<release>)")
    bzimage_or_elf = _boot_image(package, parts, cache_dir)
    busybox = _busybox()
    gcc = _gcc()
    modules = _modules_in_order(needed_modules(), dict(_by_module_name(parts.modules)))
    sources = {name: (PROGRAM_DIR / f"{name}.c").read_bytes() for name in PROGRAMS}
    key = _digest([FORMAT, _identity(bzimage_or_elf), _identity(busybox), gcc,
                   sorted((n, hashlib.sha256(s).hexdigest()) for n, s in sources.items()),
                   [(n, _identity(p)) for n, p in modules], INIT])
    directory = confirm_cache(cache_dir) / f"guest-{parts.release}-{key[:12]}"
    manifest = directory / "guest.json"
    module_paths = tuple(_by_module_name(parts.modules))
    if manifest.is_file():
        data = json.loads(manifest.read_text())
        return Guest(package, parts.release, str(directory), data["kernel"], data["initrd"], parts.vmlinux,
                     parts.system_map, tuple(data["programs"]), tuple(data["modules"]), module_paths)
    if say:
        say(f"building the guest for {parts.release} in {directory} ...")
    directory.mkdir(parents=True, exist_ok=True)
    kernel = _kernel_elf(bzimage_or_elf, confirm_cache(cache_dir), parts.release)
    entries = [initramfs.directory(d) for d in ("bin", "dev", "proc", "sys", "tmp", "rv", "rv/bin", "rv/modules")]
    entries.append(initramfs.file("init", INIT.encode()))
    entries.append(initramfs.file("bin/busybox", Path(busybox).read_bytes()))
    entries += [initramfs.symlink(f"bin/{applet}", "busybox") for applet in _applets(busybox)]
    for name in PROGRAMS:
        entries.append(initramfs.file(f"rv/bin/{name}", compile_static(PROGRAM_DIR / f"{name}.c", directory)))
    entries += [initramfs.file(f"rv/modules/{name}.ko", Path(path).read_bytes(), 0o644) for name, path in modules]
    initrd = directory / "initrd.cpio"
    _write(initrd, initramfs.archive(entries))
    data = {"kernel": str(kernel), "initrd": str(initrd), "programs": list(PROGRAMS),
            "modules": [n for n, _ in modules], "release": parts.release, "package": package}
    _write(manifest, json.dumps(data, indent=1).encode())
    return Guest(package, parts.release, str(directory), str(kernel), str(initrd), parts.vmlinux, parts.system_map,
                 PROGRAMS, tuple(n for n, _ in modules), module_paths)


def run_initrd(guest: Guest, entries: list[initramfs.Entry], directory: str) -> str:
    """A copy of the guest's initramfs with ``entries`` appended as a second archive, in ``directory``."""
    path = os.path.join(directory, "initrd.cpio")
    with open(guest.initrd, "rb") as source, open(path, "wb") as sink:
        shutil.copyfileobj(source, sink)
        sink.write(initramfs.archive(entries))
    return path


def compile_static(source: Path, directory: Path) -> bytes:
    """``source`` built with ``gcc -static -O2``: the guest has no libc."""
    out = Path(directory) / source.stem
    result = subprocess.run([_gcc_path(), "-static", "-O2", "-o", str(out), str(source)], capture_output=True,
                            text=True, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise InputError(f"gcc -static {source.name} failed: {_last(result.stderr)} (is libc6-dev installed?)")
    return out.read_bytes()


def is_static(path: str) -> bool:
    """An ELF without an interpreter (PT_INTERP): it runs in a guest without libc."""
    with open(path, "rb") as handle:
        head = handle.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            return False
        phoff, = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        handle.seek(phoff)
        table = handle.read(phentsize * phnum)
    return all(struct.unpack_from("<I", table, i * phentsize)[0] != 3 for i in range(phnum))


# -- the kernel -------------------------------------------------------------------------------------

def _boot_image(package: str, parts, cache_dir: str | None) -> str:
    """The package's bzImage (or a kernel ELF) to boot."""
    if package in KERNELS:
        return fetch(package, cache_dir).vmlinuz
    candidates = []
    if os.path.isdir(package):
        candidates.append(Path(package) / "boot" / f"vmlinuz-{parts.release}")
    elif os.path.isfile(package):
        candidates.append(unpacked(package, cache_dir) / "boot" / f"vmlinuz-{parts.release}")
    candidates.append(Path(parts.vmlinux))
    for path in candidates:
        if path.is_file():
            return str(path)
    raise InputError(f"{package}: has no kernel to boot (looked for {', '.join(str(c) for c in candidates)})")


def _kernel_elf(path: str, directory: Path, release: str) -> Path:
    """The kernel ELF with a PVH note: ``path`` itself, or the ELF inside the bzImage ``path`` (extracted
    once into ``directory``, shared by every guest of that bzImage)."""
    with open(path, "rb") as handle:
        head = handle.read(0x400)
        if head[:4] == b"\x7fELF":
            elf = Path(path)
        elif bzimage.is_bzimage(head):
            elf = directory / f"vmlinux-{release}-{_digest(_identity(path))[:12]}.pvh"
            if not elf.is_file():
                payload = bzimage.payload(path, handle.read, head)
                _write(elf, bzimage.decompress(path, payload, bzimage.compression_of(path, payload)))
        else:
            raise InputError(f"{path}: neither a bzImage nor a kernel ELF: nothing to boot")
    if not has_pvh_note(str(elf)):
        raise InputError(f"{path}: the kernel has no PVH entry note (CONFIG_PVH): QEMU cannot boot its ELF, "
                         f"and a bzImage would boot with KASLR")
    return elf


def has_pvh_note(path: str) -> bool:
    """Whether the ELF at ``path`` has a Xen note of type XEN_ELFNOTE_PHYS32_ENTRY (QEMU's PVH boot)."""
    with open(path, "rb") as handle:
        head = handle.read(64)
        phoff, = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        handle.seek(phoff)
        table = handle.read(phentsize * phnum)
        for i in range(phnum):
            kind, _, offset, _, _, size = struct.unpack_from("<IIQQQQ", table, i * phentsize)
            if kind != 4:  # PT_NOTE
                continue
            handle.seek(offset)
            notes = handle.read(size)
            pos = 0
            while pos + 12 <= len(notes):
                namesz, descsz, note_type = struct.unpack_from("<III", notes, pos)
                name = notes[pos + 12:pos + 12 + namesz].rstrip(b"\0")
                if name == b"Xen" and note_type == XEN_ELFNOTE_PHYS32_ENTRY:
                    return True
                pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


# -- the initramfs' parts -----------------------------------------------------------------------------

def _busybox() -> str:
    path = shutil.which("busybox")
    if path is None or not is_static(path):
        raise InputError("a statically linked busybox is needed for the guest: install Debian's busybox-static "
                         "(apt-get install busybox-static)")
    return path


def _applets(busybox: str) -> list[str]:
    result = subprocess.run([busybox, "--list"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return sorted(a for a in result.stdout.split() if a and "/" not in a and a != "busybox")


def _gcc_path() -> str:
    path = shutil.which("gcc")
    if path is None:
        raise InputError("gcc is needed to build the guest's static programs: install gcc and libc6-dev")
    return path


def _gcc() -> str:
    result = subprocess.run([_gcc_path(), "--version"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return result.stdout.splitlines()[0] if result.stdout else "gcc"


def module_name(path: str) -> str:
    """A module's name as the kernel writes it: its file name without .ko, '-' as '_'."""
    return Path(path).name.split(".ko")[0].replace("-", "_")


def _by_module_name(modules) -> list[tuple[str, str]]:
    return [(module_name(path), path) for _, path in modules if path.endswith(".ko")]


def module_depends(path: str) -> tuple[str, ...]:
    """The ``depends=`` of a module's ``.modinfo``."""
    from elftools.elf.elffile import ELFFile

    with open(path, "rb") as handle:
        section = ELFFile(handle).get_section_by_name(".modinfo")
        data = section.data() if section is not None else b""
    for item in data.split(b"\0"):
        if item.startswith(b"depends="):
            return tuple(d.replace("-", "_") for d in item[8:].decode().split(",") if d)
    return ()


def _modules_in_order(names, available: dict[str, str]) -> list[tuple[str, str]]:
    """``names`` and their dependencies, each after what it depends on."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        path = available.get(name)
        if path is None:
            raise InputError(f"the package has no module {name} (a shipped trigger needs it)")
        for dependency in module_depends(path):
            visit(dependency)
        out.append((name, path))

    for name in names:
        visit(name)
    return out


# -- files -----------------------------------------------------------------------------------------

def _identity(path: str) -> list:
    stat = os.stat(path)
    return [os.path.realpath(path), stat.st_size, stat.st_mtime_ns]


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _write(path: Path, data: bytes) -> None:
    partial = path.with_name(f"{path.name}.{os.getpid()}.part")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _last(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


def scratch(cache_dir: str | None = None) -> tempfile.TemporaryDirectory:
    """A directory for one run's files, removed afterwards."""
    base = confirm_cache(cache_dir)
    base.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(prefix="run-", dir=base)
