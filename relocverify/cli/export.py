"""``relocverify export``: the probe points a store's verdicts make safe, in a tracer's own syntax.

    relocverify export STORE --format bpftrace [--functions 'vfs_*'] [--verdict proved] [-o probes.bt]

One probe per instruction whose verdict is one of ``--verdict`` (default: ``proved`` only), in every
function whose name matches ``--functions`` (an fnmatch glob, case-sensitive), in the store's kernel
images (a vmlinux, and the modules of a package store): ``report.probe_points`` collects them,
``report.probe_files`` writes them as a bpftrace program, a ``perf probe`` script, a D program for
FreeBSD's kinst, or JSON (``docs/export.md`` says where each syntax comes from, and which functions each
leaves out and why); this module parses the command line and writes the file.

A verdict holds for the kernel build the store verified (its sha256 is in the header) and the
trampoline its run planned for; probing another build with these offsets is unchecked.  Exit 0, or 2
for an unusable store or a glob that matches no function.
"""

from __future__ import annotations

import argparse
import os
from typing import TextIO

from ..errors import InputError
from ..report.probe_files import FORMATS, RENDERERS
from ..report.probe_points import collect

EXIT_CLEAN = 0


def _verdicts(text: str) -> tuple[str, ...]:
    """An argparse type: VERDICT[,VERDICT...] from the Verdict enum, in verdict order."""
    from ..proof.verdict import Verdict

    names = {t.strip() for t in text.split(",") if t.strip()}
    known = [v.value for v in Verdict]
    bad = sorted(names - set(known))
    if not names or bad:
        raise argparse.ArgumentTypeError(f"--verdict takes verdicts from {', '.join(known)}, comma-separated; "
                                         f"not {text!r}")
    return tuple(v for v in known if v in names)


def add_parser(sub, types: dict) -> None:
    e = sub.add_parser("export", help="write the probe points a store's verdicts make safe, for bpftrace, perf "
                                      "probe, DTrace (kinst) or as JSON",
                       description="One probe per instruction whose verdict is one of --verdict (default: "
                                   "proved), in the functions matching --functions, in each tool's own syntax. "
                                   "Functions a tool cannot address by FUNCTION+OFFSET (a name several functions "
                                   "share, code freed after boot, ...) are left out with a comment saying how "
                                   "many and why. Exit 0; 2 for an unusable store or a glob matching nothing.")
    e.add_argument("store", metavar="STORE", type=types["IN_FILE"], nargs="?", default=None,
                   help="a store written by `relocverify vmlinux` (or `package`); with --running, the running "
                        "kernel's own (the one `relocverify vmlinux VMLINUX` writes beside its image)")
    e.add_argument("--format", required=True, choices=FORMATS, help="the syntax to write")
    e.add_argument("--functions", default=None, metavar="GLOB",
                   help="only functions whose name matches GLOB (fnmatch, case-sensitive: 'vfs_*', 'tcp_v4_?cv')")
    e.add_argument("--verdict", type=_verdicts, default=("proved",), metavar="VERDICT[,VERDICT...]",
                   help="the verdicts that make a probe point (default: proved; anything weaker is not a proof "
                        "that the relocated instruction behaves as the original)")
    e.add_argument("-o", "--output", default=None, metavar="FILE", type=types["OUT_FILE"],
                   help="write FILE (atomically) instead of the standard output")
    from .live import add_options

    add_options(e, types, live=False)
    e.set_defaults(func=command)


def running_store(args) -> str:
    """The store of the running kernel's image, where ``relocverify vmlinux VMLINUX`` writes it; one line if
    there is none yet."""
    from ..engine.verify import store_path
    from ..store.image_index import indexed
    from .live import running_image

    if args.store is not None:
        raise InputError("export --running: the running kernel's store is found beside its image; give no STORE")
    line = running_image(args)
    store = store_path(args.image, indexed(args.image).identity)
    if not os.path.isfile(store):
        raise InputError(f"no store of the running kernel yet ({line}): `relocverify vmlinux {args.image}` writes "
                         f"it to {store}")
    return store


def command(args, out: TextIO) -> int:
    from ..outputs import write_atomic

    if args.running:
        args.store = running_store(args)
    elif args.store is None:
        raise InputError("export needs a STORE (written by `relocverify vmlinux`), or --running for the kernel "
                         "this machine runs")

    found = collect(args.store, args.functions, args.verdict)
    text = RENDERERS[args.format](found)
    if args.output:
        write_atomic(args.output, text)
    else:
        out.write(text)
    return EXIT_CLEAN
