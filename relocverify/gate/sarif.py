"""The gate's result as SARIF 2.1.0: one result per differing instruction.

Each result's location is the instruction's address (``physicalLocation.address``)
in its input (the image file, the corpus file, or the fuzz run); level
``error`` for a failing difference, ``note`` for one a known decoder bug
explains or the baseline accepts.  Rules are the difference classes.
"""

from __future__ import annotations

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def sarif(report) -> dict:
    new = {id(f) for f in report.new_findings}
    rules = sorted({f.klass for f in report.findings})
    results = []
    for f in report.findings:
        uri = f.unit.split(":", 1)[0] if not f.unit.startswith(("corpus:", "fuzz(")) else f.unit
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
