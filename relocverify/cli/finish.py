"""The end every batch command shares: the summary JSON, ``--fail-on``, and the exit code for an incomplete run."""

from __future__ import annotations

import json
import re
import shlex


def next_steps(out, store: str) -> None:
    """The store's path, then three commands to paste: one function annotated (``vfs_read`` where the store
    has it, else the first of its functions whose name is plain), the HTML report, the proved probe points
    exported (the path shell-quoted)."""
    from .render import escape

    path = shlex.quote(store) if store.isprintable() else escape(store)  # control characters never reach a terminal
    out.write(f"store: {escape(store)}\n"
              f"next:\n"
              f"  relocverify show {path} {_example_function(store)}\n"
              f"  relocverify report {path} -o reports/html\n"
              f"  relocverify export {path} --format bpftrace -o probes.bt\n")


def _example_function(store: str) -> str:
    from ..errors import RelocverifyError
    from ..store.store import Results

    try:
        s = Results(store)
    except RelocverifyError:
        return "FUNCTION"
    try:
        image = s.find_image()
        names = [] if image is None else list(s.function_names(image).values())  # the names alone: no records
    finally:
        s.close()
    if "vfs_read" in names:
        return "vfs_read"
    plain = sorted(n for n in names if _PLAIN.fullmatch(n))  # a name pasted as it is: no quoting, no escapes
    return plain[0] if plain else "FUNCTION"


_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


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
