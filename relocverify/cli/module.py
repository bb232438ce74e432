"""``relocverify module``: verify every instruction of kernel modules, laid out in module space
and relocated against the vmlinux's symbols (``image.module``), into one store."""

from __future__ import annotations

import os
from typing import TextIO

from ..errors import InputError
from .arguments import add_batch_options
from .finish import finish, totals_over
from .package import add_jump_probes
from .render import escape


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
    from ..engine.executors import default_jobs
    from ..engine.progress import Progress
    from ..engine.run import RunOptions, run
    from ..environment import default_proof_cache_dir
    from ..image.loader import load_image, require_kernel
    from ..image.functions import find_functions
    from ..image.module import MODULE_BASE, load_modules
    from .package import empty_summary

    kernel = load_image(args.kernel, args.system_map)
    require_kernel(kernel)
    cache_dir = None if args.no_cache else (args.cache_dir or default_proof_cache_dir())
    options = RunOptions(args.trampoline_base, args.jobs or default_jobs(), args.timeout, None, True, cache_dir,
                         jump_probes=args.jump_probes)
    base = MODULE_BASE if args.base is None else args.base
    if base & 0xFFF:
        raise InputError(f"--base {base:#x} is not page-aligned: module_alloc() gives pages; e.g. {MODULE_BASE:#x}")
    results = {}
    for path, image in load_modules(args.modules, kernel, base):
        summary = run(image, args.db, options, Progress(enabled=not args.no_progress)) if find_functions(image) \
            else empty_summary(image, args.jump_probes)
        results[path] = summary
        out.write(f"{escape(os.path.basename(path))}: {summary['instructions']:,} instructions in "
                  f"{summary['functions']:,} functions; " + ", ".join(f"{k} {v:,}" for k, v in
                                                                     summary["by_verdict"].items())
                  + (f"; jump probes eligible {summary['jump_probe']['eligible']:,}" if args.jump_probes else "")
                  + f"; totals add up: {summary['totals_add_up']}\n")
    totals, adds_up = totals_over(results.values())
    out.write(f"all {len(results)} modules: {sum(totals.values()):,} instructions; "
              + ", ".join(f"{k} {v:,}" for k, v in totals.items()) + f"; totals add up: {adds_up}\n")
    report = {"modules": results, "totals": totals, "totals_add_up": adds_up}
    if args.jump_probes:
        from ..engine.jumps import jump_totals, render_jump_totals

        report["jump_probe"] = jumps = jump_totals(s["jump_probe"] for s in results.values())
        out.write(render_jump_totals(jumps, escape))
        adds_up = adds_up and jumps["totals_add_up"]
    out.write(f"store: {escape(args.db)}\n")
    return finish(out, args, report, totals, adds_up)
