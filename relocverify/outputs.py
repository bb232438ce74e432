"""Output paths: checked against every input before anything is written, and written atomically.

``check_paths(inputs, outputs)`` is called once per command, before its work:
an output that is (after symlinks, hard links or ``..``) one of the inputs or
another output, a directory output that holds an input, an output that is not
a regular file (``/dev/full``, a FIFO), or a report directory holding someone
else's ``index.html`` is refused with one line (exit 2), and nothing has been
written.

``write_atomic(path, data)`` writes a temporary file beside ``path`` and
renames it over ``path``: a reader sees the old file or the new one, never
half of one.  A full or read-only filesystem is an ``InputError`` naming the
file, with the temporary file removed.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from typing import Iterable

from .errors import InputError

#: What the report writes into its index.html; a directory whose index.html lacks it belongs to someone else.
REPORT_MARK = '<meta name="generator" content="relocverify report">'


def _identity(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def check_paths(inputs: Iterable[str | None], outputs: Iterable[str | None], directories: Iterable[str | None] = ()) -> None:
    """Refuse any output (file) or output directory that would overwrite an input; see the module doc."""
    ins = [p for p in inputs if p]
    outs = [p for p in outputs if p]
    dirs = [p for p in directories if p]
    seen: dict = {}
    for out in outs:
        if os.path.isdir(out):
            raise InputError(f"{out}: is a directory; name a file to write")
        if os.path.exists(out):
            st = os.stat(out)
            if not stat.S_ISREG(st.st_mode):
                raise InputError(f"{out}: not a regular file (a device, FIFO or socket): name a file to write")
        key = _identity(out) or _real(out)
        if key in seen:
            raise InputError(f"{out}: the same file as {seen[key]}; name two different outputs")
        seen[key] = out
        for inp in ins:
            if (_identity(out) is not None and _identity(out) == _identity(inp)) or _real(out) == _real(inp):
                raise InputError(f"{out}: is the input {inp}; writing it would destroy the input")
    for d in dirs:
        real = _real(d)
        for inp in ins + outs:
            r = _real(inp)
            if r == real or r.startswith(real + os.sep):
                raise InputError(f"{d}: holds {inp}, which this command reads or writes; write the report "
                                 f"elsewhere")
        if os.path.exists(d) and not os.path.isdir(d):
            raise InputError(f"{d}: exists and is not a directory")
        index = os.path.join(d, "index.html")
        if os.path.exists(index):
            try:
                with open(index, "rb") as fh:
                    head = fh.read(4096)
            except OSError as exc:
                raise InputError(f"{index}: cannot read: {exc.strerror}") from None
            if REPORT_MARK.encode() not in head:
                raise InputError(f"{d}: already holds an index.html that relocverify did not write; choose an "
                                 f"empty directory or one of its own reports")


def _new_file_mode(path: str) -> int:
    """The mode ``path`` would get from a plain ``open``: its own if it exists, else 0666 less the umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def write_atomic(path: str, data: bytes | str | Iterable[bytes | str]) -> None:
    """Write ``data`` (or each chunk of it, for output too large to hold at once) to ``path`` through a
    temporary file and a rename (see the module doc).  The file gets the mode a plain write would give it."""
    chunks = (data,) if isinstance(data, (bytes, str)) else data
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = None, None
    try:
        mode = _new_file_mode(path)
        fd, tmp = tempfile.mkstemp(prefix=".relocverify-", dir=directory)
        with os.fdopen(fd, "wb") as fh:
            fd = None
            for chunk in chunks:
                fh.write(chunk.encode() if isinstance(chunk, str) else chunk)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise InputError(f"{path}: cannot write: {_why(exc)}") from None
    finally:
        if fd is not None:
            os.close(fd)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _why(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "no space left on the device"
    if exc.errno == errno.EROFS:
        return "the filesystem is read-only"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return exc.strerror or str(exc)


def environment_error(exc: BaseException, path: str) -> InputError | None:
    """An OSError that says the environment, not the program, failed (full or read-only disk,
    permissions), as one line naming ``path``; None for anything else (SQLite's own errors:
    ``store.sqlite_errors.environment_line``)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT):
        return InputError(f"{path}: cannot write: {_why(exc)}")
    return None
