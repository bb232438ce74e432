"""Named real kernels: download, record and extract (``relocverify corpus fetch``).

``fetch(name, cache_dir)`` downloads the Debian packages of one row of
:data:`KERNELS` with ``apt-get download`` (running ``apt-get update`` once if
apt does not know the package yet), records each ``.deb``'s sha256 in
``<cache_dir>/<name>/manifest.json``, and extracts only ``vmlinux`` and
``System.map`` (from ``-dbg``) and ``vmlinuz`` and ``config`` (from
``-unsigned``).  It is idempotent: a ``.deb`` or extracted file already in the
cache whose size and mtime match the manifest is reused without hashing it
again (``verify=True`` re-hashes everything); a ``.deb`` found in the cache
but not yet in the manifest is hashed and adopted instead of downloaded.

Extraction reads the ``.deb`` with python-debian (``image.debian.open_data_tar``:
the ar container, then a tar compressed with xz, gzip, bzip2 or zstd,
decompressed as a stream) and stops as soon as the wanted members are out,
which skips the bulk of the ``-dbg`` package (module debug info).

The cache directory is ``$RELOCVERIFY_CACHE`` or ``~/.cache/relocverify``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from ..environment import default_cache_dir, unusable_directory
from ..errors import FetchError
from .apt import download, last_line
from .debian import KernelParts, module_order, open_data_tar, unpacked_member


class KernelSpec(NamedTuple):
    """One named kernel: its Debian packages, approximate sizes and why it is here."""

    name: str
    release: str       # uname -r, as in boot/vmlinuz-<release>
    unsigned: str      # package with boot/vmlinuz, boot/config (System.map is a placeholder)
    dbg: str           # package with usr/lib/debug/boot/vmlinux and System.map
    approx_mb: int     # both .debs together
    reason: str


KERNELS: dict[str, KernelSpec] = {spec.name: spec for spec in (
    KernelSpec("debian-6.1-cloud", "6.1.0-53-cloud-amd64",
               "linux-image-6.1.0-53-cloud-amd64-unsigned", "linux-image-6.1.0-53-cloud-amd64-dbg",
               310,
               "Debian 12 cloud flavour: the smallest 6.1 build (fewer drivers), lz4 bzImage; "
               "the quick real-kernel run"),
    KernelSpec("debian-6.1-amd64", "6.1.0-53-amd64",
               "linux-image-6.1.0-53-amd64-unsigned", "linux-image-6.1.0-53-amd64-dbg",
               925,
               "Debian 12 generic kernel that most installs run, xz bzImage; the full-size corpus"),
    KernelSpec("debian-6.12-cloud", "6.12.117+deb12-cloud-amd64",
               "linux-image-6.12.117+deb12-cloud-amd64-unsigned", "linux-image-6.12.117+deb12-cloud-amd64-dbg",
               345,
               "Debian 12 backports 6.12 cloud kernel: 3.9 M instructions and new site kinds (call-depth "
               "thunks, endbr sealing); the scale benchmark and the cross-version cache measurement"),
)}


@dataclass(frozen=True)
class FetchedKernel:
    """Paths of the extracted files of one named kernel, and their sha256s."""

    name: str
    release: str
    vmlinux: str       # unstripped, from -dbg
    vmlinuz: str       # bzImage, from -unsigned
    system_map: str    # the real one, from -dbg
    config: str | None
    sha256s: dict      # file name (.deb or extracted) -> sha256 hex


def fetch(name: str, cache_dir: str | os.PathLike | None = None, verify: bool = False,
          progress=None) -> FetchedKernel:
    """Download (if needed) and extract kernel ``name``; see the module doc.  ``progress``, if
    given, is told a line before each download and each extraction (they take minutes)."""
    spec = KERNELS.get(name)
    if spec is None:
        raise FetchError(f"unknown kernel {name!r}: choose one of {', '.join(sorted(KERNELS))}")
    cache = Path(cache_dir or default_cache_dir())
    target = cache / name
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FetchError(f"the cache directory: {unusable_directory(str(target), exc)}: name a directory with "
                         f"RELOCVERIFY_CACHE") from None
    manifest = _Manifest.load(target / "manifest.json")
    wanted = _wanted_members(spec)
    say = progress or (lambda line: None)
    debs = {package: _obtain_deb(cache, package, manifest, verify, say) for package in (spec.unsigned, spec.dbg)}
    files = {}
    for package, members in wanted.items():
        files.update(_extract_members(debs[package], members, target, manifest, verify, say))
    manifest.data["name"] = name
    manifest.data["release"] = spec.release
    manifest.save()
    records = [manifest.data["debs"][package] for package in debs] + \
        [manifest.data["files"][role] for role in files]
    sha256s = {record["file"]: record["sha256"] for record in records}
    return FetchedKernel(name=name, release=spec.release, vmlinux=str(files["vmlinux"]),
                         vmlinuz=str(files["vmlinuz"]), system_map=str(files["system_map"]),
                         config=str(files["config"]) if "config" in files else None, sha256s=sha256s)


def cached_vmlinux(name: str, cache_dir: str | os.PathLike | None = None) -> str | None:
    """The unstripped vmlinux of kernel ``name`` if an earlier ``fetch`` left it in the cache intact (by size
    and modification time, as ``fetch`` checks it), else None: nothing is downloaded."""
    spec = KERNELS.get(name)
    if spec is None:
        return None
    target = Path(cache_dir or default_cache_dir()) / name
    manifest = _Manifest.load(target / "manifest.json")
    path = target / f"vmlinux-{spec.release}"
    return str(path) if manifest.matches("files", "vmlinux", path, False) else None


def stripped_copy(vmlinux: str | os.PathLike, destination: str | os.PathLike | None = None) -> str:
    """A copy of ``vmlinux`` without symbols, debug info or relocations.

    Uses ``objcopy --strip-all`` when it is installed, else :func:`strip_elf`.
    The copy is reused if it is newer than ``vmlinux``.
    """
    source = Path(vmlinux)
    target = Path(destination) if destination else source.with_name(source.name + ".stripped")
    if target.exists() and target.stat().st_mtime >= source.stat().st_mtime:
        return str(target)
    partial = target.with_name(f"{target.name}.{os.getpid()}.part")  # this process's own (see _Manifest.save)
    try:
        objcopy = shutil.which("objcopy")
        if objcopy:
            result = subprocess.run([objcopy, "--strip-all", str(source), str(partial)],
                                    capture_output=True, text=True)
            if result.returncode != 0:
                raise FetchError(f"objcopy --strip-all {source} failed: {last_line(result.stderr)}")
        else:
            partial.write_bytes(strip_elf(source.read_bytes()))
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return str(target)


def strip_elf(data: bytes) -> bytes:
    """An ELF64 with its symbol, string, relocation and debug sections removed.

    The kept sections stay at their file offsets (so program headers stay
    valid); the file is cut after the last kept byte and a new section name
    table and section header table are appended.  ``sh_link``/``sh_info`` of
    kept sections are renumbered (to 0 when they pointed at a dropped one).
    """
    try:
        return _strip_elf(data)
    except (struct.error, IndexError, ValueError) as exc:
        raise FetchError(f"cannot strip: not a well-formed ELF64 ({exc})") from None


def _strip_elf(data: bytes) -> bytes:
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not an ELF64 file")
    e_phoff, e_shoff = struct.unpack_from("<QQ", data, 0x20)
    e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHHHH", data, 0x36)
    headers = [list(struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * 64)) for i in range(e_shnum)]
    names_offset = headers[e_shstrndx][4]

    def name_of(header) -> bytes:
        start = names_offset + header[0]
        return data[start:data.index(b"\0", start)]

    keep = [0]
    for index, header in enumerate(headers[1:], 1):
        name, kind = name_of(header), header[1]
        if kind in (2, 3, 4, 9, 11) or name.startswith((b".debug", b".zdebug", b".comment")):
            continue
        keep.append(index)
    renumber = {old: new for new, old in enumerate(keep)}
    # header fields: name, type, flags, addr, offset, size, link, info, addralign, entsize
    end = max([64, e_phoff + e_phnum * e_phentsize] +
              [headers[i][4] + headers[i][5] for i in keep[1:] if headers[i][1] != 8])
    out = bytearray(data[:end])
    names = bytearray(b"\0")
    new_headers = []
    for old in keep:
        header = list(headers[old])
        if old:
            header[0] = len(names)
            names += name_of(headers[old]) + b"\0"
            header[6] = renumber.get(header[6], 0)
            if header[2] & 0x40:  # SHF_INFO_LINK
                header[7] = renumber.get(header[7], 0)
        new_headers.append(header)
    shstrtab_name = len(names)
    names += b".shstrtab\0"
    out += names
    new_headers.append([shstrtab_name, 3, 0, 0, end, len(names), 0, 0, 1, 0])
    while len(out) % 8:
        out += b"\0"
    shoff = len(out)
    for header in new_headers:
        out += struct.pack("<IIQQQQIIQQ", *header)
    struct.pack_into("<Q", out, 0x28, shoff)
    struct.pack_into("<HH", out, 0x3C, len(new_headers), len(new_headers) - 1)
    return bytes(out)


# --- manifest ---------------------------------------------------------------

class _Manifest:
    """``manifest.json``: per .deb and per extracted file, its sha256, size and mtime."""

    def __init__(self, path: Path, data: dict) -> None:
        self.path, self.data = path, data
        data.setdefault("debs", {})
        data.setdefault("files", {})

    @classmethod
    def load(cls, path: Path) -> "_Manifest":
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                data = {}
        except (OSError, ValueError):
            data = {}
        return cls(path, data)

    def save(self) -> None:
        # a name of this process's own: two processes fetching the same kernel at once each rename a whole
        # file (one fixed name let one rename the other's file away: FileNotFoundError)
        partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.part")
        try:
            partial.write_text(json.dumps(self.data, indent=1, sort_keys=True) + "\n")
            os.replace(partial, self.path)
        finally:
            partial.unlink(missing_ok=True)

    def matches(self, section: str, key: str, path: Path, verify: bool) -> bool:
        record = self.data[section].get(key)
        if record is None or not path.exists() or record.get("file") != path.name:
            return False
        stat = path.stat()
        if verify:
            return _sha256(path) == record["sha256"]
        return stat.st_size == record["size"] and stat.st_mtime_ns == record["mtime_ns"]

    def record(self, section: str, key: str, path: Path, sha256: str | None = None) -> None:
        stat = path.stat()
        self.data[section][key] = {"file": path.name, "sha256": sha256 or _sha256(path),
                                   "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        self.save()


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


# --- apt-get download --------------------------------------------------------------

def _obtain_deb(cache: Path, package: str, manifest: _Manifest, verify: bool, say=lambda line: None) -> Path:
    record = manifest.data["debs"].get(package)
    if record and manifest.matches("debs", package, cache / record["file"], verify):
        return cache / record["file"]
    existing = sorted(cache.glob(f"{package}_*.deb"), key=lambda p: p.stat().st_mtime)
    if not existing:
        say(f"downloading {package} into {cache} with apt-get download ...")
        download(cache, package)
        existing = sorted(cache.glob(f"{package}_*.deb"), key=lambda p: p.stat().st_mtime)
        if not existing:
            raise FetchError(f"apt-get download {package} reported success but left no .deb in {cache}")
    deb = existing[-1]
    manifest.record("debs", package, deb)
    return deb



# --- extraction ------------------------------------------------------------------

def _wanted_members(spec: KernelSpec) -> dict[str, dict[str, str]]:
    """package -> {tar member: role}."""
    release = spec.release
    return {
        spec.unsigned: {f"./boot/vmlinuz-{release}": "vmlinuz", f"./boot/config-{release}": "config"},
        spec.dbg: {f"./usr/lib/debug/boot/vmlinux-{release}": "vmlinux",
                   f"./usr/lib/debug/boot/System.map-{release}": "system_map"},
    }


def _extract_members(deb: Path, members: dict[str, str], target: Path,
                     manifest: _Manifest, verify: bool, say=lambda line: None) -> dict[str, Path]:
    paths = {role: target / Path(member).name for member, role in members.items()}
    if all(manifest.matches("files", role, paths[role], verify) for role in members.values()):
        return paths
    linked = _link_unpacked(deb, members, paths, manifest)
    if linked is not None:
        return linked
    say(f"extracting {', '.join(sorted(members.values()))} from {deb.name} ...")
    found: dict[str, Path] = {}
    try:
        with open_data_tar(deb) as stream, tarfile.open(fileobj=stream, mode="r|") as archive:
            for entry in archive:
                role = members.get(entry.name) or members.get("./" + entry.name.lstrip("./"))
                if role is None or not entry.isfile():
                    continue
                partial = paths[role].with_name(f"{paths[role].name}.{os.getpid()}.part")  # see _Manifest.save
                try:
                    with archive.extractfile(entry) as source, open(partial, "wb") as sink:
                        digest = _copy_hashing(source, sink)
                    os.replace(partial, paths[role])
                finally:
                    partial.unlink(missing_ok=True)
                manifest.record("files", role, paths[role], digest)
                found[role] = paths[role]
                if len(found) == len(members):
                    break
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        raise FetchError(f"cannot extract {deb.name}: {exc}") from None
    missing = sorted(set(members.values()) - set(found))
    if missing and missing != ["config"]:
        raise FetchError(f"{deb.name} has no {', '.join(missing)} "
                         f"(looked for {', '.join(sorted(members))})")
    return found


def _link_unpacked(deb: Path, members: dict[str, str], paths: dict[str, Path],
                   manifest: _Manifest) -> dict[str, Path] | None:
    """The members hard-linked from ``image.debian.unpacked``'s extraction of the same .deb (``package DEB``
    ran first), so the cache holds one copy of a 589 MB vmlinux; None when that extraction lacks one of them."""
    record = next((r for r in manifest.data["debs"].values() if r.get("file") == deb.name), None)
    if record is None:
        return None
    sources = {role: unpacked_member(deb.parent, record["sha256"], PurePosixPath(member.lstrip("./")))
               for member, role in members.items()}
    if any(path is None for path in sources.values()):
        return None
    for role, source in sources.items():
        partial = paths[role].with_name(f"{paths[role].name}.{os.getpid()}.part")
        try:
            os.link(source, partial)
            os.replace(partial, paths[role])
        except OSError:
            partial.unlink(missing_ok=True)
            return None
        manifest.record("files", role, paths[role])
    return dict(paths)


def _copy_hashing(source, sink) -> str:
    digest = hashlib.sha256()
    while chunk := source.read(1 << 20):
        digest.update(chunk)
        sink.write(chunk)
    return digest.hexdigest()


def extract_modules(name: str, names: list[str] | None = None, cache_dir: str | os.PathLike | None = None,
                    progress=None) -> list[Path]:
    """The kernel modules of kernel ``name`` (all of them, or those whose file name is in ``names``),
    extracted from its ``-unsigned`` package into ``<cache>/<name>/modules``; reused when there."""
    spec = KERNELS.get(name)
    if spec is None:
        raise FetchError(f"unknown kernel {name!r}: choose one of {', '.join(sorted(KERNELS))}")
    cache = Path(cache_dir or default_cache_dir())
    target = cache / name / "modules"
    wanted = None if names is None else set(names)
    manifest = _Manifest.load(cache / name / "manifest.json")
    deb = _obtain_deb(cache, spec.unsigned, manifest, False, progress or (lambda line: None))
    found: list[Path] = []
    done = target / ".complete"
    if done.exists():
        found = sorted(p for p in target.rglob("*.ko*") if wanted is None or p.name in wanted)
        if wanted is None or {p.name for p in found} >= wanted:
            return found
    (progress or (lambda line: None))(f"extracting modules from {deb.name} ...")
    target.mkdir(parents=True, exist_ok=True)
    with open_data_tar(deb) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            base = member.name.rsplit("/", 1)[-1]
            if not member.isfile() or ".ko" not in base or (wanted is not None and base not in wanted):
                continue
            path = target / member.name.split("/kernel/", 1)[-1]
            path.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            with open(path, "wb") as sink:
                shutil.copyfileobj(source, sink)
            found.append(path)
    if wanted is None:
        done.write_text("")
    return sorted(found)


def named_parts(name: str, cache_dir: str | os.PathLike | None = None, progress=None) -> KernelParts:
    """Kernel ``name``'s vmlinux (from -dbg, with its symbols) and every module (``image.debian``)."""
    kernel = fetch(name, cache_dir, progress=progress)
    target = Path(cache_dir or default_cache_dir()) / name / "modules"
    modules = sorted(((p.relative_to(target).as_posix(), str(p)) for p in extract_modules(name, None, cache_dir,
                                                                                           progress)),
                     key=lambda item: module_order(item[0]))
    return KernelParts(kernel.release, kernel.vmlinux, None, tuple(modules),
                       f"{name}: vmlinux {kernel.vmlinux} (ELF with its symbols); {len(modules):,} modules under "
                       f"{target}")
