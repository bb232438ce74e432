"""The thin command line.  Every command returns one of the fixed exit codes.

  0  clean: a relocatable plan that is proved (``check``), a proof (``prove``), no findings
  1  findings: a rejected plan, a refuted relocation, corpus entries that missed their expectation
  2  usage or input error (bad hex, bad address, unreadable image): a one-line message on stderr
  3  unknown: no proof and no refutation (``unknown`` or ``opaque`` verdicts)

``RelocverifyError`` and argparse errors are converted here and nowhere else.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence, TextIO

from ..errors import InputError, RelocverifyError
from ..inputs import parse_address, parse_range

EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, EXIT_UNKNOWN = 0, 1, 2, 3

DEFAULT_AT = 0xFFFFFFFF81234560  # an address in kernel text
DEFAULT_TRAMP = 0xFFFFFFFFC0001000  # module space, within rel32 reach of kernel text (as kinst places them)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        raise InputError(f"{self.prog}: {message}")


def cmd_check(args, out: TextIO) -> int:
    from . import check

    return check.command(args, out)


def cmd_prove(args, out: TextIO) -> int:
    from . import prove

    return prove.command(args, out)


def cmd_replay(args, out: TextIO) -> int:
    from . import replay

    return replay.command(args, out)


def cmd_policy(args, out: TextIO) -> int:
    from ..plan.policy import RULES

    for r in RULES:
        out.write(f"{r.name:<22} {r.strategy:<15} {r.reason}\n")
    return EXIT_CLEAN


def cmd_corpus(args, out: TextIO) -> int:
    from . import corpus

    return corpus.command(args, out)


def cmd_vmlinux(args, out: TextIO) -> int:
    from . import vmlinux

    return vmlinux.command(args, out)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="relocverify", description="relocverify: a formally checked x86-64 instruction relocation verifier")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = sub.add_parser("check", help="decode, plan and prove one instruction")
    c.add_argument("hex", metavar="HEX", help="one instruction in hex (spaces allowed)")
    c.add_argument("--at", type=parse_address, default=DEFAULT_AT, metavar="ADDR")
    c.add_argument("--tramp", type=parse_address, default=DEFAULT_TRAMP, metavar="ADDR")
    c.add_argument("--json", action="store_true")
    c.add_argument("--timeout", type=float, default=10.0, help="solver timeout in seconds")
    c.add_argument("--image", default=None, metavar="VMLINUX",
                   help="the kernel the bytes come from: also check the kernel sites at --at")
    c.add_argument("--system-map", default=None)
    c.set_defaults(func=cmd_check)

    pr = sub.add_parser("prove", help="check a relocation made by another tool")
    pr.add_argument("--orig", required=True, metavar="HEX")
    pr.add_argument("--at", type=parse_address, required=True, metavar="A")
    pr.add_argument("--reloc", required=True, metavar="HEX")
    pr.add_argument("--tramp", type=parse_address, required=True, metavar="T")
    pr.add_argument("--json", action="store_true")
    pr.add_argument("--timeout", type=float, default=10.0)
    pr.add_argument("--tracer-memory", type=parse_range, action="append", metavar="ADDR:SIZE",
                    help="memory the relocating tool owns (save slots): left out of the comparison")
    pr.set_defaults(func=cmd_prove)

    rp = sub.add_parser("replay", help="replay a counterexample concretely on unicorn")
    rp.add_argument("--orig", required=True, metavar="HEX")
    rp.add_argument("--at", type=parse_address, required=True)
    rp.add_argument("--reloc", metavar="HEX", default=None, help="relocated bytes at T (or give --effects)")
    rp.add_argument("--effects", metavar="JSON", default=None, help="an emulate plan's effects as JSON")
    rp.add_argument("--tramp", type=parse_address, required=True)
    rp.add_argument("--state", required=True, metavar="JSON", help="the counterexample's input state")
    rp.set_defaults(func=cmd_replay)

    po = sub.add_parser("policy", help="print the relocation policy table")
    po.set_defaults(func=cmd_policy)

    co = sub.add_parser("corpus", help="run the bundled corpora, or fetch a real kernel")
    co_sub = co.add_subparsers(dest="corpus_command", required=True, parser_class=_Parser)
    cr = co_sub.add_parser("run", help="check every entry of the corpora against its expected outcome")
    cr.add_argument("paths", nargs="*", help="corpus files (default: the bundled corpora)")
    cr.add_argument("--json", action="store_true")
    cf = co_sub.add_parser("fetch", help="download a named Debian kernel")
    cf.add_argument("name")
    cf.add_argument("--cache", default=None)
    co.set_defaults(func=cmd_corpus)

    v = sub.add_parser("vmlinux", help="verify every instruction of a kernel image")
    v.add_argument("path", nargs="?", default=None,
                   help="vmlinux ELF or bzImage (default: the fetched Debian 6.1 cloud kernel)")
    v.add_argument("--system-map", default=None)
    v.add_argument("--db", default=None)
    v.add_argument("--jobs", type=int, default=None)
    v.add_argument("--trampoline-base", type=parse_address, default=DEFAULT_TRAMP)
    v.add_argument("--summary-json", default=None)
    v.add_argument("--timeout", type=float, default=10.0)
    v.add_argument("--limit", type=int, default=None, help="verify only the first N functions")
    v.add_argument("--no-progress", action="store_true")
    v.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="the persistent proof cache's directory (default: $RELOCVERIFY_CACHE or ~/.cache/relocverify)")
    v.add_argument("--no-cache", action="store_true", help="neither read nor write the persistent proof cache")
    v.set_defaults(func=cmd_vmlinux)
    return p


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        args = build_parser().parse_args(argv)
        return args.func(args, out)
    except RelocverifyError as e:
        err.write(f"relocverify: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        err.write("relocverify: interrupted\n")
        return 130
    except BrokenPipeError:
        return EXIT_CLEAN


if __name__ == "__main__":
    sys.exit(main())
