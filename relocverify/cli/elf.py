"""``relocverify elf``: verify every instruction of a user-space executable or shared library,
by the user-space policy table (``plan.policy.USER_RULES``: fasttrap and uprobes)."""

from __future__ import annotations

import os
from typing import TextIO

from .arguments import add_batch_options
from .finish import finish, totals_over
from .package import add_jump_probes
from .render import escape
from ..x86.registers import KERNEL_HALF

#: Where a user-space tracer's trampolines live relative to the code: a page 1 MiB past the
#: image's end, as uprobes maps its execute-out-of-line page into the process.
TRAMPOLINE_GAP = 1 << 20


def add_parser(sub, types) -> None:
    e = sub.add_parser("elf", help="verify every instruction of a user-space executable or shared library")
    e.add_argument("paths", nargs="+", metavar="PATH", type=types["IN_PATH"],
                   help="x86-64 ELF executables or shared libraries, or directories of them (e.g. /usr/bin): "
                        "every ELF file directly inside is verified, other files are counted as skipped")
    e.add_argument("--db", default=None, metavar="FILE", type=types["OUT_FILE"],
                   help="the result store (default: relocverify-<sha>.sqlite for one file, relocverify-user.sqlite "
                        "for several, in the current directory)")
    e.add_argument("--trampoline-base", type=types["TRAMP"], default=None, metavar="ADDR",
                   help="the trampoline address (default: a page 1 MiB past the image's end, as the link "
                        "addresses lay it out)")
    add_batch_options(e, types, "also write the summary (several files: each file's and the totals) as JSON")
    add_jump_probes(e)


def expand(paths: list[str]) -> tuple[list[str], dict[str, str]]:
    """The ELF files the arguments name (a directory: the regular files directly inside, sorted,
    each real file once), and the files skipped with why."""
    files: list[str] = []
    skipped: dict[str, str] = {}
    seen: set[str] = set()
    for p in paths:
        names = [os.path.join(p, n) for n in sorted(os.listdir(p))] if os.path.isdir(p) else [p]
        for name in names:
            real = os.path.realpath(name)
            if real in seen:
                continue
            seen.add(real)
            if not os.path.isfile(real):
                if not os.path.isdir(p):
                    skipped[name] = "not a regular file"
                continue
            try:
                with open(real, "rb") as fh:
                    head = fh.read(20)
            except OSError as exc:
                skipped[name] = f"cannot read: {exc.strerror}"
                continue
            if head[:4] != b"\x7fELF":
                skipped[name] = "not an ELF file (a script or data)"
            elif head[18:20] != b"\x3e\x00":
                skipped[name] = "not x86-64"
            else:
                files.append(name)
    return files, skipped


def _tramp_for(image, args) -> int:
    from ..errors import InputError

    code = list(image.iter_executable_sections())
    if not code:
        raise InputError(f"{image.path}: no executable section")
    if any(s.address >= KERNEL_HALF for s in code):
        raise InputError(f"{image.path}: a kernel image (code in the kernel half): use relocverify vmlinux")
    return user_trampoline(image, args.trampoline_base)


def user_trampoline(image, base: int | None = None) -> int:
    """A user-space image's slot: ``base`` if given, else the page ``TRAMPOLINE_GAP`` past the image's
    end (where uprobes maps its execute-out-of-line page, near enough for rel32)."""
    if base is not None:
        return base
    end = max((s.end for s in image.sections if s.alloc), default=0)
    return (end + TRAMPOLINE_GAP) & ~0xFFF


def command(args, out: TextIO) -> int:
    if len(args.paths) == 1 and not os.path.isdir(args.paths[0]):
        args.path = args.paths[0]
        return _one(args, out)
    return _many(args, out)


def _many(args, out: TextIO) -> int:
    """Every ELF file the arguments name, into one store, on one session's workers."""
    import sys
    import time
    from dataclasses import replace

    from ..engine.executors import default_jobs
    from ..engine.progress import Progress
    from ..engine.run import RunOptions, Session, run
    from ..environment import default_proof_cache_dir
    from ..errors import InputError, RelocverifyError
    from ..image.functions import find_functions
    from ..image.loader import load_image
    from .package import empty_summary

    files, skipped = expand(args.paths)
    if not files:
        raise InputError(f"no x86-64 ELF file in {', '.join(args.paths)}")
    db = args.db or os.path.abspath("relocverify-user.sqlite")
    cache_dir = None if args.no_cache else (args.cache_dir or default_proof_cache_dir())
    options = RunOptions(0, args.jobs or default_jobs(), args.timeout, None, False, cache_dir, "user",
                         jump_probes=args.jump_probes)
    quiet = Progress(enabled=False)
    say = (lambda line: None) if args.no_progress else (lambda line: print(line, file=sys.stderr, flush=True))
    images: dict[str, dict] = {}
    t0 = time.monotonic()
    with Session(options) as session:
        for k, path in enumerate(files):
            try:
                image = load_image(path)
                tramp = _tramp_for(image, args)
            except RelocverifyError as exc:  # one bad file is skipped with its reason, not the run
                skipped[path] = str(exc).split(": ", 1)[-1]
                continue
            if not find_functions(image):
                images[path] = empty_summary(image, args.jump_probes)
                continue
            images[path] = run(image, db, replace(options, tramp=tramp), quiet, session)
            if (k + 1) % 50 == 0:
                say(f"files: {k + 1:,}/{len(files):,}, {time.monotonic() - t0:.0f} s")
    totals, adds_up = totals_over(images.values())
    out.write(f"{len(images):,} ELF files, {sum(totals.values()):,} instructions in {time.monotonic() - t0:.0f} s; "
              + ", ".join(f"{k} {v:,}" for k, v in totals.items()) + f"; totals add up: {adds_up}; policy: user space\n")
    if skipped:
        reasons: dict[str, int] = {}
        for why in skipped.values():
            reasons[why] = reasons.get(why, 0) + 1
        out.write(f"skipped {len(skipped):,}: " + ", ".join(f"{escape(k)} {v:,}" for k, v in
                                                            sorted(reasons.items(), key=lambda kv: -kv[1])) + "\n")
    report = {"images": images, "skipped": skipped, "totals": totals, "totals_add_up": adds_up}
    if args.jump_probes:
        from ..engine.jumps import jump_totals, render_jump_totals

        report["jump_probe"] = jumps = jump_totals(s["jump_probe"] for s in images.values())
        out.write(render_jump_totals(jumps, escape))
        adds_up = adds_up and jumps["totals_add_up"]
    out.write(f"store: {escape(db)}\n")
    return finish(out, args, report, totals, adds_up)


def _one(args, out: TextIO) -> int:
    from ..engine.executors import default_jobs
    from ..engine.progress import Progress
    from ..engine.run import RunOptions, render_summary, run
    from ..environment import default_proof_cache_dir
    from ..image.loader import load_image

    image = load_image(args.path)
    tramp = _tramp_for(image, args)
    db = args.db or os.path.abspath(f"relocverify-{image.identity[:12]}.sqlite")
    cache_dir = None if args.no_cache else (args.cache_dir or default_proof_cache_dir())
    options = RunOptions(tramp, args.jobs or default_jobs(), args.timeout, None, False, cache_dir, "user",
                         jump_probes=args.jump_probes)
    summary = run(image, db, options, Progress(enabled=not args.no_progress))
    out.write(render_summary(summary, escape))
    complete = summary["totals_add_up"] and summary["run"]["status"] == "complete"
    if args.jump_probes:
        out.write("".join(f"jump probes, not checked: {escape(u)}\n" for u in summary["jump_probe"].get("unchecked", ())))
        complete = complete and summary["jump_probe"]["totals_add_up"]
    out.write(f"trampoline: {tramp:#x}; policy: user space\nstore: {escape(db)}\n")
    return finish(out, args, summary, summary["by_verdict"], complete)
