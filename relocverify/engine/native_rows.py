"""The packed-row writer in C (``row_pack.c``, see ``worker.Worker.function_rows``): the module when it is
built from the source beside it, else None (``Worker._walk_rows`` serves), and one line that says which."""

from __future__ import annotations

import hashlib
from pathlib import Path


def _load():
    try:
        from . import row_pack as module
    except ImportError:
        return None, "one walk in Python (the packed-row writer is not built: install with a C compiler)"
    source = Path(__file__).with_name("row_pack.c")
    if source.is_file() and hashlib.sha256(source.read_bytes()).hexdigest() != module.SOURCE_SHA256:
        return None, "one walk in Python (the packed-row writer was built from another row_pack.c: pip install -e . again)"
    return module, "native"


ROW_PACK, STATUS = _load()
