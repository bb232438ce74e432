"""SQLite's errors as the rest of the program sees them: the store stage is the only one that
imports ``sqlite3``.

``DatabaseError`` is what the command line catches around a command (a store or the proof cache
that SQLite cannot use: damaged, full, read-only); ``environment_line`` turns one that says the
environment failed (a full or read-only disk, a file that cannot be opened) into one line naming
the store, and returns None for anything else (a damaged file, a bug)."""

from __future__ import annotations

import sqlite3

from ..errors import InputError

DatabaseError = sqlite3.DatabaseError

#: (what SQLite says, what the line says), for the errors that are the environment's.
ENVIRONMENT = (("database or disk is full", "no space left on the device"),
               ("readonly database", "the filesystem or the file is read-only"),
               ("unable to open database", "cannot open it"), ("disk I/O error", "a disk I/O error"))


def environment_line(exc: BaseException, path: str) -> InputError | None:
    """An SQLite error that says the environment failed, as one line naming ``path``; else None."""
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc)
        for needle, why in ENVIRONMENT:
            if needle in text:
                return InputError(f"{path}: cannot write the store: {why}")
    return None
