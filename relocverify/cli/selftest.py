"""``relocverify selftest``: candidate false proofs judged by this machine's CPU; ``--validate-forms`` remakes
the CPU-validated form table."""

from __future__ import annotations

import json
import os
import random
import sys
from typing import TextIO

EXIT_CLEAN, EXIT_FINDINGS = 0, 1


def add_parser(sub, types: dict) -> None:
    s = sub.add_parser("selftest", help="generate candidate false proofs and judge each proof on this CPU",
                       description="Mutation operators (one family per class of false proof, plus controls) make "
                                   "relocations from real kernel shapes; the checker judges each; every one it "
                                   "proves is run on this machine's CPU (or, for memory ordering and tearing, "
                                   "checked against the x86 memory-model table) and in a model of the machine "
                                   "it runs in (faults by kind, traps and shadows, interrupt frames, IBT, "
                                   "shadow stacks, alignment checking). Exit 1 on any false proof.")
    s.add_argument("--pairs", type=types["COUNT"], default=600, metavar="N", help="candidates to generate (default 600)")
    s.add_argument("--seed", type=int, default=None, metavar="S", help="random seed (default: random, printed)")
    s.add_argument("--operators", default=None, metavar="NAME[,NAME...]",
                   help="only these operators (names, or class numbers 1-22, 0 for controls)")
    s.add_argument("--states", type=types["COUNT"], default=12, metavar="N",
                   help="CPU states per proved candidate (default 12)")
    s.add_argument("--jobs", type=types["JOBS"], default=None, metavar="N",
                   help="worker processes, at most one per CPU (default: CPUs)")
    s.add_argument("--json", action="store_true", help="print the tallies and false proofs as JSON")
    s.add_argument("--no-progress", action="store_true", help="print no progress on stderr (drawn on a terminal only)")
    s.add_argument("--validate-forms", action="store_true",
                   help="instead: run every instruction form of the sources below on this CPU and merge the "
                        "readings into the validated-form table (relocverify/proof/validated_forms.json, or "
                        "--output): another CPU's readings stay, and a form read differently is not exact")
    s.add_argument("--kernel", action="append", default=None, metavar="NAME",
                   help="with --validate-forms: a Debian kernel's vmlinux (and --modules); repeatable")
    s.add_argument("--modules", action="store_true", help="with --validate-forms: the kernels' modules too")
    s.add_argument("--elf", action="append", default=None, metavar="PATH", type=types["IN_PATH"],
                   help="with --validate-forms: user-space ELF files or directories; repeatable")
    s.add_argument("--output", default=None, metavar="FILE", type=types["OUT_FILE"],
                   help="with --validate-forms: where to write the table")
    s.add_argument("--update", action="store_true",
                   help="with --validate-forms: keep the rows of the current table, validate only forms it lacks "
                        "(and those named by --revalidate)")
    s.add_argument("--revalidate", default=None, metavar="STATUS[,STATUS...]",
                   help="with --update: also validate again the rows with these statuses (exact, loose, failed)")
    s.set_defaults(func=command)


def _progress(enabled: bool, label: str, unit: str):
    """A ``(done, total)`` callback drawing the engine's progress bar (nothing off a terminal)."""
    if not enabled:
        return None
    from ..schedule.progress import Progress

    bar = Progress(True)

    def show(done: int, total: int) -> None:
        if not bar.label:
            bar.phase(label, total, unit)
        bar.update(done)
        if done == total:
            bar.end()
    return show


def command(args, out: TextIO) -> int:
    jobs = args.jobs or os.cpu_count() or 1
    if args.validate_forms:
        return _validate(args, out, jobs)
    from ..selftest.run import run

    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    names = [n.strip() for n in args.operators.split(",")] if args.operators else None
    report = run(args.pairs, seed, names, jobs, args.states, _progress(sys.stderr.isatty() and not (args.json or args.no_progress), "selftest", "pairs"))
    if args.json:
        json.dump(report.as_json(), out, indent=2)
        out.write("\n")
    else:
        out.write(render(report))
    if report.errors:
        return 4  # the checker itself crashed on a candidate: an internal error to report
    return EXIT_FINDINGS if report.false_proofs else EXIT_CLEAN


def render(report) -> str:
    lines = [f"selftest: seed {report.seed}, {report.pairs} pairs (replay with --seed {report.seed})",
             f"{'operator':24s} {'generated':>9s} {'proved':>7s} {'refuted':>7s} {'unknown':>7s} {'FALSE':>6s}"]
    for name, t in sorted(report.operators.items()):
        lines.append(f"{name:24s} {t.generated:9d} {t.proved:7d} {t.refuted:7d} {t.unknown:7d} {t.false_proofs:6d}")
    c = report.controls
    share = f"{100 * c.proved / c.generated:.1f}%" if c.generated else "-"
    lines.append(f"{'controls':24s} {c.generated:9d} {c.proved:7d} {c.refuted:7d} {c.unknown:7d} "
                 f"{c.false_proofs:6d}   ({share} proved)")
    total = sum(t.false_proofs for t in report.operators.values()) + c.false_proofs
    lines.append(f"false proofs: {total}")
    if report.errors:
        lines.append(f"checker crashes: {len(report.errors)} (each a bug; the first: {report.errors[0]['exception']}; "
                     f"replay: {report.errors[0]['replay']})")
    for fp in report.false_proofs:
        lines.append(f"  FALSE PROOF [{fp['operator']}, class {fp['class']}] {fp['note']}: {fp['difference']}")
        lines.append(f"    replay: {fp['replay']}")
    return "\n".join(lines) + "\n"


def _validate(args, out: TextIO, jobs: int) -> int:
    from ..concrete.cpu import identity
    from ..proof import form_table
    from ..selftest import form_sources as FS
    from ..selftest.form_merge import merge_table
    from ..selftest.form_validation import validate_forms

    forms, counts = FS.collect(FS.corpus_instructions())
    for name in args.kernel or ([] if args.elf and args.update else ["debian-6.1-cloud"]):
        FS.collect(FS.kernel_instructions(name, args.modules), forms=forms, counts=counts)
    if args.elf:
        paths = []
        for p in args.elf:
            paths += [os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs] if os.path.isdir(p) else [p]
        FS.collect(FS.elf_instructions(paths), forms=forms, counts=counts)
    FS.collect(FS.plan_instructions([v[0] for v in list(forms.values())]), forms=forms, counts=counts)
    out.write(f"{len(forms)} forms from {sum(counts.values())} instructions\n")
    target = args.output or os.path.join(os.path.dirname(form_table.__file__), form_table.TABLE_NAME)
    previous = {}
    if os.path.exists(target):  # merged into: another CPU's rows stay, this CPU's readings are added
        with open(target) as f:
            previous = json.load(f)
    again = set((args.revalidate or "").split(",")) - {""}
    old_rows = previous.get("forms", {}) if args.update else {}
    todo = {form: raws for form, raws in forms.items()
            if form not in old_rows or old_rows[form]["status"] in again}
    out.write(f"validating {len(todo)} forms ({len(forms) - len(todo)} kept from the current table)\n")
    results = validate_forms(dict(todo), jobs=jobs, progress=_progress(sys.stderr.isatty() and not args.no_progress, "forms", "forms"))
    sources = previous.get("sources", {})
    sources = {"kernels": sorted(set(sources.get("kernels", [])) | set(args.kernel or [])),
               "modules": sources.get("modules", False) or args.modules,
               "elf": sorted(set(sources.get("elf", [])) | set(args.elf or [])), "corpora": True, "plans": True}
    data = merge_table(previous, results, identity(), sources)
    for form, row in data["forms"].items():
        row["seen"] = counts[form] if form in results else row.get("seen", 0) + counts.get(form, 0)
    tmp = target + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=0, sort_keys=True)
    os.replace(tmp, target)
    out.write(f"{data['counts']} -> {target}\n")
    return EXIT_CLEAN
