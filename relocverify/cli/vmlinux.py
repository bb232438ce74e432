"""``relocverify vmlinux``: verify every instruction of a kernel image into a store."""

from __future__ import annotations

import os
from typing import TextIO

from .finish import finish
from .render import escape

DEFAULT_KERNEL = "debian-6.1-cloud"  # what ``relocverify vmlinux`` verifies when given no path


def _say(line: str) -> None:
    import sys

    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def command(args, out: TextIO) -> int:
    from ..engine.executors import default_jobs
    from ..engine.progress import Progress
    from ..engine.run import RunOptions, render_summary, run
    from ..image.loader import load_image, require_kernel
    from ..environment import default_proof_cache_dir

    path, system_map = args.path, args.system_map
    if path is None:
        from ..image.fetch import fetch

        path = str(fetch(DEFAULT_KERNEL, None, progress=None if args.no_progress else _say).vmlinux)
    image = load_image(path, system_map)
    require_kernel(image)
    db = args.db or os.path.join(os.path.dirname(os.path.abspath(path)), f"relocverify-{image.identity[:12]}.sqlite")
    if args.db is None:
        from . import arguments

        arguments.output_file(db)
    jobs = args.jobs or default_jobs()
    cache_dir = None if args.no_cache else (args.cache_dir or default_proof_cache_dir())
    options = RunOptions(args.trampoline_base, jobs, args.timeout, args.limit, True, cache_dir,
                         scheduler=args.scheduler, dask_local=args.dask_local, jump_probes=args.jump_probes)
    summary = run(image, db, options, Progress(enabled=not args.no_progress))
    out.write(render_summary(summary, escape))
    out.write(f"store: {escape(db)}\n")
    return finish(out, args, summary, summary["by_verdict"],
                  summary["totals_add_up"] and summary["run"]["status"] == "complete")
    return 0
