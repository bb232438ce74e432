"""Where a command's kernel and live text come from: ``--running`` (this machine's kernel, its live text
from ``/proc/kcore``), ``--live-text DUMP --kallsyms FILE`` (a captured live text), or neither (the file).

``add_options`` adds the three options to a command; ``running_image(args, what)`` points ``args.image`` at
the running kernel's vmlinux when asked for (or one line saying why it cannot: ``image.running``);
``live_text(args, index, function)`` reads the live text a question needs, or says why the file is judged
instead (``Unread``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError


@dataclass(frozen=True)
class Unread:
    """The live text was asked for and cannot be read: the file is judged, marked with this reason."""

    reason: str


def add_options(parser, types: dict, live: bool = True) -> None:
    parser.add_argument("--running", action="store_true",
                        help="the kernel this machine runs: its image and symbols found (a Debian kernel's -dbg "
                             "package with apt-get download)" + (", its live text read from /proc/kcore (root) "
                                                                 "and judged" if live else ""))
    if live:
        parser.add_argument("--live-text", default=None, metavar="DUMP", type=types["IN_FILE"],
                            help="judge the live bytes in DUMP (lines ADDR HEX, as `rvctl peek` prints them) "
                                 "instead of the file's; needs --kallsyms")
        parser.add_argument("--kallsyms", default=None, metavar="FILE", type=types["IN_FILE"],
                            help="/proc/kallsyms of the kernel DUMP came from (its _stext line at least: the "
                                 "KASLR slide)")


def wants_live(args) -> bool:
    return bool(getattr(args, "running", False) or getattr(args, "live_text", None))


def check_options(args) -> None:
    """The combinations that make sense, or one line."""
    dump, kallsyms = getattr(args, "live_text", None), getattr(args, "kallsyms", None)
    if bool(dump) != bool(kallsyms):
        raise InputError("--live-text DUMP and --kallsyms FILE go together: the dump's addresses are the running "
                         "kernel's, and kallsyms gives their slide against the image")
    if getattr(args, "running", False) and dump:
        raise InputError("--running reads this machine's live text; --live-text gives a captured one: give one")
    if getattr(args, "running", False) and getattr(args, "image", None):
        raise InputError("--running finds the running kernel's image itself; to judge another image's live text "
                         "give --image with --live-text DUMP --kallsyms FILE")


def running_image(args, say=None) -> str:
    """``args.image`` pointed at the running kernel's vmlinux; returns the line that says which."""
    from ..image.running import identify, running_image as find

    kernel = identify()
    args.image = find(kernel, progress=say)
    return f"the running kernel, {kernel.describe()}: {args.image}"


def default_running() -> bool:
    """Whether a location without an image is read in the running kernel: when relocverify can identify it."""
    from ..image.running import identifiable, identify

    return identifiable(identify())


def live_text(args, index, start: int, end: int):
    """The live text around [start, end) (a function) as a ``kernel.live.LiveText``, or ``Unread``."""
    from ..kernel.live import LiveText, live_text as from_dump, merge_ranges, parse_kallsyms, slide

    text = index.image.get_section(".text")
    text_start = text.address if text is not None else start
    if getattr(args, "live_text", None):
        return from_dump(Path(args.live_text).read_text(errors="replace"), args.live_text,
                         Path(args.kallsyms).read_text(errors="replace"), args.kallsyms, text_start)
    from ..image.running import KALLSYMS, KcoreUnreadable, read_kallsyms, read_kcore

    try:
        moved = slide(parse_kallsyms(read_kallsyms(), KALLSYMS), text_start, KALLSYMS)
    except InputError as exc:
        return Unread(str(exc))
    pieces = read_kcore([(start + moved, end - start + 15)])
    if isinstance(pieces, KcoreUnreadable):
        return Unread(pieces.reason)
    return LiveText(merge_ranges(pieces), moved, "/proc/kcore")


def note(command: str, line: str) -> None:
    sys.stderr.write(f"{command}: {line}\n")
