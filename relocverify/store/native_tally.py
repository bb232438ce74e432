"""The packed counts' tally in C (``tally.c``, see ``store.ImageReads.tallies``): the module when it is built from
the source beside it, else None, and one line that says which serves (``extensions.load``).

Cheap to import: ``relocverify --version`` prints ``STATUS``."""

from __future__ import annotations

from ..extensions import load

TALLY, STATUS = load(__package__, "tally", __file__, "one loop in Python", "the packed counts' tally")
