"""The gate's result as SARIF 2.1.0: one result per differing instruction.

Each result's location is the instruction's address (``physicalLocation.address``)
in its input (the image file, the corpus file, or the fuzz run); level
``error`` for a failing difference, ``note`` for one a known decoder bug
explains or the baseline accepts.  Rules are the difference classes.
"""

from __future__ import annotations

import os
from urllib.parse import quote

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def sarif(report) -> dict:
    new = {id(f) for f in report.new_findings}
    rules = sorted({f.klass for f in report.findings})
    paths = {u.name: getattr(u, "path", None) for u in report.units}
    results = []
    for f in report.findings:
        uri = artifact_uri(paths.get(f.unit), f.unit)
        results.append({
            "ruleId": f.klass,
            "ruleIndex": rules.index(f.klass),
            "level": "error" if id(f) in new else "note",
            "message": {"text": "; ".join(report.finding_lines(f))},
            "locations": [{"physicalLocation": {
                "artifactLocation": {"uri": uri},
                "address": {"absoluteAddress": f.address, "length": len(f.raw)}}}],
            "properties": {"bytes": f.raw.hex(" "), "occurrences": f.count,
                           "answers": {n: a.as_json(f.address) for n, a in f.answers}},
        })
    return {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "relocverify-gate",
                "rules": [{"id": r, "shortDescription": {"text": f"decoders differ: {r}"}} for r in rules]}},
            "properties": {"tested": report.tested, "versions": report.versions},
            "results": results,
        }],
    }


def artifact_uri(path: str | None, unit: str) -> str:
    """An input file as an RFC 3986 URI reference: relative to the working directory (where a SARIF viewer
    resolves it) when the file lies below it, else a ``file:`` URI; every character outside the unreserved
    set and ``/`` percent-encoded, so ``:`` (read as a scheme), ``#``, ``?``, ``%`` and spaces keep the name
    whole.  A unit with no file (a fuzz run) is named by its label, encoded alike."""
    if path is None:
        return quote(unit, safe="")
    full = os.path.abspath(os.fsdecode(path))
    relative = os.path.relpath(full)
    if not relative.startswith(os.pardir + os.sep) and relative != os.pardir:
        return quote(relative.replace(os.sep, "/"), safe="/", errors="surrogateescape")
    return "file://" + quote(full.replace(os.sep, "/"), safe="/", errors="surrogateescape")
