"""The gate's baseline: small and diff-friendly.

A JSON file with, per unit (image section, corpus file, fuzz run), its
instruction count and a digest of the tested decoder's answers; the
per-class counts of differences; and the accepted disagreements, one row
per (class, shape), where a shape is the bytes with displacement and
immediate bytes written ``..`` (so one row covers every displacement value).
Not the answers themselves: a kernel has millions.  Keys are sorted and
rows ordered, so a change reads as a small diff.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..errors import InputError
from ..inputs import read_input
from ..outputs import write_atomic
from ..text import one_line

FORMAT = "relocverify-gate-baseline/1"


@dataclass(frozen=True)
class Baseline:
    doc: dict

    @property
    def accepted(self) -> frozenset[tuple[str, str]]:
        return frozenset((r["class"], r["shape"]) for r in self.doc.get("accepted", ()))

    def unit_digest(self, unit: str) -> str | None:
        return self.doc.get("units", {}).get(unit, {}).get("digest")


def load(path: str) -> Baseline:
    if not os.path.exists(path):
        raise InputError(f"--baseline {path}: no such file; run once with --update-baseline to create it")
    try:
        doc = json.loads(read_input(path, "baseline"))
    except (ValueError, RecursionError) as e:
        raise InputError(f"--baseline {path}: unreadable: {one_line(e)}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f"--baseline {path}: not a {FORMAT} file")
    return Baseline(doc)


def build(report) -> dict:
    """The baseline document that accepts ``report`` (a ``run.GateReport``) as it is."""
    accepted = {}
    for f in report.findings:
        if f.failing:
            row = accepted.setdefault((f.klass, f.shape), {
                "class": f.klass, "shape": f.shape, "example": f"{f.address:#x} {f.raw.hex(' ')}",
                "answers": {name: a.describe(f.address) for name, a in f.answers}})
            c = report.consequences.get(f.raw)
            if c is not None:
                row["verdict"] = c.verdict.value
    return {
        "format": FORMAT,
        "decoder": {"name": report.tested, "version": report.versions[report.tested]},
        "consensus": {n: v for n, v in report.versions.items() if n != report.tested},
        "units": {u.name: {"instructions": u.instructions, "distinct": u.distinct, "digest": u.digest}
                  for u in report.units},
        "counts": report.class_counts(),
        "accepted": [accepted[k] for k in sorted(accepted)],
    }


def save(path: str, doc: dict) -> None:
    """Write the baseline atomically (a temporary file renamed over it)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
