"""``relocverify module``: verify every instruction of kernel modules, laid out in module space
and relocated against the vmlinux's symbols (``image.module``), into one store (an
``engine.requests.ModuleRequest``, given to ``engine.verify.verify``); a line per module as it is done, then
the totals."""

from __future__ import annotations

import os
from typing import TextIO

from .arguments import add_batch_options, add_jump_probes
from .finish import finish, next_steps
from .render import escape, verdict_counts


def add_parser(sub, types) -> None:
    m = sub.add_parser("module", help="verify every instruction of kernel modules (.ko, .ko.xz, .ko.zst)")
    m.add_argument("modules", nargs="+", type=types["IN_FILE"], metavar="KO", help="the modules")
    m.add_argument("--kernel", required=True, type=types["IN_FILE"], metavar="VMLINUX",
                   help="the vmlinux the modules were built for: their undefined symbols resolve against it")
    m.add_argument("--system-map", default=None, metavar="FILE", type=types["IN_FILE"],
                   help="System.map for a stripped --kernel")
    m.add_argument("--base", type=types["TRAMP"], default=None, metavar="ADDR",
                   help="where the first module is laid out (default 0xffffffffc0100000, module space)")
    m.add_argument("--db", required=True, metavar="FILE", type=types["OUT_FILE"], help="the result store")
    m.add_argument("--trampoline-base", type=types["TRAMP"], default=0xFFFFFFFFC0001000, metavar="ADDR",
                   help="the trampoline address every plan uses (default 0xffffffffc0001000)")
    add_batch_options(m, types, "also write the per-module summaries and the totals as JSON")
    add_jump_probes(m)


def command(args, out: TextIO) -> int:
    from ..engine.requests import ModuleRequest
    from ..engine.verify import VerifiedImage, verify
    from .arguments import progress_lines, run_options

    def done(module: VerifiedImage) -> None:
        out.write(module_line(module.name, module.summary, args.jump_probes))

    request = ModuleRequest(args.modules, args.kernel, run_options(args, args.trampoline_base), args.db,
                            args.system_map, args.base)
    summary = verify(request, progress_lines(args), on_image=done)
    out.write(f"all {summary.images} modules: {summary.instructions:,} instructions; "
              f"{verdict_counts(summary.by_verdict)}; totals add up: {summary.totals_add_up}\n")
    if args.jump_probes:
        from ..engine.jumps import render_jump_totals

        out.write(render_jump_totals(summary.document["jump_probe"], escape))
    next_steps(out, summary.store)
    return finish(out, args, summary)


def module_line(path: str, summary: dict, jump_probes: bool) -> str:
    """One module's line: its instructions and functions, its verdicts, whether its totals add up."""
    return (f"{escape(os.path.basename(path))}: {summary['instructions']:,} instructions in "
            f"{summary['functions']:,} functions; {verdict_counts(summary['by_verdict'])}"
            + (f"; jump probes eligible {summary['jump_probe']['eligible']:,}" if jump_probes else "")
            + f"; totals add up: {summary['totals_add_up']}\n")
