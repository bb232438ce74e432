"""The end every batch command shares: the summary JSON, ``--fail-on``, and the exit code for an incomplete run."""

from __future__ import annotations

import json


def finish(out, args, summary) -> int:
    """Write the ``RunSummary``'s document to ``--summary-json`` if asked; exit 1 on a ``--fail-on`` verdict,
    3 if incomplete, else 0."""
    if args.summary_json:
        from ..outputs import write_atomic

        write_atomic(args.summary_json, json.dumps(summary.document, indent=2))
    failing = {v: n for v, n in summary.by_verdict.items() if v in args.fail_on and n}
    if failing:
        out.write("fails on: " + ", ".join(f"{n:,} {v}" for v, n in failing.items()) + "\n")
        return 1
    if not summary.complete:
        out.write("incomplete: the totals do not add up\n")
        return 3
    return 0
