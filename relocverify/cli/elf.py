"""``relocverify elf``: verify every instruction of a user-space executable or shared library, by the
user-space policy table (``plan.policy.USER_RULES``: fasttrap and uprobes), as an
``engine.requests.ElfRequest`` given to ``engine.verify.verify``; and show the summary (one file's, or a
batch's totals)."""

from __future__ import annotations

from typing import TextIO

from .arguments import add_batch_options, add_jump_probes
from .finish import finish, next_steps
from .render import escape, verdict_counts


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


def command(args, out: TextIO) -> int:
    from ..engine.requests import ElfRequest
    from ..engine.verify import verify
    from .arguments import progress_lines, run_options

    # the user-space policy, and each file's own slot (engine.verify.user_trampoline), are the engine's to set
    summary = verify(ElfRequest(args.paths, run_options(args, 0), args.db, args.trampoline_base), progress_lines(args))
    if summary.batch:
        _render_batch(summary, args.jump_probes, out)
    else:
        _render_one(summary, args.jump_probes, out)
    return finish(out, args, summary)


def _render_one(summary, jump_probes: bool, out: TextIO) -> None:
    from ..engine.summary import render_summary

    out.write(render_summary(summary.document, escape))
    if jump_probes:
        unchecked = summary.document["jump_probe"].get("unchecked", ())
        out.write("".join(f"jump probes, not checked: {escape(u)}\n" for u in unchecked))
    out.write(f"trampoline: {summary.tramp:#x}; policy: user space\n")
    next_steps(out, summary.store)


def _render_batch(summary, jump_probes: bool, out: TextIO) -> None:
    out.write(f"{summary.images:,} ELF files, {summary.instructions:,} instructions in {summary.wall_s:.0f} s; "
              f"{verdict_counts(summary.by_verdict)}; totals add up: {summary.totals_add_up}; policy: user space\n")
    if summary.skipped:
        out.write(f"skipped {len(summary.document['skipped']):,}: "
                  + ", ".join(f"{escape(why)} {n:,}" for why, n in summary.skipped) + "\n")
    if jump_probes:
        from ..engine.jumps import render_jump_totals

        out.write(render_jump_totals(summary.document["jump_probe"], escape))
    next_steps(out, summary.store)
