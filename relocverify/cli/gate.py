"""``relocverify gate``: the CI gate on x86 decoder changes (docs/gate.md).

Exit codes: 0 clean (every difference explained or accepted by the
baseline), 1 a new difference or changed answers, 2 usage or input error.
"""

from __future__ import annotations

import argparse
import json
from typing import TextIO

from ..errors import InputError

EXIT_CLEAN, EXIT_FINDINGS = 0, 1
DEFAULT_CONSENSUS = ("capstone", "iced")


def _output(text: str) -> str:
    """``--junit``/``--sarif``: a file the gate may write, checked before the run (issue 44: an unwritable
    path was refused only after the whole run)."""
    from ..errors import InputError
    from .arguments import output_file

    try:
        return output_file(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _jobs(text: str) -> int:
    """``--jobs``: as every command's (``arguments.jobs``: 1 to this machine's CPUs), named by argparse."""
    from ..errors import InputError
    from .arguments import jobs

    try:
        return jobs(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(sub) -> None:
    g = sub.add_parser("gate", help="gate a decoder: compare its answers with a baseline, the other "
                                    "decoders and the plans that follow (docs/gate.md)")
    which = g.add_mutually_exclusive_group(required=True)
    which.add_argument("--decoder", metavar="NAME",
                       help="the decoder under test: capstone, iced, vex, objdump, or the kernel's own insn decoder "
                            "built from Debian's linux-source-VERSION or a tree: linux-insn@6.1, linux-insn@/path/to/linux")
    which.add_argument("--decoder-cmd", metavar="CMD",
                       help="an external decoder command speaking the line protocol of docs/gate.md")
    g.add_argument("--image", action="append", default=[], metavar="PATH",
                   help="a kernel image (vmlinux ELF or bzImage) whose every instruction is decoded; repeatable")
    g.add_argument("--module", action="append", default=[], metavar="PATH",
                   help="kernel modules (.ko, .ko.xz, .ko.zst): a file, or a directory searched for them "
                        "(e.g. /lib/modules/RELEASE/kernel); repeatable, one input each")
    g.add_argument("--corpus", action="append", default=[], metavar="TOML",
                   help="a corpus file whose entries' bytes are decoded; repeatable")
    g.add_argument("--fuzz", type=int, default=0, metavar="N",
                   help="also decode N fuzzed 15-byte windows (mishegos-style sliding window)")
    g.add_argument("--seed", type=int, default=0, metavar="N", help="the fuzzer's seed (default 0)")
    g.add_argument("--consensus", action="append", default=None, metavar="NAME",
                   help="a decoder to compare with; repeatable (default: capstone and iced, "
                        "less the decoder under test)")
    g.add_argument("--baseline", required=True, metavar="FILE",
                   help="the baseline JSON: accepted disagreements and a digest per input section")
    g.add_argument("--update-baseline", action="store_true",
                   help="accept the current state: write it to --baseline and exit 0")
    g.add_argument("--junit", metavar="FILE", default=None, type=_output,
                   help="also write the result as JUnit XML (checked writable before the run)")
    g.add_argument("--sarif", metavar="FILE", default=None, type=_output,
                   help="also write the result as SARIF 2.1.0 (checked writable before the run)")
    g.add_argument("--json", action="store_true", help="print the result as JSON (every cohort of answers)")
    g.add_argument("--jobs", type=_jobs, default=None, metavar="N",
                   help="worker processes for sweeping and decoding (default 1: on a busy machine a pool costs "
                        "more than it saves)")
    g.add_argument("--prove", type=int, default=3, metavar="N",
                   help="per class of new difference, build and check the plan of at most N instructions "
                        "(default 3)")
    g.set_defaults(func=command)


def command(args, out: TextIO) -> int:
    from ..gate import baseline as baseline_mod
    from ..gate.fuzz import fuzz_unit
    from ..gate.junit import junit_xml
    from ..gate.module_samples import module_units
    from ..gate.run import render, run_gate
    from ..gate.samples import corpus_units, image_units
    from ..gate.sarif import sarif
    from ..x86.decoders.adapters import external_adapter, get_adapter

    if not (args.image or args.module or args.corpus or args.fuzz):
        raise InputError("gate: give at least one input: --image PATH, --module PATH, --corpus TOML or --fuzz N")
    if args.fuzz < 0 or (args.prove is not None and args.prove < 0):
        raise InputError("gate: --fuzz and --prove take a count >= 0")
    tested = external_adapter(args.decoder_cmd) if args.decoder_cmd else get_adapter(args.decoder)
    names = args.consensus or [n for n in DEFAULT_CONSENSUS if n != tested.name]
    others = [get_adapter(n) for n in names if n != tested.name]
    if not others:
        raise InputError("gate: no decoder left to compare with; give --consensus NAME")
    base = None if args.update_baseline else baseline_mod.load(args.baseline)
    units = [u for path in args.image for u in image_units(path, jobs=args.jobs or 1)]
    units += [u for path in args.module for u in module_units(path)]
    if args.corpus:  # the corpus loader's imports cost a second: only when asked
        units += corpus_units(args.corpus)
    if args.fuzz:
        units.append(fuzz_unit(args.fuzz, args.seed))
    report = run_gate(tested, others, units, base, prove_per_class=args.prove, jobs=args.jobs or 1)
    change = _decoder_change(tested, others, units, report, base, args.jobs or 1)
    if change is not None:
        from ..gate.change import settle
        report = settle(report, change)
    written = None
    if args.update_baseline:
        doc = baseline_mod.build(report)
        baseline_mod.save(args.baseline, doc)
        written = (args.baseline, len(doc.get("accepted", ())))
    if args.junit:
        _write(args.junit, junit_xml(report))
    if args.sarif:
        _write(args.sarif, json.dumps(sarif(report), indent=1) + "\n")
    failed = report.failed if change is None else change.failed
    classified = None
    if tested.name.startswith("linux-insn@"):
        from ..gate import linux_insn_classes
        classified = linux_insn_classes.classify_report(report, tested)
    if args.json:
        doc = report.as_json()
        if change is not None:
            doc["change"] = change.as_json()
            doc["failed"] = failed
        if classified is not None:
            doc["linux_insn_classes"] = [c.as_json() for c in classified]
            doc["linux_insn_class_counts"] = linux_insn_classes.counts(classified)
        json.dump(doc, out, indent=1)
        out.write("\n")
    else:
        out.write(render(report, written))
        if classified:
            out.write(linux_insn_classes.render(classified))
        if change is not None:
            from ..gate.change import render as render_change
            out.write(render_change(change))
    return EXIT_CLEAN if args.update_baseline or not failed else EXIT_FINDINGS


def _decoder_change(tested, others, units, report, base, jobs: int):
    """For a ``linux-insn@`` decoder gated against another build's baseline: the change report
    (``gate.change``), which fails only on regressions; None otherwise, or when that build is gone."""
    from ..gate import change

    if not change.applies(base, tested):
        return None
    old = change.baseline_decoder(base)
    if old is None:
        report.notes.append(f"the baseline's decoder {base.doc['decoder']['name']} "
                            f"{base.doc['decoder'].get('version')} is neither cached nor buildable: "
                            f"no change report, changed answers fail as usual")
        return None
    return change.decoder_change(old, tested, others, units, report, base, jobs=jobs)


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise InputError(f"cannot write {path}: {e}") from None
