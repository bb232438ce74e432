"""Where relocverify keeps its files: the cache directory for downloaded
kernels and the persistent proof cache."""

from __future__ import annotations

import os


def default_cache_dir() -> str:
    """``$RELOCVERIFY_CACHE``, else ``~/.cache/relocverify``."""
    return os.environ.get("RELOCVERIFY_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "relocverify")


def default_proof_cache_dir() -> str:
    """Where the persistent proof cache lives: ``$RELOCVERIFY_PROOF_CACHE``, else the cache directory."""
    return os.environ.get("RELOCVERIFY_PROOF_CACHE") or default_cache_dir()


def unusable_directory(directory: str, exc: OSError) -> str:
    """Why ``directory`` could not be made, in words, naming the path at fault (it or a directory above it:
    a file, a link to nowhere) and the variable that named it, if one did: '/x/c (RELOCVERIFY_CACHE) is a
    file, not a directory'."""
    at = directory
    while at and not os.path.lexists(at) and os.path.dirname(at) != at:
        at = os.path.dirname(at)
    if os.path.islink(at) and not os.path.exists(at):
        what = f"is a link to nowhere (to {os.readlink(at)!r})"
    elif os.path.lexists(at) and not os.path.isdir(at):
        what = "is a file, not a directory"
    else:
        at, what = directory, f"cannot be created: {exc.strerror or exc}"
    named = [v for v in ("RELOCVERIFY_PROOF_CACHE", "RELOCVERIFY_CACHE") if os.environ.get(v) and
             os.path.join(directory, "").startswith(os.path.join(os.environ[v], ""))]
    return f"{at}{f' (from {named[0]})' if named else ''} {what}"
