"""relocverify's own optional C extensions: which build serves, if any.

Each extension is a second implementation of Python code it is tested against (``setup.py`` lists
them).  A build carries the SHA-256 of the source it was made from; ``load`` refuses one made from
another source (a ``.c`` file edited and not rebuilt), so that the Python path serves rather than a
stale build.  Cheap to import: ``relocverify --version`` prints every extension's status line."""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path


def load(package: str, name: str, here: str, python_path: str, what: str) -> tuple[object | None, str]:
    """(module, "native"), or (None, why ``python_path`` serves): the extension ``package.name`` built
    from ``name.c`` beside ``here`` (a module's ``__file__``); ``what`` names it for the reader."""
    try:
        module = importlib.import_module(f"{package}.{name}")
    except ImportError:
        return None, f"{python_path} ({what} is not built: install with a C compiler)"
    source = Path(here).with_name(f"{name}.c")
    if source.is_file() and hashlib.sha256(source.read_bytes()).hexdigest() != module.SOURCE_SHA256:
        return None, f"{python_path} ({what} was built from another {name}.c: pip install -e . again)"
    return module, "native"
