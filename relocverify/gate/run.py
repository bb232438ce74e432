"""Run the gate: samples -> every decoder's answers -> findings -> report.

``run_gate`` is pure apart from the decoders it runs (objdump or an
external command are subprocesses); reading images and corpora happens in
``samples``, writing files in the CLI.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter
from operator import itemgetter
from typing import TYPE_CHECKING
from dataclasses import dataclass, field

from ..collector import paused
from ..x86.decoders.protocol import Decoder, Facts
from . import answers as answers_mod
from .baseline import Baseline
from .compare import Finding, compare
from .samples import Unit

if TYPE_CHECKING:
    from .consequence import Consequence

_FIRST = itemgetter(0)

#: Distinct failing byte strings per class whose plan is built and checked (each is a proof).
PROVE_PER_CLASS = 3
#: Failing instructions printed per class.
SHOW_PER_CLASS = 5


@dataclass
class UnitResult:
    name: str
    instructions: int
    distinct: int
    digest: str
    digest_changed: bool = False
    path: str | None = None  # the unit's input file (``Unit.path``)


@dataclass
class GateReport:
    tested: str
    versions: dict[str, str]
    units: list[UnitResult]
    findings: list[Finding]
    new_findings: list[Finding]  # failing and not accepted by the baseline
    consequences: dict[bytes, "Consequence"] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.new_findings) or any(u.digest_changed for u in self.units)

    def class_counts(self) -> dict[str, dict[str, int]]:
        """class -> distinct byte strings and instructions (occurrences), every finding."""
        distinct, instructions = Counter(), Counter()
        for f in self.findings:
            distinct[f.klass] += 1
            instructions[f.klass] += f.count
        return {k: {"distinct": distinct[k], "instructions": instructions[k]} for k in sorted(distinct)}

    def finding_lines(self, f: Finding) -> list[str]:
        more = f" (and {f.count - 1} more occurrences)" if f.count > 1 else ""
        lines = [f"{f.address:#x} {f.raw.hex(' ')}{more} in {f.unit}"]
        for name, a in f.answers:
            d = next((d for d in f.differences if d.other == name), None)
            tag = "" if name == f.tested else (" (agrees)" if d is None else
                                               f" (differs: {d.kind}{', known bug ' + d.explained if d.explained else ''})")
            lines.append(f"{name}: {a.describe(f.address)}{tag}")
        c = self.consequences.get(f.raw)
        if c is not None:
            lines.append(c.describe())
        lines.append(f"replay: relocverify check '{f.raw.hex(' ')}' --at {f.address:#x}")
        return lines

    def as_json(self) -> dict:
        new = {id(f) for f in self.new_findings}
        return {
            "tested": self.tested, "versions": self.versions, "failed": self.failed,
            "units": [vars(u) for u in self.units],
            "counts": self.class_counts(),
            "notes": self.notes,
            "cohorts": [{"unit": f.unit, "address": hex(f.address), "bytes": f.raw.hex(" "), "count": f.count,
                         "class": f.klass, "failing": f.failing, "new": id(f) in new,
                         "answers": {n: a.as_json(f.address) for n, a in f.answers},
                         "consequence": (self.consequences[f.raw].as_json()
                                         if f.raw in self.consequences else None)}
                        for f in self.findings],
        }


def digest(samples: dict[bytes, list[int]], table: dict[bytes, Facts]) -> str:
    """A digest of the unit's distinct byte strings, in sweep order, with the tested decoder's answers.

    Each distinct answer is encoded once and the strings refer to it by
    number, so the cost is a dictionary lookup per string."""
    answers = list(map(table.__getitem__, samples))
    codes = dict.fromkeys(answers)
    for i, f in enumerate(codes):
        codes[f] = i
    sequence = array("I", map(codes.__getitem__, answers))
    h = hashlib.sha256()
    h.update(bytes(map(len, samples)))
    h.update(b"".join(samples))
    h.update(sequence.tobytes())
    # Plain tuples print in C; an ``unreported`` set is printed sorted (set order varies by process).
    h.update(repr([f[:-1] + (tuple(sorted(f.unreported)),) if f.unreported else f[:-1] for f in codes]).encode())
    return h.hexdigest()[:32]


def run_gate(tested: Decoder, others: list[Decoder], units: list[Unit], baseline: Baseline | None = None,
             prove_per_class: int = PROVE_PER_CLASS, jobs: int | None = None) -> GateReport:
    """Decode every sample with every decoder, compare, and check plans of new failures."""
    with paused():  # answers and findings for every distinct string: no reference cycles among them
        items: dict[bytes, int] = {}  # each distinct string at its first address: the first unit's wins
        for unit in reversed(units):
            items.update(zip(unit.samples, map(_FIRST, unit.samples.values())))
        adapters = [tested] + others
        table = answers_mod.answers(adapters, list(zip(items.values(), items)), jobs=jobs)
        versions = {a.name: a.version() for a in adapters}
        findings: list[Finding] = []
        results = []
        for unit in units:
            findings += compare(unit.name, unit.samples, tested, others, table)
            d = digest(unit.samples, table[tested.name])
            old = baseline.unit_digest(unit.name) if baseline else None
            results.append(UnitResult(unit.name, unit.instructions, len(unit.samples), d,
                                      digest_changed=old is not None and old != d, path=unit.path))
    accepted = baseline.accepted if baseline else frozenset()
    new = [f for f in findings if f.failing and (f.klass, f.shape) not in accepted]
    report = GateReport(tested.name, versions, results, findings, new)
    if baseline:
        known = set(baseline.doc.get("units", {}))
        report.notes += [f"{u.name}: not in the baseline" for u in results if u.name not in known]
    proved = Counter()
    if new:
        from .consequence import consequence  # z3 and the lifter: loaded only when a plan is checked
    for f in new:
        if f.raw not in report.consequences and proved[f.klass] < prove_per_class:
            proved[f.klass] += 1
            c = consequence(f.raw, f.address, f.answer(tested.name))
            if c is not None:
                report.consequences[f.raw] = c
    return report


def render(report: GateReport, baseline_written: tuple[str, int] | None = None) -> str:
    """The short grouped diff: new failures by class with examples, then the counts."""
    others = ", ".join(f"{n} {v}" for n, v in report.versions.items() if n != report.tested)
    total = sum(u.instructions for u in report.units)
    distinct = sum(u.distinct for u in report.units)
    out = [f"gate: {report.tested} {report.versions[report.tested]} against {others}: "
           f"{total:,} instructions ({distinct:,} distinct) in {len(report.units):,} units"]
    by_class: dict[str, list[Finding]] = {}
    for f in report.new_findings:
        by_class.setdefault(f.klass, []).append(f)
    for klass in sorted(by_class):
        group = by_class[klass]
        n = sum(f.count for f in group)
        out.append(f"FAIL {klass}: {len(group):,} distinct, {n:,} instructions")
        for f in group[:SHOW_PER_CLASS]:
            out += ["  " + line if i == 0 else "    " + line for i, line in enumerate(report.finding_lines(f))]
        if len(group) > SHOW_PER_CLASS:
            out.append(f"  ... {len(group) - SHOW_PER_CLASS:,} more distinct in this class (--json lists all)")
    for u in report.units:
        if u.digest_changed:
            out.append(f"FAIL {u.name}: the tested decoder's answers changed since the baseline "
                       f"(digest now {u.digest}); --update-baseline accepts them")
    out += [f"note: {n}" for n in report.notes]
    counts = report.class_counts()
    if counts:
        out.append("differences by class (distinct / instructions):")
        new_classes = {f.klass for f in report.new_findings}
        for k, c in counts.items():
            group = [f for f in report.findings if f.klass == k]
            status = ("new" if k in new_classes else "accepted" if any(f.failing for f in group)
                      else "contested" if any(f.contested for f in group) else "explained")
            out.append(f"  {k:<40} {c['distinct']:>7,} / {c['instructions']:>9,}  {status}")
    if baseline_written is not None:  # the differences are what the new baseline accepts, not a failure
        path, accepted = baseline_written
        out.append(f"baseline written: {accepted:,} accepted differences, {len(report.units):,} units ({path})")
    else:
        out.append("FAILED" if report.failed else "clean")
    return "\n".join(out) + "\n"
