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
``digest()`` enters every proof cache key, so a new table invalidates reused
verdicts.

Which CPUs: the top-level ``cpus`` list holds one ``CpuIdentity`` per CPU
that validated rows (``concrete.cpu_identity``: vendor, family, model,
stepping, the judge's features, XCR0, and what it did not compare), and each
row's ``cpus`` the indices of those whose readings make the row.  When they
all read the form alike the row is that reading; otherwise the row also
keeps ``readings`` (each CPU's status and outputs), its status is the worst
of them and ``loose`` adds ``DIFFERS``: a form whose reading differs between
CPUs or vendors is never ``exact``.  Outputs a CPU cannot see (zmm upper
halves and AVX-512 state without AVX-512, ``UNSEEN_WITHOUT_AVX512``) are no
difference.  A row with no CPU (``cpus`` empty) was not run on any: the
CPUs that met it lacked a feature it needs.  ``selftest.form_merge`` writes
these fields.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from ..concrete.cpu_identity import CpuIdentity

TABLE_NAME = "validated_forms.json"
STATUS_ORDER = ("exact", "loose", "failed")  # worse to the right
DIFFERS = "differs between CPUs"
#: The outputs (``selftest.form_validation.compare``'s categories) a CPU without AVX-512 cannot see.
UNSEEN_WITHOUT_AVX512 = frozenset({"zmm upper", "avx-512 state"})


@dataclass(frozen=True)
class Reading:
    """What one CPU's validation of a form found: a status and, unless exact, which outputs or why."""

    status: str
    loose: tuple[str, ...] = ()


@dataclass(frozen=True)
class FormRow:
    form: str
    status: str  # 'exact' | 'loose' | 'failed'
    loose: tuple[str, ...]  # for 'loose': the outputs that differed; for 'failed': why
    states: int  # states compared (by the last validation)
    instances: tuple[str, ...]  # hex of the instances run (real kernel or corpus bytes)
    cpus: tuple[int, ...] = ()  # indices into ``FormTable.cpus`` of the CPUs whose readings make the row
    readings: tuple[tuple[int, Reading], ...] = ()  # each CPU's reading, kept only when they differ

    def reading_of(self, cpu: int) -> Reading | None:
        """CPU ``cpu``'s reading of this form (None: it did not validate it)."""
        if cpu not in self.cpus:
            return None
        return dict(self.readings).get(cpu, Reading(self.status, self.loose))


@dataclass(frozen=True)
class FormTable:
    rows: dict
    cpus: tuple[CpuIdentity, ...]
    generated: str
    digest: bytes

    @property
    def cpu(self) -> str:
        """The CPUs the table was made on, in words ('none' for an empty table)."""
        return "; ".join(c.describe() for c in self.cpus) or "none"

    def row(self, form: str) -> FormRow | None:
        return self.rows.get(form)

    def status(self, form: str) -> str | None:
        row = self.rows.get(form)
        return None if row is None else row.status

    def cpus_of(self, form: str) -> tuple[CpuIdentity, ...]:
        """The CPUs that validated ``form`` (empty: none, or no row)."""
        row = self.rows.get(form)
        return () if row is None else tuple(self.cpus[i] for i in row.cpus)


def _readings(r: dict) -> tuple[tuple[int, Reading], ...]:
    return tuple((x["cpu"], Reading(x["status"], tuple(x.get("loose", ())))) for x in r.get("readings", ()))


def _parse(data: dict) -> dict[str, FormRow]:
    return {form: FormRow(form, r["status"], tuple(r.get("loose", ())), r.get("states", 0),
                          tuple(r.get("instances", ())), tuple(r.get("cpus", ())),
                          _readings(r) if "readings" in r else ()) for form, r in data.get("forms", {}).items()}


def parse_cpus(data: dict) -> tuple[CpuIdentity, ...]:
    """The table's CPUs; a table from before they were kept (one ``cpu`` string) gives none."""
    return tuple(CpuIdentity.from_json(c) for c in data.get("cpus", ()))


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
        return FormTable({}, (), "never", digest())
    return parse(text, digest())


def parse(text: str, tag: bytes | None = None) -> FormTable:
    """A table from its JSON text (``tag``: its digest, by default the hash of ``text``)."""
    data = json.loads(text)
    tag = hashlib.sha256(text.encode()).digest()[:8] if tag is None else tag
    return FormTable(_parse(data), parse_cpus(data), data.get("generated", "unknown"), tag)


@lru_cache(maxsize=1)
def digest() -> bytes:
    """8 bytes identifying the table: part of every proof-cache key.  The hash of its text, so that
    a run that only needs the cache's tag (a repeated command) does not parse the table (0.25 s)."""
    text = _text()
    return hashlib.sha256(b"" if text is None else text.encode()).digest()[:8]
