"""``relocverify package``: a whole kernel in one command: its vmlinux and every module, into one
store, with a summary per image and totals that add up per image and overall.

The kernel is a named one (``image.fetch.KERNELS``), a Debian kernel image ``.deb`` (with its
``-dbg`` package for symbols: ``--dbg``), or a directory (``/lib/modules/<release>``, an unpacked
package tree, a build tree); ``image.debian`` finds its parts and says in one line which."""

from __future__ import annotations

import os
from typing import TextIO

from ..errors import InputError
from .arguments import add_batch_options, add_dask
from .finish import finish, totals_over
from .render import escape


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


def add_jump_probes(parser) -> None:
    """--jump-probes, as ``relocverify vmlinux`` has it, for the other batch commands."""
    parser.add_argument("--jump-probes", action="store_true",
                        help="also answer, per instruction, whether a jump-optimized probe can sit there (a range "
                             "safe to overwrite, a block plan, a block proof) and why not")


def empty_summary(image, jump_probes: bool = False) -> dict:
    """The summary of an image with no function to verify: zero instructions, totals that add up."""
    from ..proof.verdict import Verdict

    summary = {"image": {"path": image.path, "identity": image.identity}, "instructions": 0,
               "instructions_expected": 0, "functions": 0, "by_verdict": {v.value: 0 for v in Verdict},
               "totals_add_up": True}
    if jump_probes:
        from ..engine.jumps import empty_jump_section

        summary["jump_probe"] = empty_jump_section()
    return summary


def kernel_parts(source: str, dbg: str | None, progress):
    """The vmlinux and modules ``source`` names (``image.debian.KernelParts``)."""
    from ..image.debian import from_debs, from_directory
    from ..image.fetch import KERNELS, named_parts

    if dbg is not None and (source in KERNELS or os.path.isdir(source)):
        raise InputError(f"--dbg goes with a linux-image .deb; {source} is a "
                         f"{'named kernel' if source in KERNELS else 'directory'}")
    if source in KERNELS:
        return named_parts(source, progress=progress)
    if os.path.isdir(source):
        return from_directory(source)
    if os.path.isfile(source):
        with open(source, "rb") as handle:
            if handle.read(8) == b"!<arch>\n":
                return from_debs(source, dbg, progress=progress)
    raise InputError(f"{source}: not a named kernel ({', '.join(sorted(KERNELS))}), a Debian package (.deb) "
                     f"or a directory")


def command(args, out: TextIO) -> int:
    import contextlib
    import sys
    import time

    from ..engine.executors import default_jobs
    from ..engine.progress import Progress
    from ..engine.run import RunOptions, Session, run
    from ..environment import default_proof_cache_dir
    from ..image.functions import find_functions
    from ..image.loader import load_image, require_kernel
    from ..image.module import load_modules
    from ..store.store import Store

    say = (lambda line: None) if args.no_progress else (lambda line: print(line, file=sys.stderr, flush=True))
    parts = kernel_parts(args.name, args.dbg, say)
    out.write(f"using {escape(parts.used)}\n")
    modules = parts.modules[:args.limit_modules]
    cache_dir = None if args.no_cache else (args.cache_dir or default_proof_cache_dir())
    options = RunOptions(0xFFFFFFFFC0001000, args.jobs or default_jobs(), args.timeout, args.limit, True, cache_dir,
                         scheduler=args.scheduler, dask_local=args.dask_local, jump_probes=args.jump_probes)
    quiet = Progress(enabled=False)
    t0 = time.monotonic()
    vmlinux = load_image(parts.vmlinux, parts.system_map)
    require_kernel(vmlinux)
    timing: dict[str, float] = {}
    # The store stays open from the first image to the last: one writer for the whole command, which the
    # session's workers (forked during the first image's run) belong to.
    with contextlib.closing(Store(args.db)), Session(options) as session:  # one pool: workers keep what they learn
        images = {"vmlinux": run(vmlinux, args.db, options, Progress(enabled=not args.no_progress), session)}
        timing["vmlinux_s"] = time.monotonic() - t0
        for k, ((name, path), (_, image)) in enumerate(zip(modules, load_modules([p for _, p in modules], vmlinux))):
            if not find_functions(image):  # a module of data alone (tables, firmware glue): nothing to verify
                images[name] = summary = empty_summary(image, args.jump_probes)
                continue
            images[name] = summary = run(image, args.db, options, quiet, session)
            if (k + 1) % 50 == 0:
                say(f"modules: {k + 1:,}/{len(modules):,}, {time.monotonic() - t0:.0f} s")
            if not summary["totals_add_up"]:
                say(f"{path}: totals do not add up")
    timing["modules_s"] = time.monotonic() - t0 - timing["vmlinux_s"]
    totals, adds_up = totals_over(images.values())
    label = args.name if parts.used.startswith(args.name + ":") else os.path.basename(os.path.normpath(args.name))
    out.write(f"{escape(label)}: vmlinux and {len(modules):,} modules, {sum(totals.values()):,} instructions in "
              f"{time.monotonic() - t0:.0f} s; " + ", ".join(f"{k} {v:,}" for k, v in totals.items())
              + f"; totals add up: {adds_up}\n")
    mods = [s for name, s in images.items() if name != "vmlinux"]
    if mods:
        out.write(f"modules: {sum(s['instructions'] for s in mods):,} instructions; "
                  + ", ".join(f"{v} {sum(s['by_verdict'][v] for s in mods):,}" for v in totals) + "\n")
    report = {"source": {"argument": args.name, "dbg": args.dbg, "release": parts.release, "vmlinux": parts.vmlinux,
                         "system_map": parts.system_map, "used": parts.used},
              "images": images, "totals": totals, "totals_add_up": adds_up}
    if args.jump_probes:
        from ..engine.jumps import jump_totals, render_jump_totals

        report["jump_probe"] = jumps = jump_totals(s["jump_probe"] for s in images.values())
        out.write(render_jump_totals(jumps, escape))
        adds_up = adds_up and jumps["totals_add_up"]
    out.write(f"store: {escape(args.db)}\n")
    report["wall_s"] = {k: round(v, 1) for k, v in timing.items()}
    return finish(out, args, report, totals, adds_up)
