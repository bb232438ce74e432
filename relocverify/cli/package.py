"""``relocverify package``: a whole Debian kernel package in one command: its vmlinux and every
module, into one store, with a summary per image and totals that add up per image and overall."""

from __future__ import annotations

from typing import TextIO

from ..errors import InputError
from .arguments import add_batch_options, add_dask
from .finish import finish, totals_over
from .render import escape


def add_parser(sub, types) -> None:
    p = sub.add_parser("package", help="verify a kernel package's vmlinux and all its modules")
    p.add_argument("name", help="a named kernel (debian-6.1-cloud, debian-6.1-amd64, debian-6.12-cloud)")
    p.add_argument("--db", required=True, metavar="FILE", type=types["OUT_FILE"], help="the result store")
    p.add_argument("--limit-modules", type=types["COUNT"], default=None, metavar="N",
                   help="verify only the first N modules (by path)")
    add_batch_options(p, types, "also write every image's summary and the totals as JSON")
    add_dask(p, types)


def empty_summary(image) -> dict:
    """The summary of an image with no function to verify: zero instructions, totals that add up."""
    from ..proof.verdict import Verdict

    return {"image": {"path": image.path, "identity": image.identity}, "instructions": 0,
            "instructions_expected": 0, "functions": 0, "by_verdict": {v.value: 0 for v in Verdict},
            "totals_add_up": True}


def command(args, out: TextIO) -> int:
    import sys
    import time

    from ..engine.executors import default_jobs
    from ..engine.progress import Progress
    from ..engine.run import RunOptions, Session, run
    from ..environment import default_proof_cache_dir
    from ..image.fetch import KERNELS, extract_modules, fetch
    from ..image.loader import load_image
    from ..image.functions import find_functions
    from ..image.module import load_modules

    if args.name not in KERNELS:
        raise InputError(f"unknown kernel {args.name!r}: choose one of {', '.join(sorted(KERNELS))}")
    say = (lambda line: None) if args.no_progress else (lambda line: print(line, file=sys.stderr, flush=True))
    kernel = fetch(args.name, progress=say)
    modules = extract_modules(args.name, progress=say)[:args.limit_modules]
    cache_dir = None if args.no_cache else (args.cache_dir or default_proof_cache_dir())
    options = RunOptions(0xFFFFFFFFC0001000, args.jobs or default_jobs(), args.timeout, None, True, cache_dir,
                         scheduler=args.scheduler, dask_local=args.dask_local)
    quiet = Progress(enabled=False)
    t0 = time.monotonic()
    vmlinux = load_image(kernel.vmlinux)
    timing: dict[str, float] = {}
    with Session(options) as session:  # one pool for every image: workers keep what they learn
        images = {"vmlinux": run(vmlinux, args.db, options, Progress(enabled=not args.no_progress), session)}
        timing["vmlinux_s"] = time.monotonic() - t0
        for k, (path, image) in enumerate(load_modules(modules, vmlinux)):
            name = str(path).split("/modules/", 1)[-1]
            if not find_functions(image):  # a module of data alone (tables, firmware glue): nothing to verify
                images[name] = summary = empty_summary(image)
                continue
            images[name] = summary = run(image, args.db, options, quiet, session)
            if (k + 1) % 50 == 0:
                say(f"modules: {k + 1:,}/{len(modules):,}, {time.monotonic() - t0:.0f} s")
            if not summary["totals_add_up"]:
                say(f"{path}: totals do not add up")
    timing["modules_s"] = time.monotonic() - t0 - timing["vmlinux_s"]
    totals, adds_up = totals_over(images.values())
    out.write(f"{args.name}: vmlinux and {len(modules):,} modules, {sum(totals.values()):,} instructions in "
              f"{time.monotonic() - t0:.0f} s; " + ", ".join(f"{k} {v:,}" for k, v in totals.items())
              + f"; totals add up: {adds_up}\n")
    mods = [s for name, s in images.items() if name != "vmlinux"]
    if mods:
        out.write(f"modules: {sum(s['instructions'] for s in mods):,} instructions; "
                  + ", ".join(f"{v} {sum(s['by_verdict'][v] for s in mods):,}" for v in totals) + "\n")
    out.write(f"store: {escape(args.db)}\n")
    report = {"images": images, "totals": totals, "totals_add_up": adds_up,
              "wall_s": {k: round(v, 1) for k, v in timing.items()}}
    return finish(out, args, report, totals, adds_up)
