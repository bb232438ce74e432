"""The native walk of libVEX's blocks (``irsb_walk.c``, see ``lifted``): the module when it is built from
the source beside it, else None, and one line that says which walk serves.

Cheap to import (no pyvex): ``relocverify --version`` prints ``STATUS``."""

from __future__ import annotations

import hashlib
from pathlib import Path


def _load():
    try:
        from . import irsb_walk as module
    except ImportError:
        return None, "pyvex objects (the native walk is not built: install with a C compiler)"
    source = Path(__file__).with_name("irsb_walk.c")
    if source.is_file() and hashlib.sha256(source.read_bytes()).hexdigest() != module.SOURCE_SHA256:
        return None, "pyvex objects (the native walk was built from another irsb_walk.c: pip install -e . again)"
    return module, "native"


MODULE, STATUS = _load()
