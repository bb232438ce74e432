"""The end every batch command shares: the summary JSON, ``--fail-on``, and the exit code for an incomplete run."""

from __future__ import annotations

import json


def finish(out, args, document: dict, by_verdict: dict[str, int], complete: bool) -> int:
    """Write ``document`` to ``--summary-json`` if asked; exit 1 on a ``--fail-on`` verdict, 3 if incomplete, else 0."""
    if args.summary_json:
        from ..outputs import write_atomic

        write_atomic(args.summary_json, json.dumps(document, indent=2))
    failing = {v: n for v, n in by_verdict.items() if v in args.fail_on and n}
    if failing:
        out.write("fails on: " + ", ".join(f"{n:,} {v}" for v, n in failing.items()) + "\n")
        return 1
    if not complete:
        out.write("incomplete: the totals do not add up\n")
        return 3
    return 0


def totals_over(summaries) -> tuple[dict[str, int], bool]:
    """Verdict counts summed over several images' summaries, and whether each one's totals add up."""
    summaries = list(summaries)
    totals: dict[str, int] = {}
    for s in summaries:
        for verdict, n in s["by_verdict"].items():
            totals[verdict] = totals.get(verdict, 0) + n
    return totals, all(s["totals_add_up"] for s in summaries)
