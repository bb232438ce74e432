"""A kernel's parts, from Debian packages or from a directory: its vmlinux and every module.

``relocverify package`` takes a named kernel (``image.fetch``), a kernel
image ``.deb`` (optionally with its ``-dbg`` package), or a directory, and
needs the same three things from each, a :class:`KernelParts`:

* the vmlinux: the unstripped ELF when there is one (the ``-dbg`` package's
  ``usr/lib/debug/boot/vmlinux-<release>``, or a ``vmlinux`` beside the
  modules or through their ``build``/``source`` link), else a stripped ELF or
  the ``boot/vmlinuz-<release>`` bzImage with a real System.map.  Debian's
  ``boot/System.map-<release>`` is a one-line placeholder that points to the
  ``-dbg`` package; with only that, there are no symbols and the input is
  refused (``InputError``, one line);
* the modules (``.ko``, ``.ko.xz``, ``.ko.zst``) under
  ``lib/modules/<release>/``, each named by its path below ``kernel/`` (or
  below ``lib/modules/<release>/`` for ``updates/``, ``extra/``), and sorted
  as ``image.fetch.extract_modules`` sorts a named kernel's, so that
  ``--limit-modules N`` picks the same N modules from any source;
* ``used``: one line that says which files those are.

A ``.deb`` is read with python-debian (``debian.debfile.DebFile``: the ar
container and the control fields); its ``data.tar.*`` is decompressed as a
stream (xz, gzip, bzip2, zstd) and read once from the front
(:func:`open_data_tar`), so the bulk of a ``-dbg`` package (module debug
info, after the vmlinux) is never decompressed.  The wanted members are
extracted once into ``<cache>/debs/<package file name>/`` with their
package paths, and reused while the ``.deb``'s size and mtime are the same.
A ``-dbg`` package's vmlinux (589 MB for the 6.1 cloud kernel) is extracted once per cache: when
``image.fetch`` already extracted it from the same ``.deb`` (the same sha256) for a named kernel, the
files are hard links to that copy (``shared_files``), and ``image.fetch`` links to ours the other way.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import json
import lzma
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from ..environment import default_cache_dir
from ..errors import FetchError, InputError
from .apt import download_version

MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst")
#: A real System.map names tens of thousands of symbols; Debian's placeholder is one 83-byte line.
PLACEHOLDER_MAX_BYTES = 4096
DBG_SUFFIXES = ("-dbg", "-dbgsym")


@dataclass(frozen=True)
class KernelParts:
    """What ``relocverify package`` verifies: a vmlinux (with its System.map when it needs one) and
    its modules as (name, path), in the order ``--limit-modules`` counts them."""

    release: str | None
    vmlinux: str
    system_map: str | None
    modules: tuple[tuple[str, str], ...]
    used: str


def module_order(name: str) -> PurePosixPath:
    """The sort key of a module's name: by path components, as ``sorted()`` orders the Paths of
    ``image.fetch.extract_modules`` (``a/x.ko`` before ``a-b/x.ko``)."""
    return PurePosixPath(name)


def is_module(name: str) -> bool:
    return name.endswith(MODULE_SUFFIXES)


# --- the .deb format ---------------------------------------------------------------

def control_fields(deb: str | os.PathLike) -> dict[str, str]:
    """The ``control`` fields of a .deb (Package, Version, ...)."""
    from debian.arfile import ArError
    from debian.debfile import DebFile

    try:
        with DebFile(os.fspath(deb)) as package:
            return dict(package.debcontrol())
    except (ArError, OSError, ValueError, tarfile.TarError, KeyError) as exc:
        raise FetchError(f"{os.fspath(deb)}: not a readable Debian package: {exc}") from None


@contextlib.contextmanager
def open_data_tar(deb: str | os.PathLike):
    """The decompressed ``data.tar.*`` member of a .deb, as a forward-only stream."""
    from debian.arfile import ArError
    from debian.debfile import DebFile

    path = Path(deb)
    try:
        package = DebFile(os.fspath(path))
    except (ArError, OSError, ValueError) as exc:
        raise FetchError(f"{path.name} is not a Debian package: {exc}") from None
    try:
        name = next(n for n in package.getnames() if n.startswith("data.tar"))
        stream = _decompressing(package.getmember(name), name, path)
        try:
            yield stream
        finally:
            stream.close()
    finally:
        package.close()


def _decompressing(member, name: str, deb: Path):
    if name == "data.tar":
        return member
    if name.endswith(".xz") or name.endswith(".lzma"):
        return lzma.LZMAFile(member)
    if name.endswith(".gz"):
        return gzip.GzipFile(fileobj=member)
    if name.endswith(".bz2"):
        return bz2.BZ2File(member)
    if name.endswith(".zst"):
        import zstandard
        return zstandard.ZstdDecompressor().stream_reader(member)
    raise FetchError(f"{deb.name}: unsupported {name}")


def member_path(name: str) -> PurePosixPath | None:
    """A tar member's path relative to the package root, or None when it would leave it."""
    path = PurePosixPath(name.lstrip("/"))
    parts = [p for p in path.parts if p != "."]
    if not parts or ".." in parts:
        return None
    return PurePosixPath(*parts)


#: Bounds on what one package may make us write, checked from each member's header before it is written.
MAX_MEMBERS = 100_000  # members read (Debian's largest kernel image package has under 8,000)
MAX_MEMBER_BYTES = 2 << 30  # one file (a debug vmlinux is under 1 GiB)
MAX_TOTAL_BYTES = 8 << 30  # everything extracted from one package


def extract(deb: str | os.PathLike, wanted: Callable[[PurePosixPath], bool], target: Path,
            enough: Callable[[list[PurePosixPath]], bool] = lambda found: False) -> list[PurePosixPath]:
    """Extract the regular files of ``deb`` whose package path ``wanted`` accepts into ``target``
    under that path; stop reading once ``enough`` says so.  Returns the paths extracted.

    A jail: only regular files are written (no link, device or directory entry is followed or made), at a
    path inside ``target`` (no ``..``, no absolute path), each checked against the bounds from its header
    before a byte is written (``MAX_MEMBER_BYTES``, ``MAX_TOTAL_BYTES``; a sparse member counts at its full
    size), at most ``MAX_MEMBERS`` members read; a member named twice is an error, not a silent overwrite;
    a partial file is removed whatever stops the copy."""
    found: list[PurePosixPath] = []
    seen: set[PurePosixPath] = set()
    total = members = 0
    name = Path(deb).name
    try:
        with open_data_tar(deb) as stream, tarfile.open(fileobj=stream, mode="r|") as archive:
            for entry in archive:
                members += 1
                if members > MAX_MEMBERS:
                    raise FetchError(f"{name}: more than {MAX_MEMBERS:,} members; not a kernel package")
                path = member_path(entry.name)
                if path is None or not entry.isfile() or not wanted(path):
                    continue
                if path in seen:
                    raise FetchError(f"{name}: {path} appears twice in the package; refused rather than one "
                                     f"of them dropped")
                seen.add(path)
                total += entry.size
                if entry.size > MAX_MEMBER_BYTES or total > MAX_TOTAL_BYTES:
                    raise FetchError(f"{name}: {path} would make {entry.size:,} bytes ({total:,} in all), past "
                                     f"the bound of {MAX_MEMBER_BYTES:,} a file and {MAX_TOTAL_BYTES:,} a package")
                _write_member(archive, entry, target / path)
                found.append(path)
                if enough(found):
                    break
    except (tarfile.TarError, EOFError, ValueError, OSError, lzma.LZMAError) as exc:
        raise FetchError(f"cannot extract {name}: {exc}") from None
    return found


def _write_member(archive, entry, destination: Path) -> None:
    """One member's bytes to ``destination`` through a partial file, removed if the copy stops."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".part")
    try:
        with archive.extractfile(entry) as source, open(partial, "wb") as sink:
            shutil.copyfileobj(source, sink, 1 << 20)
        os.replace(partial, destination)
    finally:
        partial.unlink(missing_ok=True)


# --- kernel packages ---------------------------------------------------------------------

def _image_wanted(path: PurePosixPath) -> bool:
    parts = path.parts
    if parts[:1] == ("boot",):
        return len(parts) == 2
    return parts[:2] == ("lib", "modules") or parts[:3] == ("usr", "lib", "modules")


def _dbg_wanted(path: PurePosixPath) -> bool:
    return path.parent == PurePosixPath("usr/lib/debug/boot") and path.name.startswith(("vmlinux-", "System.map-"))


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _directory_name(package: str, version: str, digest: str) -> str:
    """``<package>_<version>_<sha256 prefix>`` with every character outside [A-Za-z0-9.+~_-] dropped: never
    empty, ``.`` or ``..`` (a file named ``.deb`` made it the cache's ``debs/`` itself, removed whole), and two
    packages with one name, size and time but other bytes never share it."""
    keep = lambda text: "".join(c for c in text if c.isascii() and (c.isalnum() or c in ".+~_-"))  # noqa: E731
    return f"{keep(package)[:80]}_{keep(version)[:40]}_{digest[:16]}"


def unpacked(deb: str | os.PathLike, cache_dir: str | os.PathLike | None = None, progress=None,
             fields: dict[str, str] | None = None) -> Path:
    """The directory ``<cache>/debs/<package>_<version>_<digest>/`` holding what ``package`` needs of ``deb``
    (its ``boot/`` files and modules, or a -dbg package's vmlinux and System.map), extracted on first use
    (``extract``: the jail), named by the package's content."""
    deb = Path(deb)
    fields = fields if fields is not None else control_fields(deb)
    package = fields.get("Package", "")
    dbg = package.endswith(DBG_SUFFIXES)
    digest = _sha256(deb)
    target = Path(cache_dir or default_cache_dir()) / "debs" / _directory_name(package, fields.get("Version", ""),
                                                                              digest)
    marker = target / ".complete"
    stat = deb.stat()
    stamp = {"package": package, "version": fields.get("Version", ""), "size": stat.st_size,
             "mtime_ns": stat.st_mtime_ns, "sha256": digest}
    try:
        if json.loads(marker.read_text()) == stamp:
            return target
    except (OSError, ValueError):
        pass
    (progress or (lambda line: None))(f"extracting {'vmlinux, System.map' if dbg else 'boot/, modules'} "
                                      f"from {deb.name} into {target} ...")
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    if dbg:
        if not _link_shared(Path(cache_dir or default_cache_dir()), digest, target):
            extract(deb, _dbg_wanted, target, lambda found: len(found) >= 2)
    else:
        extract(deb, _image_wanted, target)
    marker.write_text(json.dumps(stamp))
    return target


def shared_files(cache: Path, digest: str) -> dict[str, Path]:
    """Files a named kernel's fetch (``image.fetch``) extracted from the .deb of sha256 ``digest``, by file name,
    those still as its ``manifest.json`` records them (size and modification time)."""
    for manifest in sorted(cache.glob("*/manifest.json")):
        try:
            data = json.loads(manifest.read_text())
            if not any(r.get("sha256") == digest for r in data.get("debs", {}).values()):
                continue
            found = {}
            for record in data.get("files", {}).values():
                path = manifest.parent / record["file"]
                stat = path.stat() if path.is_file() else None
                if stat and stat.st_size == record["size"] and stat.st_mtime_ns == record["mtime_ns"]:
                    found[record["file"]] = path
            return found
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return {}


def unpacked_member(cache: Path, digest: str, member: PurePosixPath) -> Path | None:
    """``member`` as ``unpacked`` extracted it from the .deb of sha256 ``digest``, when it did."""
    for marker in sorted((cache / "debs").glob(f"*_{digest[:16]}/.complete")):
        try:
            if json.loads(marker.read_text()).get("sha256") == digest and (marker.parent / member).is_file():
                return marker.parent / member
        except (OSError, ValueError, AttributeError):
            continue
    return None


def _link_shared(cache: Path, digest: str, target: Path) -> bool:
    """A -dbg package's vmlinux and System.map hard-linked into ``target`` from a named kernel's extraction of
    the same .deb; False (nothing left behind) when there is none or a link cannot be made."""
    shared = {name: path for name, path in shared_files(cache, digest).items()
              if _dbg_wanted(PurePosixPath("usr/lib/debug/boot") / name)}
    if not any(name.startswith("vmlinux-") for name in shared):
        return False
    boot = target / "usr/lib/debug/boot"
    boot.mkdir(parents=True, exist_ok=True)
    try:
        for name, path in shared.items():
            os.link(path, boot / name)
    except OSError:
        shutil.rmtree(boot, ignore_errors=True)
        return False
    return True


def from_debs(image_deb: str | os.PathLike, dbg_deb: str | os.PathLike | None = None,
              cache_dir: str | os.PathLike | None = None, progress=None) -> KernelParts:
    """The parts of a kernel image package (``linux-image-<release>[-unsigned]_*.deb``), with the
    unstripped vmlinux and real System.map of its ``-dbg`` package if given."""
    fields = control_fields(image_deb)
    image, version = fields.get("Package", ""), fields.get("Version", "")
    if not image.startswith("linux-image-") or image.endswith(DBG_SUFFIXES):
        what = "the -dbg package: pass the linux-image package as DEB and this one with --dbg" \
            if image.endswith(DBG_SUFFIXES) else f"{image or 'a package'}, not a linux-image package"
        raise InputError(f"{os.fspath(image_deb)}: {what}")
    dbg_fields = None
    if dbg_deb is None:
        dbg_deb = matching_dbg(image_deb, image, version, cache_dir, progress)
    if dbg_deb is not None:
        dbg_fields = control_fields(dbg_deb)
        name = dbg_fields.get("Package", "")
        if not name.endswith(DBG_SUFFIXES) or dbg_fields.get("Version") != version:
            raise InputError(f"--dbg {os.fspath(dbg_deb)}: {name or 'not a package'} {dbg_fields.get('Version', '')} "
                             f"does not go with {image} {version}: pass the -dbg package of the same version")
    roots = [unpacked(image_deb, cache_dir, progress, fields)]
    releases = _releases(roots[0])
    if len(releases) != 1:
        raise InputError(f"{os.fspath(image_deb)}: {image} holds {len(releases)} kernel releases "
                         f"({', '.join(releases) or 'no lib/modules/<release>, no boot/vmlinuz-<release>'})")
    release = releases[0]
    if dbg_deb is not None:
        roots.append(unpacked(dbg_deb, cache_dir, progress, dbg_fields))
        if not (roots[-1] / f"usr/lib/debug/boot/vmlinux-{release}").is_file():
            raise InputError(f"--dbg {os.fspath(dbg_deb)}: has no usr/lib/debug/boot/vmlinux-{release}: "
                             f"not the -dbg package of {image}")
    return _parts(_Tree(roots), release, Path(os.fspath(image_deb)).name, dbg_deb is not None)


def dbg_name(image: str) -> str:
    """The ``-dbg`` package of a linux-image package: ``linux-image-6.1.0-53-cloud-amd64-unsigned`` ->
    ``linux-image-6.1.0-53-cloud-amd64-dbg``."""
    return image.removesuffix("-unsigned") + "-dbg"


def matching_dbg(image_deb: str | os.PathLike, image: str, version: str, cache_dir=None, progress=None) -> Path | None:
    """The ``-dbg`` package of ``image`` at ``version`` when none was given: a .deb of that name and version
    beside ``image_deb``, else one in the cache, else one ``apt-get download`` fetches into the cache by
    name and version; None when none is to be had (then the image's own symbols serve, or the refusal says
    to pass --dbg).  Only a package whose control fields say that name and version is taken."""
    name = dbg_name(image)
    cache = Path(cache_dir or default_cache_dir())
    for where in (Path(os.fspath(image_deb)).resolve().parent, cache):
        for candidate in sorted(where.glob(f"{name}_*.deb")):
            fields = control_fields(candidate)
            if fields.get("Package") == name and fields.get("Version") == version:
                return candidate
    try:
        cache.mkdir(parents=True, exist_ok=True)
        (progress or (lambda line: None))(f"downloading {name}={version} (its symbols) into {cache} ...")
        return download_version(cache, name, version, update=False)  # the lists as they are: no apt-get update
    except (FetchError, OSError):
        return None


# --- directories ---------------------------------------------------------------------------

class _Tree:
    """Package paths looked up in several roots (an image package and its -dbg, unpacked apart)."""

    def __init__(self, roots: list[Path]):
        self.roots = roots

    def find(self, relative: str) -> Path | None:
        for root in self.roots:
            path = root / relative
            if path.is_file():
                return path
        return None

    def dirs(self, relative: str) -> list[Path]:
        return [root / relative for root in self.roots if (root / relative).is_dir()]


def _releases(root: Path) -> list[str]:
    """Kernel releases of a package tree: lib/modules/<release> directories, else boot/vmlinuz-<release>."""
    found = set()
    for base in (root / "lib" / "modules", root / "usr" / "lib" / "modules"):
        if base.is_dir():
            found.update(p.name for p in base.iterdir() if p.is_dir())
    if not found:
        for pattern, where in (("vmlinuz-*", root / "boot"), ("vmlinux-*", root / "usr/lib/debug/boot")):
            if where.is_dir():
                found.update(p.name.split("-", 1)[1] for p in where.glob(pattern) if p.is_file())
    return sorted(found)


def from_directory(directory: str | os.PathLike) -> KernelParts:
    """The parts of a kernel in a directory: ``/lib/modules/<release>`` (the root is then the one
    above ``lib/``), an unpacked package tree (``boot/``, ``lib/modules/<release>/``,
    ``usr/lib/debug/boot/`` for a -dbg), or a build tree (``vmlinux`` at its top)."""
    path = Path(os.path.abspath(directory))
    parts = path.parts
    if len(parts) >= 4 and parts[-2] == "modules" and parts[-3] == "lib":
        root = Path(*parts[:-3])
        if root.name == "usr" and not (root / "boot").is_dir():
            root = root.parent  # /usr/lib/modules/<release> on a merged-/usr system
        return _parts(_Tree([root]), path.name, str(path), False, modules_dir=path)
    releases = _releases(path)
    if len(releases) == 1:
        return _parts(_Tree([path]), releases[0], str(path), False)
    if len(releases) > 1:
        raise InputError(f"{path}: holds {len(releases)} kernel releases ({', '.join(releases)}): "
                         f"name one, e.g. {path / 'lib' / 'modules' / releases[0]}")
    if (path / "vmlinux").is_file():
        return _parts(_Tree([path]), None, str(path), False, modules_dir=path)
    raise InputError(f"{path}: not a kernel directory: expected lib/modules/<release>/ (an unpacked package), "
                     f"a /lib/modules/<release> directory, or a build tree with vmlinux at its top")


def _vmlinux_candidates(release: str | None, modules_dir: Path | None) -> list[str]:
    """Relative paths (or absolute ones, beside the modules) where a vmlinux may be, best first."""
    out = []
    if release is not None:
        out += [f"usr/lib/debug/boot/vmlinux-{release}", f"usr/lib/debug/lib/modules/{release}/vmlinux",
                f"usr/lib/debug/vmlinux-{release}"]
    if modules_dir is not None:
        out += [str(modules_dir / "build" / "vmlinux"), str(modules_dir / "source" / "vmlinux"),
                str(modules_dir / "vmlinux")]
    if release is not None:
        out += [f"lib/modules/{release}/build/vmlinux", f"lib/modules/{release}/source/vmlinux",
                f"boot/vmlinux-{release}", f"boot/vmlinuz-{release}"]
    return out


def _map_candidates(release: str | None, modules_dir: Path | None) -> list[str]:
    out = []
    if release is not None:
        out += [f"usr/lib/debug/boot/System.map-{release}", f"boot/System.map-{release}"]
    if modules_dir is not None:
        out += [str(modules_dir / "build" / "System.map"), str(modules_dir / "System.map")]
    return out


def _lookup(tree: _Tree, relative: str) -> Path | None:
    if os.path.isabs(relative):
        return Path(relative) if os.path.isfile(relative) else None
    return tree.find(relative)


def has_symbols(path: Path) -> bool | None:
    """True for an ELF with a non-empty ``.symtab``, False for a stripped ELF, None for anything else
    (a bzImage)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as handle:
            if handle.read(4) != b"\x7fELF":
                return None
            handle.seek(0)
            symtab = ELFFile(handle).get_section_by_name(".symtab")
            return symtab is not None and symtab["sh_size"] > 0
    except (ELFError, OSError, ValueError):
        return None


def is_placeholder(path: Path) -> bool:
    """Debian's ``boot/System.map-<release>``: one line saying the real one is in the -dbg package."""
    try:
        if path.stat().st_size > PLACEHOLDER_MAX_BYTES:
            return False
        text = path.read_bytes()
    except OSError:
        return True
    return not text.strip() or (b"System.map" in text and b"dbg" in text)


def _parts(tree: _Tree, release: str | None, source: str, with_dbg: bool, modules_dir: Path | None = None
           ) -> KernelParts:
    vmlinux, system_map, why = _choose_vmlinux(tree, release, modules_dir, source, with_dbg)
    modules = _modules(tree, release, modules_dir)
    where = sorted({str(Path(p).parent) for _, p in modules})
    base = os.path.commonpath(where) if where else "-"
    used = (f"{source}: vmlinux {vmlinux} ({why})" + (f" with {system_map}" if system_map else "")
            + f"; {len(modules):,} modules under {base}")
    return KernelParts(release, str(vmlinux), None if system_map is None else str(system_map), tuple(modules), used)


def _choose_vmlinux(tree: _Tree, release, modules_dir, source: str, with_dbg: bool):
    found = [p for p in (_lookup(tree, c) for c in _vmlinux_candidates(release, modules_dir)) if p is not None]
    for path in found:
        if has_symbols(path):
            return path, None, "ELF with its symbols"
    maps = [p for p in (_lookup(tree, c) for c in _map_candidates(release, modules_dir)) if p is not None]
    real = [m for m in maps if not is_placeholder(m)]
    if found and real:
        kind = "stripped ELF" if has_symbols(found[0]) is False else "bzImage"
        return found[0], real[0], kind
    if not found:
        raise InputError(f"{source}: no vmlinux or vmlinuz found (looked for "
                         f"{', '.join(_vmlinux_candidates(release, modules_dir))})")
    if maps:
        hint = "pass its -dbg package with --dbg FILE.deb" if source.endswith(".deb") and not with_dbg else \
            f"unpack linux-image-{release}-dbg there too (usr/lib/debug/boot/vmlinux-{release})"
        raise InputError(f"{source}: no symbols for {found[0].name}: {maps[0].name} is a placeholder (the real "
                         f"System.map is in the -dbg package); {hint}")
    raise InputError(f"{source}: {found[0]} has no symbols and there is no System.map beside it; "
                     f"add boot/System.map-{release} or the -dbg package's vmlinux")


def _modules(tree: _Tree, release: str | None, modules_dir: Path | None) -> list[tuple[str, str]]:
    """(name, path) of every module, named below kernel/ (else below the release's directory)."""
    if modules_dir is not None:
        tops = [modules_dir]
    else:
        tops = tree.dirs(f"lib/modules/{release}") or tree.dirs(f"usr/lib/modules/{release}")
    out: dict[str, str] = {}
    for top in tops:
        for folder, subdirs, files in os.walk(top):  # symlinks (build, source) are not followed
            for name in files:
                if not is_module(name):
                    continue
                path = Path(folder) / name
                relative = path.relative_to(top).as_posix()
                out.setdefault(relative.removeprefix("kernel/"), str(path))
    return sorted(out.items(), key=lambda item: module_order(item[0]))
