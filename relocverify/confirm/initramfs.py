"""Initramfs archives: the cpio "newc" format the kernel unpacks into its rootfs.

``archive(entries)`` returns the bytes of one archive; archives concatenated are unpacked one after
the other (``init/initramfs.c``), so a run adds its own small archive (its script, a user's trigger)
after the cached guest's without rewriting it.  Entries are written in the order given; a
directory must come before what it holds.  Every entry has uid 0, gid 0 and mtime 0, so the same
entries give the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

_S_IFDIR, _S_IFREG, _S_IFLNK = 0o040000, 0o100000, 0o120000
_TRAILER = "TRAILER!!!"


@dataclass(frozen=True)
class Entry:
    """One file, directory or symbolic link; ``path`` relative to the root, without a leading slash."""

    path: str
    kind: str  # 'file' | 'dir' | 'symlink'
    data: bytes = b""  # a file's bytes, a link's target
    mode: int = 0o755


def directory(path: str) -> Entry:
    return Entry(path, "dir")


def file(path: str, data: bytes, mode: int = 0o755) -> Entry:
    return Entry(path, "file", data, mode)


def symlink(path: str, target: str) -> Entry:
    return Entry(path, "symlink", target.encode(), 0o777)


def archive(entries: list[Entry]) -> bytes:
    """The newc archive of ``entries``, ended by its trailer."""
    out = bytearray()
    for number, entry in enumerate(entries, 1):
        kind = {"dir": _S_IFDIR, "file": _S_IFREG, "symlink": _S_IFLNK}[entry.kind]
        _append(out, number, kind | (entry.mode & 0o7777), 2 if entry.kind == "dir" else 1, entry.path.lstrip("/"),
                b"" if entry.kind == "dir" else entry.data)
    _append(out, 0, 0, 1, _TRAILER, b"")
    while len(out) % 512:
        out.append(0)
    return bytes(out)


def _append(out: bytearray, inode: int, mode: int, links: int, name: str, data: bytes) -> None:
    encoded = name.encode() + b"\0"
    fields = (inode, mode, 0, 0, links, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
    out += b"070701" + b"".join(b"%08x" % value for value in fields)
    out += encoded
    _pad(out)
    out += data
    _pad(out)


def _pad(out: bytearray) -> None:
    while len(out) % 4:
        out.append(0)
