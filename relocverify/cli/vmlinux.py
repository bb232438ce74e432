"""``relocverify vmlinux``: verify every instruction of a kernel image into a store."""

from __future__ import annotations

import json
import os
from typing import TextIO

from ..errors import InputError
from .render import escape

DEFAULT_KERNEL = "debian-6.1-cloud"  # what ``relocverify vmlinux`` verifies when given no path


def command(args, out: TextIO) -> int:
    from ..engine.executors import default_jobs
    from ..engine.progress import Progress
    from ..engine.run import RunOptions, render_summary, run
    from ..image.loader import load_image
    from ..environment import default_proof_cache_dir

    path, system_map = args.path, args.system_map
    if path is None:
        from ..image.fetch import fetch

        path = str(fetch(DEFAULT_KERNEL, None).vmlinux)
    image = load_image(path, system_map)
    db = args.db or os.path.join(os.path.dirname(os.path.abspath(path)), f"relocverify-{image.identity[:12]}.sqlite")
    jobs = args.jobs or default_jobs()
    if jobs < 1:
        raise InputError("--jobs must be at least 1")
    cache_dir = None if args.no_cache else (args.cache_dir or default_proof_cache_dir())
    options = RunOptions(args.trampoline_base, jobs, args.timeout, args.limit, True, cache_dir)
    summary = run(image, db, options, Progress(enabled=not args.no_progress))
    out.write(render_summary(summary, escape))
    out.write(f"store: {escape(db)}\n")
    if args.summary_json:
        with open(args.summary_json, "w") as fh:
            json.dump(summary, fh, indent=2)
    return 1 if summary["by_verdict"].get("refuted", 0) else 0
