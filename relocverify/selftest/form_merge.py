"""Merge one CPU's form validation into the form table: the JSON ``proof.form_table`` reads.

``merge_table(previous, results, here)`` returns the table ``previous`` (a
parsed ``validated_forms.json``, or ``{}``) with this CPU's readings
(``selftest.form_validation.FormResult``) merged in:

* ``here`` (``concrete.cpu.identity()``) joins the top-level ``cpus`` list
  unless a record equal to it is there;
* each form validated here gets this CPU's reading, in place of the one it
  had from this CPU (and from records that may be this CPU: fields not
  recorded, ``CpuIdentity.covers``); the other CPUs' readings stay;
* the row is then the readings combined (``combine``): one reading if they
  agree, else the worst status, the outputs that differed, and
  ``form_table.DIFFERS`` if they differ on an output both CPUs can see;
* a result that is no reading (the form needs a feature this CPU lacks,
  ``FormResult.lacks``) leaves the row as it was, or makes a ``failed`` row
  with no CPU when there was none;
* rows of forms not validated here stay as they are.

The readings of two CPUs are compared as they are: after a change to the
validation itself (new states), a reading made before it is not one of the
same test; ``replace_others=True`` then drops the other CPUs' readings of the
rows validated now (they are validated again on those CPUs, or not claimed).
"""

from __future__ import annotations

import datetime

from ..concrete.cpu_identity import CpuIdentity
from ..proof.form_table import DIFFERS, STATUS_ORDER, UNSEEN_WITHOUT_AVX512, Reading, parse_cpus
from .form_validation import FormResult

ABOUT = "CPU-validated instruction forms: see relocverify/proof/form_table.py"


def row_readings(row: dict) -> dict[int, Reading]:
    """Each CPU's reading of a table row (a JSON object)."""
    if "readings" in row:
        return {x["cpu"]: Reading(x["status"], tuple(x.get("loose", ()))) for x in row["readings"]}
    return {i: Reading(row["status"], tuple(row.get("loose", ()))) for i in row.get("cpus", ())}


def _unseen(cpu: CpuIdentity) -> frozenset[str]:
    return frozenset() if cpu.avx512 else UNSEEN_WITHOUT_AVX512


def _visible(r: Reading, unseen: frozenset[str]) -> tuple[str, frozenset[str]]:
    """A reading as a CPU that cannot see ``unseen`` would have read it."""
    if r.status == "failed":
        return r.status, frozenset(r.loose)
    seen = frozenset(r.loose) - unseen
    return ("loose" if seen else "exact"), seen


def differ(readings: dict[int, Reading], cpus: list[CpuIdentity]) -> bool:
    """Two CPUs read the form differently in an output both can see."""
    items = sorted(readings.items())
    for k, (i, a) in enumerate(items):
        for j, b in items[k + 1:]:
            unseen = _unseen(cpus[i]) | _unseen(cpus[j])
            if _visible(a, unseen) != _visible(b, unseen):
                return True
    return False


def combine(readings: dict[int, Reading], cpus: list[CpuIdentity]) -> Reading:
    """The row the readings make (see the module doc)."""
    distinct = set(readings.values())
    if len(distinct) == 1:
        return next(iter(distinct))
    worst = max((r.status for r in distinct), key=STATUS_ORDER.index)
    loose = set().union(*(r.loose for r in distinct if r.status == worst))
    if differ(readings, cpus):
        return Reading(max(worst, "loose", key=STATUS_ORDER.index), tuple(sorted(loose | {DIFFERS})))
    return Reading(worst, tuple(sorted(loose)))


def merge_row(old: dict | None, k: int, result: FormResult, cpus: list[CpuIdentity],
              drop: frozenset[int] = frozenset()) -> dict:
    """The row ``old`` with CPU ``k``'s ``result`` merged in (``drop``: CPUs whose readings it replaces)."""
    fields = {"states": result.states, "instances": list(result.instances)}
    if result.lacks:  # not run here: no reading
        if old is not None:
            return old
        return {**fields, "status": "failed", "loose": list(result.loose), "cpus": []}
    readings = {i: r for i, r in row_readings(old or {}).items() if i != k and i not in drop}
    readings[k] = Reading(result.status, tuple(result.loose))
    merged = combine(readings, cpus)
    row = {key: v for key, v in (old or {}).items() if key not in ("loose", "readings", "example")}
    row.update(fields, status=merged.status, cpus=sorted(readings))
    if merged.loose:
        row["loose"] = list(merged.loose)
    example = result.example or (old or {}).get("example", "")
    if example and merged.status != "exact":
        row["example"] = example
    if len(set(readings.values())) > 1:
        row["readings"] = [dict(cpu=i, status=r.status, **({"loose": list(r.loose)} if r.loose else {}))
                           for i, r in sorted(readings.items())]
    return row


_VENDORS = {"AMD": "AuthenticAMD", "Intel": "GenuineIntel"}


def legacy_cpu(text: str) -> CpuIdentity:
    """The identity a table's old ``cpu`` string ("AMD (xcr0 0xe7)") records: its vendor and XCR0 alone."""
    vendor = _VENDORS.get(text.split()[0], text.split()[0]) if text.split() else "unknown"
    xcr0 = text.rsplit("xcr0", 1)[1].strip(" )") if "xcr0" in text else "0x0"
    return CpuIdentity(vendor, None, None, None, None, int(xcr0, 16),
                       note=f"recorded as {text!r}, before the table kept CPU identities")


def with_cpu_list(previous: dict, legacy: CpuIdentity | None = None) -> dict:
    """A table from before CPUs were kept per row (one ``cpu`` string): ``legacy`` (default: what the string
    says, ``legacy_cpu``) as its one CPU, every row validated by it."""
    if "cpus" in previous or not previous.get("forms"):
        return previous
    legacy = legacy or legacy_cpu(previous.get("cpu", "unknown"))
    forms = {form: {**row, "cpus": [0]} for form, row in previous["forms"].items()}
    doc = {key: v for key, v in previous.items() if key != "cpu"}
    return {**doc, "cpus": [legacy.as_json()], "forms": forms}


def merge_table(previous: dict, results: dict[str, FormResult], here: CpuIdentity, sources: dict | None = None,
                replace_others: bool = False) -> dict:
    """``previous`` with ``results``, validated on ``here``, merged in; see the module doc."""
    previous = with_cpu_list(previous)
    cpus = list(parse_cpus(previous))
    k = cpus.index(here) if here in cpus else len(cpus)
    if k == len(cpus):
        cpus.append(here)
    drop = frozenset(range(len(cpus))) - {k} if replace_others else \
        frozenset(i for i, c in enumerate(cpus) if i != k and c.covers(here))
    forms = dict(previous.get("forms", {}))
    for form in sorted(results):
        forms[form] = merge_row(forms.get(form), k, results[form], cpus, drop)
    counts: dict[str, int] = {}
    for row in forms.values():
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    doc = {key: v for key, v in previous.items() if key != "cpu"}
    doc.update(about=doc.get("about", ABOUT), cpus=[c.as_json() for c in cpus], counts=counts,
               generated=datetime.date.today().isoformat(), forms=dict(sorted(forms.items())))
    if sources is not None:
        doc["sources"] = sources
    return doc
