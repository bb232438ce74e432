"""``relocverify package``: a whole kernel in one command: its vmlinux and every module, into one
store, with a summary per image and totals that add up per image and overall (an
``engine.requests.PackageRequest``, given to ``engine.verify.verify``).

The kernel is a named one (``image.fetch.KERNELS``), a Debian kernel image ``.deb`` (with its
``-dbg`` package for symbols: ``--dbg``), or a directory (``/lib/modules/<release>``, an unpacked
package tree, a build tree); ``image.debian`` finds its parts and says in one line which."""

from __future__ import annotations

from typing import TextIO

from .arguments import add_batch_options, add_dask, add_jump_probes
from .finish import finish, next_steps
from .render import escape, verdict_counts


def add_parser(sub, types) -> None:
    p = sub.add_parser("package", help="verify a kernel's vmlinux and all its modules: a named kernel, a .deb "
                                       "or a directory")
    p.add_argument("name", metavar="NAME|DEB|DIR",
                   help="a named kernel (debian-6.1-cloud, debian-6.1-amd64, debian-6.12-cloud), a Debian kernel "
                        "image package (linux-image-*.deb), or a directory: /lib/modules/<release>, an unpacked "
                        "package tree (boot/, lib/modules/<release>/, usr/lib/debug/boot/), a kernel build tree")
    p.add_argument("--dbg", default=None, metavar="FILE.deb", type=types["IN_FILE"],
                   help="with a .deb: its -dbg package, for the unstripped vmlinux (the image package's "
                        "System.map is a placeholder, so without it there are no symbols)")
    p.add_argument("--db", required=True, metavar="FILE", type=types["OUT_FILE"], help="the result store")
    p.add_argument("--limit-modules", type=types["COUNT"], default=None, metavar="N",
                   help="verify only the first N modules (by path below kernel/)")
    p.add_argument("--limit", type=types["COUNT"], default=None, metavar="N",
                   help="verify only the first N functions of each image (the vmlinux and every module)")
    add_batch_options(p, types, "also write every image's summary and the totals as JSON")
    add_jump_probes(p)
    add_dask(p, types)


def command(args, out: TextIO) -> int:
    from ..engine.requests import PackageRequest
    from ..engine.verify import verify
    from ..plan.plan import DEFAULT_TRAMP
    from .arguments import progress_lines, run_options

    request = PackageRequest(args.name, run_options(args, DEFAULT_TRAMP, args.limit), args.db, args.dbg,
                             args.limit_modules, on_parts=lambda used: out.write(f"using {escape(used)}\n"))
    summary = verify(request, progress_lines(args))
    out.write(f"{escape(summary.label)}: vmlinux and {summary.modules:,} modules, {summary.instructions:,} "
              f"instructions in {summary.wall_s:.0f} s; {verdict_counts(summary.by_verdict)}; "
              f"totals add up: {summary.totals_add_up}\n")
    if summary.module_by_verdict is not None:
        out.write(f"modules: {summary.module_instructions:,} instructions; "
                  f"{verdict_counts(summary.module_by_verdict)}\n")
    if args.jump_probes:
        from ..engine.jumps import render_jump_totals

        out.write(render_jump_totals(summary.document["jump_probe"], escape))
    next_steps(out, summary.store)
    return finish(out, args, summary)
