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
