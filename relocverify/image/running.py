"""The kernel this machine runs: which build it is, its image with symbols, and its live text.

``identify()`` reads ``uname -r``, ``uname -v`` and the build id in ``/sys/kernel/notes`` (the
``NT_GNU_BUILD_ID`` note the vmlinux carries too).  ``running_image(kernel)`` finds the vmlinux with
symbols of that very build, in this order:

1. a named kernel of ``image.fetch.KERNELS`` with that release, already in the cache;
2. ``/usr/lib/debug/boot/vmlinux-<release>`` (the ``-dbg`` package installed);
3. for a Debian kernel (``uname -v`` says ``Debian <version>``), its ``linux-image-<release>-dbg``
   package of that version, with ``apt-get download`` into the cache (``image.apt``), unpacked there
   (``image.debian.unpacked``);

and takes it only when its build id is the running kernel's.  Anything else is one ``InputError``
line that says why (not Debian, no symbols to be had, another build) and what to give instead.

``read_kcore(ranges)`` reads live text at running addresses from ``/proc/kcore`` (an ELF core whose
``PT_LOAD`` segments map kernel virtual addresses): root only (CAP_SYS_RAWIO); ``KcoreUnreadable``
says why not, as a value the caller reports.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from ..environment import default_cache_dir
from ..errors import FetchError, InputError
from .apt import download_version
from .debian import unpacked
from .fetch import KERNELS, cached_vmlinux

NOTES = "/sys/kernel/notes"
KCORE = "/proc/kcore"
KALLSYMS = "/proc/kallsyms"
DEBUG_BOOT = "/usr/lib/debug/boot"
NT_GNU_BUILD_ID = 3
PT_LOAD = 1

_DEBIAN = re.compile(r"\bDebian (\S+)")


@dataclass(frozen=True)
class RunningKernel:
    release: str  # uname -r
    version: str  # uname -v
    build_id: str | None  # hex, from /sys/kernel/notes

    @property
    def debian_version(self) -> str | None:
        """The Debian package version ``uname -v`` names (``#1 SMP PREEMPT_DYNAMIC Debian 6.1.187-1 (...)``)."""
        m = _DEBIAN.search(self.version)
        return m.group(1) if m else None

    def describe(self) -> str:
        return f"{self.release} ({self.version.strip()}" + (f", build id {self.build_id})" if self.build_id else ")")


def gnu_build_id(notes: bytes) -> str | None:
    """The GNU build id in a run of ELF notes (a ``.notes`` section, or ``/sys/kernel/notes``), as hex."""
    at = 0
    while at + 12 <= len(notes):
        namesz, descsz, kind = struct.unpack_from("<III", notes, at)
        name_at = at + 12
        desc_at = name_at + (namesz + 3 & ~3)
        end = desc_at + (descsz + 3 & ~3)
        if end > len(notes) or namesz > 256:
            return None
        if kind == NT_GNU_BUILD_ID and notes[name_at:name_at + namesz].rstrip(b"\0") == b"GNU":
            return notes[desc_at:desc_at + descsz].hex()
        at = end
    return None


def identify() -> RunningKernel:
    """This machine's kernel (its build id None when /sys/kernel/notes cannot be read)."""
    uname = os.uname()
    try:
        build_id = gnu_build_id(Path(NOTES).read_bytes())
    except OSError:
        build_id = None
    return RunningKernel(uname.release, uname.version, build_id)


def elf_build_id(path: str) -> str | None:
    """The GNU build id of an ELF file (its SHT_NOTE sections), or None."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as handle:
            for section in ELFFile(handle).iter_sections():
                if section["sh_type"] == "SHT_NOTE":
                    found = gnu_build_id(section.data())
                    if found:
                        return found
    except (OSError, ELFError, ValueError):
        return None
    return None


def identifiable(kernel: RunningKernel) -> bool:
    """Whether ``running_image`` can hope to find this kernel's symbols without being told (a Debian kernel,
    or one whose image is cached or installed), judged without downloading anything."""
    return kernel.debian_version is not None or _cached(kernel) is not None or _installed(kernel) is not None


def running_image(kernel: RunningKernel, cache_dir: str | None = None, progress=None) -> str:
    """The path of the vmlinux with symbols of ``kernel``'s very build (see the module doc)."""
    tried = []
    for found in (_cached(kernel), _installed(kernel)):
        if found is not None:
            if _same_build(kernel, found):
                return found
            tried.append(f"{found} is another build")
    version = kernel.debian_version
    if version is None:
        raise InputError(f"the running kernel {kernel.release} is not a Debian kernel (uname -v: "
                         f"{kernel.version.strip()!r}) and no image of it is installed ({DEBUG_BOOT}/vmlinux-"
                         f"{kernel.release}), so its symbols cannot be had: name its vmlinux instead (check --image "
                         f"VMLINUX, show VMLINUX FUNCTION), with its live text as --live-text DUMP --kallsyms FILE"
                         + (f" ({'; '.join(tried)})" if tried else ""))
    path = _debian_dbg(kernel, version, cache_dir, progress)
    if not _same_build(kernel, path):
        raise InputError(f"{path} is not the build running here (build id {elf_build_id(path)}, running "
                         f"{kernel.build_id}): give the running kernel's vmlinux with --image")
    return path


def _same_build(kernel: RunningKernel, path: str) -> bool:
    return kernel.build_id is None or elf_build_id(path) == kernel.build_id


def _cached(kernel: RunningKernel) -> str | None:
    for name, spec in KERNELS.items():
        if spec.release == kernel.release:
            return cached_vmlinux(name)
    return None


def _installed(kernel: RunningKernel) -> str | None:
    path = Path(DEBUG_BOOT) / f"vmlinux-{kernel.release}"
    return str(path) if path.is_file() else None


def _debian_dbg(kernel: RunningKernel, version: str, cache_dir: str | None, progress) -> str:
    cache = Path(cache_dir or default_cache_dir())
    name = f"linux-image-{kernel.release}-dbg"
    found = sorted(cache.glob(f"{name}_{version.replace(':', '%3a')}_*.deb"))
    try:
        if found:
            deb = found[-1]
        else:
            cache.mkdir(parents=True, exist_ok=True)
            (progress or (lambda line: None))(f"downloading {name}={version} (the running kernel's symbols) into "
                                              f"{cache} ...")
            deb = download_version(cache, name, version)
    except FetchError as exc:
        raise InputError(f"the running kernel {kernel.release} is Debian's {version}, but its symbols cannot be "
                         f"fetched ({exc}): install {name} or give its vmlinux with --image") from None
    vmlinux = unpacked(deb, cache_dir, progress) / "usr/lib/debug/boot" / f"vmlinux-{kernel.release}"
    if not vmlinux.is_file():
        raise InputError(f"{deb.name} has no usr/lib/debug/boot/vmlinux-{kernel.release}")
    return str(vmlinux)


# -- live text ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KcoreUnreadable:
    reason: str


def read_kcore(ranges: list[tuple[int, int]], path: str = KCORE) -> list[tuple[int, bytes]] | KcoreUnreadable:
    """The bytes of each (running address, size) from ``/proc/kcore``, or why they cannot be read."""
    try:
        handle = open(path, "rb")
    except PermissionError:
        return KcoreUnreadable(f"{path} is readable by root only (CAP_SYS_RAWIO)")
    except OSError as exc:
        return KcoreUnreadable(f"{path}: {exc.strerror}")
    with handle:
        try:
            head = handle.read(64)
            if head[:4] != b"\x7fELF":
                return KcoreUnreadable(f"{path} is not an ELF core")
            phoff, = struct.unpack_from("<Q", head, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
            handle.seek(phoff)
            table = handle.read(phentsize * phnum)
            loads = []
            for i in range(phnum):
                p_type, _, p_offset, p_vaddr, _, _, p_memsz, _ = struct.unpack_from("<IIQQQQQQ", table, i * phentsize)
                if p_type == PT_LOAD:
                    loads.append((p_vaddr, p_memsz, p_offset))
            out = []
            for address, size in ranges:
                seg = next(((v, o) for v, m, o in loads if v <= address and address + size <= v + m), None)
                if seg is None:
                    return KcoreUnreadable(f"{address:#x} is in no segment of {path}")
                handle.seek(seg[1] + address - seg[0])
                data = handle.read(size)
                if len(data) != size:
                    return KcoreUnreadable(f"{path}: read {len(data)} of {size} bytes at {address:#x}")
                out.append((address, data))
            return out
        except OSError as exc:
            return KcoreUnreadable(f"{path}: {exc.strerror}")


def read_kallsyms(path: str = KALLSYMS) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from None
