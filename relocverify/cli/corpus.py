"""``relocverify corpus run|fetch``: the bundled corpora, and named real kernels."""

from __future__ import annotations

import json
import sys
from typing import TextIO

from ..corpus.runner import DEFAULT_TIMEOUT_S, load, render_result, run_entry, summarize
from ..image import fetch as fetch_module


def command(args, out: TextIO) -> int:
    """``relocverify corpus run [PATHS] [--json]`` and ``relocverify corpus fetch NAME [--cache DIR]``."""
    if args.corpus_command == "fetch":
        return _fetch(args, out)
    entries = load(args.paths)
    timeout_ms = int((getattr(args, "timeout", None) or DEFAULT_TIMEOUT_S) * 1000)
    results = []
    for entry in entries:
        r = run_entry(entry, timeout_ms)
        results.append(r)
        if not args.json:
            out.write(render_result(r))
            out.flush()
    summary = summarize(results)
    if args.json:
        json.dump({"entries": [r.as_json() for r in results], "summary": summary.as_json()}, out, indent=2)
        out.write("\n")
    else:
        out.write(summary.render())
    return 0 if summary.missed == 0 else 1


FETCHED_PATHS = ("vmlinux", "vmlinuz", "system_map", "config")


def _fetch(args, out: TextIO) -> int:
    """Delegate to ``fetch.fetch`` and print where the kernel's files are."""
    kernel = fetch_module.fetch(args.name, args.cache, progress=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        json.dump({"name": kernel.name, "release": kernel.release,
                   **{what: getattr(kernel, what) for what in FETCHED_PATHS}, "sha256": kernel.sha256s}, out, indent=2)
        out.write("\n")
        return 0
    out.write(f"{kernel.name} ({kernel.release})\n")
    for what in FETCHED_PATHS:
        path = getattr(kernel, what)
        if path:
            out.write(f"{what}: {path}\n")
    return 0
