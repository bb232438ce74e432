"""``relocverify elf``: verify every instruction of a user-space executable or shared library,
by the user-space policy table (``plan.policy.USER_RULES``: fasttrap and uprobes)."""

from __future__ import annotations

import os
from typing import TextIO

from .finish import finish
from .render import escape
from .vmlinux import KERNEL_HALF

#: Where a user-space tracer's trampolines live relative to the code: a page 1 MiB past the
#: image's end, as uprobes maps its execute-out-of-line page into the process.
TRAMPOLINE_GAP = 1 << 20


def add_parser(sub, types) -> None:
    e = sub.add_parser("elf", help="verify every instruction of a user-space executable or shared library")
    e.add_argument("path", type=types["IN_FILE"], help="an x86-64 ELF executable or shared library")
    e.add_argument("--db", default=None, metavar="FILE", type=types["OUT_FILE"],
                   help="the result store (default: relocverify-<sha>.sqlite in the current directory)")
    e.add_argument("--jobs", type=types["COUNT"], default=None, metavar="N",
                   help="worker processes (default: one per CPU)")
    e.add_argument("--trampoline-base", type=types["TRAMP"], default=None, metavar="ADDR",
                   help="the trampoline address (default: a page 1 MiB past the image's end, as the link "
                        "addresses lay it out)")
    e.add_argument("--summary-json", default=None, metavar="FILE", type=types["OUT_FILE"],
                   help="also write the summary as JSON to FILE")
    e.add_argument("--timeout", type=types["SECONDS"], default=10.0, metavar="S",
                   help="solver timeout per proof (default 10)")
    e.add_argument("--fail-on", type=types["VERDICTS"], default=frozenset({"refuted"}), metavar="VERDICT[,...]",
                   help="exit 1 when any instruction has one of these verdicts (default: refuted)")
    e.add_argument("--no-progress", action="store_true", help="print no progress on stderr")
    e.add_argument("--cache-dir", default=None, metavar="DIR", help="the persistent proof cache's directory")
    e.add_argument("--no-cache", action="store_true", help="neither read nor write the persistent proof cache")


def command(args, out: TextIO) -> int:
    from ..engine.executors import default_jobs
    from ..engine.progress import Progress
    from ..engine.run import RunOptions, render_summary, run
    from ..environment import default_proof_cache_dir
    from ..errors import InputError
    from ..image.loader import load_image

    image = load_image(args.path)
    code = list(image.iter_executable_sections())
    if not code:
        raise InputError(f"{args.path}: no executable section")
    if any(s.address >= KERNEL_HALF for s in code):
        raise InputError(f"{args.path}: a kernel image (code in the kernel half): use relocverify vmlinux")
    end = max(s.end for s in image.sections if s.alloc) if any(s.alloc for s in image.sections) else 0
    tramp = args.trampoline_base if args.trampoline_base is not None else (end + TRAMPOLINE_GAP) & ~0xFFF
    db = args.db or os.path.abspath(f"relocverify-{image.identity[:12]}.sqlite")
    cache_dir = None if args.no_cache else (args.cache_dir or default_proof_cache_dir())
    options = RunOptions(tramp, args.jobs or default_jobs(), args.timeout, None, False, cache_dir, "user")
    summary = run(image, db, options, Progress(enabled=not args.no_progress))
    out.write(render_summary(summary, escape))
    out.write(f"trampoline: {tramp:#x}; policy: user space\nstore: {escape(db)}\n")
    return finish(out, args, summary, summary["by_verdict"],
                  summary["totals_add_up"] and summary["run"]["status"] == "complete")
