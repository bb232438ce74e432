"""``relocverify show``: one function annotated in the terminal, one line per instruction, as engineers read
``perf annotate`` or ``objdump -d --disassemble=FUNC``: its offset, bytes, disassembly, plan, verdict and
the whole reason (folded at word boundaries to the terminal's width, never cut).

    relocverify show /tmp/k.sqlite vfs_read              from a store a ``relocverify vmlinux`` run wrote
    relocverify show vmlinux tcp_v4_rcv+0x19             from an image: the function is verified first
    relocverify show vmlinux show_cpuinfo@0xffffffff81045a10 --json

FUNCTION is a name, NAME@0xADDR when several static functions share the name, NAME+OFF (the instruction
there is marked with ``>``) or an address inside a function.  ``report.shown`` finds it and its rows (from a
store: the store's rows; from a vmlinux or bzImage: verified now); this module parses the command line and
renders the answer as text or JSON.  Exit 0, or 2 for an unknown or ambiguous function or an unusable
SOURCE.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from typing import TextIO

from ..errors import InputError
from ..image.functions import Function
from ..plan.plan import DEFAULT_TRAMP
from ..proof.verdict import Verdict
from ..report.shown import Shown, from_source
from .render import escape

EXIT_CLEAN = 0

#: ANSI colours by verdict (``--color``): proved green, opaque and unknown yellow, rejected dim, refuted red.
COLOURS = {"proved": "\x1b[32m", "opaque": "\x1b[33m", "unknown": "\x1b[33m", "rejected": "\x1b[2m",
           "refuted": "\x1b[1;31m"}
RESET = "\x1b[0m"
MIN_REASON = 40  # below this many columns left for the reason, it starts on the next line
HANG = 8  # the indent of a reason folded under a prefix too wide for it
MAX_TEXT = 40  # the widest the disassembly column grows; a longer instruction pushes its line right
MIN_TEXT = 24  # the narrowest it shrinks to, to leave the reason room on the instruction's line
BYTES_PER_LINE = 7  # as objdump -d: a longer instruction's bytes go on below


def add_parser(sub, types: dict) -> None:
    s = sub.add_parser("show", help="one function annotated: per instruction its bytes, disassembly, plan, "
                                    "verdict and reason (from a store, or verified now from an image)",
                       description="Print a function as `perf annotate` does, with relocverify's answer per "
                                   "instruction: offset, bytes, disassembly, plan kind, verdict and the whole "
                                   "reason. SOURCE is a result store (instant) or a vmlinux/bzImage (the "
                                   "function is verified first). Exit 0; 2 for an unknown or ambiguous "
                                   "function or an unusable SOURCE.")
    s.add_argument("source", metavar="SOURCE",
                   help="a store written by `relocverify vmlinux`, or a vmlinux ELF or bzImage (left out with "
                        "--running)")
    s.add_argument("function", metavar="FUNCTION", nargs="?", default=None,
                   help="a function name, NAME@0xADDR (one of several static functions of that name), "
                        "NAME+0x1c (marks that instruction) or an address inside a function")
    s.add_argument("--system-map", default=None, metavar="FILE", type=types["IN_FILE"],
                   help="System.map or kallsyms for an image without function symbols (a bzImage)")
    s.add_argument("--json", action="store_true",
                   help="print the function and every instruction (address, offset, bytes, text, plan, rule, "
                        "verdict, method, reason, sites, variants) as JSON")
    s.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour verdicts: auto (when the output is a terminal and NO_COLOR is unset), "
                        "always or never")
    s.add_argument("--tramp", type=types["TRAMP"], default=DEFAULT_TRAMP, metavar="ADDR",
                   help=f"with an image: the trampoline address T the plans use (default {DEFAULT_TRAMP:#x}, "
                        f"as `relocverify vmlinux`); a store answers for its run's")
    s.add_argument("--timeout", type=types["SECONDS"], default=10.0, metavar="S",
                   help="with an image: solver timeout per proof in seconds (default 10)")
    s.add_argument("--no-cache", action="store_true",
                   help="with an image: neither read nor write the persistent proof cache")
    from .live import add_options

    add_options(s, types, live=False)
    s.set_defaults(func=command)


def _sources(args) -> None:
    """SOURCE and FUNCTION checked (``show --running FUNCTION``: the running kernel's image is the source)."""
    from ..inputs import input_file
    from .live import running_image
    from .locate import location

    if args.running:
        if args.function is not None:
            raise InputError("show --running FUNCTION: the running kernel is the source; give no SOURCE")
        args.function = location(args.source)
        args.image = None
        line = running_image(args)
        args.source = args.image
        sys.stderr.write(f"show: {line}; the file's bytes and every boot variant are judged here (the live bytes "
                         f"of one instruction: relocverify check --running FUNCTION+OFF)\n")
        return
    if args.function is None:
        raise InputError("show needs SOURCE and FUNCTION (a store or an image, then a function), or --running "
                         "FUNCTION for the kernel this machine runs")
    input_file(args.source)
    args.function = location(args.function)


def command(args, out: TextIO) -> int:
    _sources(args)
    shown = from_source(args.source, args.function, args.system_map, args.tramp, args.timeout, not args.no_cache)
    if args.json:
        json.dump(as_json(shown), out, indent=2, ensure_ascii=True)
        out.write("\n")
        return EXIT_CLEAN
    out.write(render(shown, _width(), _colour(args.color, out)))
    return EXIT_CLEAN


def _width() -> int:
    return max(shutil.get_terminal_size().columns, 40)


def _colour(choice: str, out: TextIO) -> bool:
    if choice != "auto":
        return choice == "always"
    isatty = getattr(out, "isatty", None)
    return bool(isatty and isatty()) and not os.environ.get("NO_COLOR")


# ---------------------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------------------

def counts(shown: Shown) -> dict[str, int]:
    """Instructions per verdict, in verdict order (strongest first), the verdicts present only."""
    tally: dict[str, int] = {}
    for r in shown.rows:
        tally[r.row.verdict] = tally.get(r.row.verdict, 0) + 1
    return {v.value: tally[v.value] for v in Verdict if v.value in tally}


def reason_text(r) -> str:
    """The row's whole reason, its kernel sites, its live variants and the replay line of a refutation:
    everything the table says about it past the verdict (``--json`` also gives the method and rule)."""
    row = r.row
    text = row.reason
    if row.sites:
        text += f"; sites: {', '.join(row.sites)}"
    if r.variants:
        text += "; variants: " + ", ".join(f"{name} {verdict}" for name, verdict, _ in sorted(r.variants))
    if r.counterexample and r.counterexample.get("replay"):
        text += f"; replay: {r.counterexample['replay']}"
    return escape(text)


def render(shown: Shown, width: int, colour: bool) -> str:
    f = shown.function
    lines = [(f"{escape(f.name)}: {f.start:#x}..{f.end:#x} ({f.size} bytes, {len(shown.rows)} instructions) "
              f"in {escape(f.section)}")]
    where = "the store" if shown.source == "store" else "verified now from the image"
    took = f" in {shown.seconds:.2f} s" if shown.seconds is not None else ""
    tramp = f"; trampoline {shown.tramp:#x}" if shown.tramp is not None else ""
    lines.append(f"  {where} {escape(shown.path)}{took}{tramp}")
    lines.extend(f"  note: {escape(note)}" for note in shown.notes)  # said once: what the loader adjusted
    lines.append("  " + ", ".join(f"{v} {n}" for v, n in counts(shown).items()))
    offsets = [f"+{r.row.address - f.start:#x}" for r in shown.rows]
    ow = max(len("offset"), *(len(o) for o in offsets))
    bw = max(len("bytes"), *(3 * min(r.row.length, BYTES_PER_LINE) - 1 for r in shown.rows))
    texts = [escape(t) for t in shown.texts]
    # the disassembly column as wide as its texts, up to MAX_TEXT; narrower (down to MIN_TEXT) on a terminal
    # that would otherwise leave the reason less than MIN_REASON columns; on a narrower one the reasons go on
    # the lines below, and the column shrinks to keep the other columns within the width (a longer text
    # pushes its own line right)
    fixed = 2 + ow + 2 + bw + 2 + 2 + 7 + 2 + 8 + 2
    tw = min(max(len(t) for t in texts), MAX_TEXT)
    room = width - MIN_REASON - fixed if width - MIN_REASON - fixed >= MIN_TEXT else width - fixed + 2
    tw = max(min(tw, room), len("instruction"))
    lines.append(f"  {'offset':<{ow}}  {'bytes':<{bw}}  {'instruction':<{tw}}  {'plan':<7}  {'verdict':<8}  reason")
    for r, off, text in zip(shown.rows, offsets, texts):
        row = r.row
        marker = "> " if shown.mark is not None and row.address == shown.mark else "  "
        chunks = [row.raw[i:i + BYTES_PER_LINE].hex(" ") for i in range(0, row.length, BYTES_PER_LINE)] or [""]
        head = f"{marker}{off:<{ow}}  {chunks[0]:<{bw}}  {text:<{tw}}  {row.plan_kind:<7}  "
        more = [f"{'':<{2 + ow}}  {c}" for c in chunks[1:]]  # objdump's way: the bytes go on below
        entry = fold(head + f"{row.verdict:<8}  ", reason_text(r), width, more)
        if colour and row.verdict in COLOURS:
            first, at = entry[0], len(head)
            entry[0] = first[:at] + COLOURS[row.verdict] + row.verdict + RESET + first[at + len(row.verdict):]
        lines.extend(entry)
    return "\n".join(lines) + "\n"


def fold(prefix: str, reason: str, width: int, below: list[str] = ()) -> list[str]:
    """``prefix`` then ``reason`` folded at word boundaries to ``width`` columns, the continuation lines
    indented under the reason (or by ``HANG`` on lines of their own when the prefix leaves it less than
    ``MIN_REASON`` columns), with the lines ``below`` (the rest of a long instruction's bytes) on the left
    of the continuation lines: never cut mid-word, never truncated (a word longer than a line gets a line of
    its own)."""
    options = {"break_long_words": False, "break_on_hyphens": False}
    room = width - len(prefix)
    if room >= MIN_REASON:
        folded = textwrap.wrap(reason, width=room, **options) or [""]
        lines = [prefix + folded[0]]
        for i in range(1, max(len(folded), len(below) + 1)):
            left = below[i - 1] if i - 1 < len(below) else ""
            right = folded[i] if i < len(folded) else ""
            lines.append(f"{left:<{len(prefix)}}{right}" if right else left)
        return [line.rstrip() for line in lines]
    folded = textwrap.wrap(reason, width=width, initial_indent=" " * HANG, subsequent_indent=" " * HANG, **options)
    return [line.rstrip() for line in [prefix, *below, *folded]]


def as_json(shown: Shown) -> dict:
    f = shown.function
    return {
        "source": {"kind": shown.source, "path": shown.path, "trampoline": None if shown.tramp is None
                   else hex(shown.tramp), "seconds": None if shown.seconds is None else round(shown.seconds, 3)},
        "function": {"name": f.name, "start": hex(f.start), "end": hex(f.end), "size": f.size, "section": f.section,
                     "instructions": len(shown.rows), "verdicts": counts(shown),
                     "marked": None if shown.mark is None else hex(shown.mark)},
        "instructions": [instruction_json(r, f, text) for r, text in zip(shown.rows, shown.texts)],
    }


def instruction_json(r, f: Function, text: str) -> dict:
    row = r.row
    return {"address": hex(row.address), "offset": row.address - f.start, "bytes": row.raw.hex(), "text": text,
            "plan": row.plan_kind, "rule": row.rule, "class": row.klass, "verdict": row.verdict,
            "method": row.method, "reason": row.reason, "sites": list(row.sites),
            "variants": [{"name": n, "verdict": v, "reason": why} for n, v, why in sorted(r.variants)],
            "counterexample": r.counterexample}
