"""relocverify's own optional C extensions: which build serves, if any.

Each extension is a second implementation of Python code it is tested against (``setup.py`` lists
them).  A build carries the SHA-256 of the source it was made from (``build_digest``: the ``.c`` file
and its own headers); ``load`` refuses one made from another source (a file edited and not rebuilt), so
that the Python path serves rather than a stale build.  Cheap to import: ``relocverify --version`` prints every extension's status line."""

from __future__ import annotations

import hashlib
import importlib
import re
from pathlib import Path

_LOCAL_INCLUDE = re.compile(rb'^#include "([^"/]+)"', re.M)


def build_digest(source: str | Path) -> str:
    """The SHA-256 a build carries: of a ``.c`` file followed by each header it includes (``#include
    "name.h"``) that lies beside it, in the order it names them (a header found on the include path, such as
    pyvex's, is the pinned dependency's, not ours).  ``setup.py`` computes it for the build, ``load`` for the
    file beside the module; a header edited and not rebuilt is a stale build too."""
    source = Path(source)
    text = source.read_bytes()
    h = hashlib.sha256(text)
    for name in _LOCAL_INCLUDE.findall(text):
        header = source.parent / name.decode()
        if header.is_file():
            h.update(header.read_bytes())
    return h.hexdigest()


def load(package: str, name: str, here: str, python_path: str, what: str) -> tuple[object | None, str]:
    """(module, "native"), or (None, why ``python_path`` serves): the extension ``package.name`` built
    from ``name.c`` beside ``here`` (a module's ``__file__``); ``what`` names it for the reader."""
    try:
        module = importlib.import_module(f"{package}.{name}")
    except ImportError:
        return None, f"{python_path} ({what} is not built: install with a C compiler)"
    source = Path(here).with_name(f"{name}.c")
    if source.is_file() and build_digest(source) != module.SOURCE_SHA256:
        return None, f"{python_path} ({what} was built from another {name}.c: pip install -e . again)"
    return module, "native"
