"""The CPU-validated form table: which instruction forms the semantics reproduces on real hardware.

``validated_forms.json`` (package data, written by ``relocverify selftest
--validate-forms``, see ``selftest.form_validation``) holds one row per
instruction form (``proof.forms``) seen in the Debian kernels, the
corpora and the planner's own trampolines.  For each, instances of the form
were run on this machine's CPU (``concrete.cpu``: every GPR, RFLAGS, the
x87 control/status/tag words and stack, MXCSR, zmm0-31 and k0-7, memory,
and the fault) and evaluated with the proof's semantics
(``proof.semantics`` through ``proof.evaluation``) from the same random
and edge states, and compared output by output:

``exact``  every output agreed on every state: the semantics of this form may
           be trusted anywhere, on either side of a relocation;
``loose``  some outputs differed (``loose`` lists which: flags the manuals
           leave undefined, a result left undefined, MXCSR status flags or
           NaN payloads VEX does not model, a VEX helper's scratch store, a
           fault VEX does not raise), every other output and the control flow
           agreed: the form may be trusted only as an original that the
           relocation re-executes (the CPU then computes the loose outputs
           alike on both sides), never as anything else;
``failed`` the control flow differed, or no state could be placed: never trusted.

A form with no row (``status`` None) was never run on a CPU: default deny.
The table records the CPU it was made on; ``digest()`` enters every proof
cache key, so a new table invalidates reused verdicts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

TABLE_NAME = "validated_forms.json"


@dataclass(frozen=True)
class FormRow:
    form: str
    status: str  # 'exact' | 'loose' | 'failed'
    loose: tuple[str, ...]  # for 'loose': the outputs that differed; for 'failed': why
    states: int  # states compared
    instances: tuple[str, ...]  # hex of the instances run (real kernel or corpus bytes)


@dataclass(frozen=True)
class FormTable:
    rows: dict
    cpu: str
    generated: str
    digest: bytes

    def row(self, form: str) -> FormRow | None:
        return self.rows.get(form)

    def status(self, form: str) -> str | None:
        row = self.rows.get(form)
        return None if row is None else row.status


def _parse(data: dict) -> dict[str, FormRow]:
    return {form: FormRow(form, r["status"], tuple(r.get("loose", ())), r.get("states", 0),
                          tuple(r.get("instances", ()))) for form, r in data.get("forms", {}).items()}


@lru_cache(maxsize=1)
def _text() -> str | None:
    """The shipped table's text (None if it is missing)."""
    try:
        return resources.files("relocverify.proof").joinpath(TABLE_NAME).read_text()
    except FileNotFoundError:
        return None


@lru_cache(maxsize=1)
def load() -> FormTable:
    """The table shipped with the package (an empty table, denying every form, if it is missing)."""
    text = _text()
    if text is None:
        return FormTable({}, "none", "never", digest())
    data = json.loads(text)
    return FormTable(_parse(data), data.get("cpu", "unknown"), data.get("generated", "unknown"), digest())


@lru_cache(maxsize=1)
def digest() -> bytes:
    """8 bytes identifying the table: part of every proof-cache key.  The hash of its text, so that
    a run that only needs the cache's tag (a repeated command) does not parse the table (0.25 s)."""
    text = _text()
    return hashlib.sha256(b"" if text is None else text.encode()).digest()[:8]
