"""The versions of every tool a verdict depends on, and one tag over them.

``tool_versions()`` is what a run records and ``--version`` prints;
``versions_tag()`` is its digest, part of every proof-cache key and of a
run's configuration, so that a verdict is reused only under the same tools.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from . import __version__
from .x86.decoders import capstone as cs_adapter
from .x86.decoders import iced as iced_adapter


#: The distributions whose versions a verdict depends on, by the name ``tool_versions`` gives them.
DISTRIBUTIONS = {"pyvex": "pyvex", "angr": "angr", "claripy": "claripy", "z3": "z3-solver", "unicorn": "unicorn",
                 "archinfo": "archinfo"}


@lru_cache(maxsize=1)
def tool_versions() -> dict[str, str]:
    """Read from the installed distributions' metadata, so that asking does not import angr."""
    versions = {"relocverify": __version__, "capstone": cs_adapter.version(), "iced": iced_adapter.version()}
    for name, dist in DISTRIBUTIONS.items():
        try:
            versions[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[name] = "missing"
    return versions


@lru_cache(maxsize=1)
def versions_tag() -> bytes:
    """8 bytes identifying ``tool_versions()``."""
    return hashlib.sha256(json.dumps(tool_versions(), sort_keys=True).encode()).digest()[:8]


@lru_cache(maxsize=2)
def source_digest(root: Path | None = None) -> bytes:
    """SHA-256 of relocverify's own source (every ``.py``, ``.json``, ``.c`` and ``.h`` file under ``root``, the
    package's directory by default, with its relative path)."""
    root = root or Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".json", ".c", ".h") and p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.digest()
