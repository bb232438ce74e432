"""The native walk of libVEX's blocks (``irsb_walk.c``, see ``lifted``): the module when it is built from
the source beside it, else None, and one line that says which walk serves (``extensions.load``).

Cheap to import (no pyvex): ``relocverify --version`` prints ``STATUS``."""

from __future__ import annotations

from ..extensions import load

MODULE, STATUS = load(__package__, "irsb_walk", __file__, "pyvex objects", "the native walk")
