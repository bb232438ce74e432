"""``relocverify audit``: what kprobes, optprobes, uprobes, kinst and fasttrap do with every
instruction of an image, a set of modules or a whole kernel package, each relocation proved or
refuted: the engine's request for them (``engine.requests``) given to ``tracers.run.audit``
(``tracers.audit`` judges).

    relocverify audit --tracer kprobes@6.1 --tracer kinst VMLINUX --db STORE [--summary-json F]
    relocverify audit --tracer optprobes@6.1 VMLINUX --module a.ko --module b.ko --db STORE
    relocverify audit --tracer kprobes@6.1 --package debian-6.1-cloud --db STORE

Each image is verified into STORE first (as ``relocverify vmlinux`` or ``elf`` would, resuming or
reusing a complete run), which gives relocverify's own verdict for every instruction; then every
instruction lands in one bucket per tracer.  Exit codes: 0 no tracer-wrong, 1 a tracer-wrong,
2 usage or input error, 3 the totals do not add up.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, TextIO

from .arguments import add_batch_options, progress_lines
from .render import escape

if TYPE_CHECKING:
    from ..tracers.run import AuditSummary


def add_parser(sub, types) -> None:
    a = sub.add_parser("audit", help="audit tracers (kprobes, optprobes, uprobes, kinst, fasttrap) over every "
                                     "instruction of an image: agree, tracer-wrong, tracer-refuses-provable, "
                                     "both-refuse, unknown")
    a.add_argument("image", nargs="?", default=None, type=types["IN_FILE"],
                   help="vmlinux, or a user-space ELF (default: the Debian 6.1 cloud kernel)")
    a.add_argument("--tracer", action="append", default=[], metavar="NAME",
                   help="a modelled tracer: kprobes@6.1, kprobes@6.12, optprobes@6.1, optprobes@6.12, uprobes@6.1, "
                        "uprobes@6.12, kinst, fasttrap, or a history version (kprobes@5.19 ...); repeatable")
    a.add_argument("--module", action="append", default=[], metavar="KO", type=types["IN_FILE"],
                   help="audit this kernel module (repeatable), laid out in module space and relocated against "
                        "IMAGE, the vmlinux it was built for")
    a.add_argument("--base", type=types["TRAMP"], default=None, metavar="ADDR",
                   help="with --module: where the first module is laid out (default 0xffffffffc0100000)")
    a.add_argument("--package", default=None, metavar="NAME|DEB|DIR",
                   help="audit a whole kernel: its vmlinux and every module (a named kernel, a linux-image .deb "
                        "or a directory, as relocverify package takes)")
    a.add_argument("--dbg", default=None, metavar="FILE.deb", type=types["IN_FILE"],
                   help="with --package DEB: its -dbg package")
    a.add_argument("--limit-modules", type=types["COUNT"], default=None, metavar="N",
                   help="with --package: only the first N modules")
    a.add_argument("--tracer-cmd", action="append", default=[], metavar="CMD",
                   help="an unmodelled tracer as a command speaking the protocol of docs/audit.md; repeatable")
    a.add_argument("--system-map", default=None, metavar="FILE", type=types["IN_FILE"],
                   help="System.map or kallsyms (a stripped vmlinux)")
    a.add_argument("--db", default=None, metavar="FILE", type=types["OUT_FILE"],
                   help="the result store (default: relocverify-<sha>.sqlite next to the image)")
    a.add_argument("--trampoline-base", type=types["TRAMP"], default=None, metavar="ADDR",
                   help="where every tracer's slot is (default: the kernel's module space, as vmlinux uses)")
    a.add_argument("--limit", type=types["COUNT"], default=None, metavar="N", help="only the first N functions")
    a.add_argument("--json", action="store_true", help="print the summary as JSON")
    from .live import add_options

    add_options(a, types, live=False)  # --running: the file of the kernel this machine runs
    add_batch_options(a, types, "also write the audit summary as JSON to FILE (exit 1 when any tracer is "
                      "tracer-wrong, 3 when the totals do not add up)", fail_on=False)
    a.set_defaults(func=command)


def command(args, out: TextIO) -> int:
    from ..errors import InputError
    from ..tracers.audit import save_summary

    if not args.tracer and not args.tracer_cmd:
        raise InputError("name at least one --tracer (e.g. --tracer kprobes@6.1) or --tracer-cmd")
    if args.package and (args.image or args.module):
        raise InputError("--package names the whole kernel: give no IMAGE or --module with it")
    if args.running:
        if args.image or args.package:
            raise InputError("audit --running: the running kernel is the image; give no IMAGE or --package")
        from .live import running_image

        line = running_image(args)
        sys.stderr.write(f"audit: {line}; its file is audited (boot-time variants as the tracer models judge "
                         f"them; one live instruction: relocverify check --running FUNCTION+OFF)\n")
    if args.module and not args.image:
        raise InputError("--module needs the vmlinux the modules were built for as IMAGE")
    if (args.module or args.package) and not args.db:
        raise InputError("--db is required with --module and --package")
    models = _models(args)
    say = None if args.no_progress else _progress()
    try:
        summary = _audit(args, models, say)
    finally:
        if say is not None:
            say.close()
    save_summary(summary.store, summary.document)
    from ..store import confirmations

    # what confirm --audit found on the running kernel (not in the saved summary)
    summary = summary.confirmed(confirmations.load(summary.store))
    if args.json:
        json.dump(summary.document, out, indent=2)
        out.write("\n")
    else:
        out.write(render(summary))
        out.write(f"store: {escape(summary.store)}\n")
    if args.summary_json:
        from ..outputs import write_atomic

        write_atomic(args.summary_json, json.dumps(summary.document, indent=2))
    if not summary.totals_add_up:
        out.write("incomplete: the totals do not add up\n")
    return exit_code(summary)


def exit_code(summary: AuditSummary) -> int:
    """3 when some tracer's totals do not add up, else 1 when some tracer is wrong about an instruction, else 0."""
    if not summary.totals_add_up:
        return 3
    return 1 if summary.any_tracer_wrong else 0


def _models(args) -> list:
    """The tracers named: the modelled ones (``--tracer``), then the commands (``--tracer-cmd``), each once."""
    from ..errors import InputError
    from ..tracers import get_model

    models = [get_model(t) for t in args.tracer]
    if args.tracer_cmd:
        from ..tracers.external import ExternalTracer

        models += [ExternalTracer(c) for c in args.tracer_cmd]
    if len({m.name for m in models}) != len(models):
        raise InputError("a tracer is named twice")
    return models


def _audit(args, models: list, say) -> AuditSummary:
    """The audit the arguments ask for (``tracers.run.audit``) of the engine's request for them: a whole
    package, modules, or one image."""
    from ..tracers.run import audit

    return audit(_request(args), models, say, progress_lines(args))


def _request(args):
    """The engine's request (``engine.requests``) the arguments name: a ``PackageRequest``, a ``ModuleRequest``,
    or one image loaded (``engine.verify.image_request``: a user-space IMAGE gets the user policy and its slot)."""
    from ..engine.requests import ModuleRequest, PackageRequest
    from ..engine.verify import image_request
    from ..plan.plan import DEFAULT_TRAMP
    from .arguments import run_options

    kernel_tramp = args.trampoline_base if args.trampoline_base is not None else DEFAULT_TRAMP
    options = run_options(args, kernel_tramp, args.limit)
    if args.package:
        return PackageRequest(args.package, options, args.db, args.dbg, args.limit_modules)
    if args.module:
        return ModuleRequest(args.module, args.image, options, args.db, args.system_map, args.base)
    return image_request(args.image, options, args.db, args.system_map, args.trampoline_base, progress_lines(args))


def render(audit: AuditSummary) -> str:
    """The audit as text: the instructions, the slot and the audit's seconds; per tracer its buckets; the
    counterexamples the CPU judged, the controls confirmed, and every tracer-wrong group with an example
    and how to replay it."""
    from ..tracers.audit import BUCKETS

    summary = audit.document
    lines = [f"{audit.instructions:,} instructions in {summary['functions']:,} functions, slot at "
             f"{summary['tramp']}; {audit.wall_s:.1f} s"]
    width = max(len(t.name) for t in audit.tracers) + 2
    lines.append(" " * width + "".join(f"{b:>25}" for b in BUCKETS))
    for t in audit.tracers:
        lines.append(f"{escape(t.name):<{width}}" + "".join(f"{t.buckets[b]:>25,}" for b in BUCKETS)
                     + ("" if t.totals_add_up else "   (totals do not add up)"))
    for name, t in summary["tracers"].items():
        cpu = t.get("cpu_replay") or {}
        if any(cpu.values()):
            lines.append(f"  {escape(name)}: counterexamples unicorn did not confirm, run on this CPU: "
                         f"{cpu['confirmed']:,} confirmed (unknown -> tracer-wrong; unknown without the CPU: "
                         f"{t['buckets']['unknown'] + cpu['confirmed']:,}), {cpu['no_difference']:,} no difference, "
                         f"{cpu['needs_guest']:,} need the guest, {cpu['not_run']:,} not run")
    for name, t in summary["tracers"].items():
        if t.get("controls"):
            c = t["controls"]
            lines.append(f"  {escape(name)}: {c['count']:,} agree controls on {escape(c['kernel'])}, "
                         f"{escape(c['accelerator'])}: " + ", ".join(f"{n} {escape(o)}" for o, n in
                                                                    sorted(c["outcomes"].items())))
    for name, t in summary["tracers"].items():
        for g in t["groups"]["tracer-wrong"]:
            ex = g["examples"][0]
            head = g["confirmed"]["label"] if g.get("confirmed") else "tracer-wrong"  # confirm --audit's outcome
            lines.append(f"  {escape(head)} {escape(name)}: {g['count']:,} x {escape(g['group'])} "
                         f"(e.g. {ex['function']} {ex['bytes']})")
            if g.get("confirmed") and g["confirmed"]["sites"]:
                lines.append("    on the running kernel: " + escape(", ".join(
                    f"{c['site']} {c['outcome']}" for c in g["confirmed"]["sites"][:4])))
            cex = g["detail"].get("counterexample")
            if cex and (g["detail"].get("answer", {}).get("block")  # replayed inside the block proof, or structural
                        or cex.get("replay_note", "").startswith("confirmed on CPU")):  # unicorn could not run it
                lines.append(f"    {escape(cex['replay_note'])}")
            elif cex:
                lines.append(f"    replay: {escape(cex['replay'])}")
    return "\n".join(lines) + "\n"


class _Progress:
    """The audit's progress under the engine's one rule (``schedule.progress.Progress``): a bar redrawn in
    place on a terminal; elsewhere (a file, a pipe, a CI log) only a closing line per phase, never a
    carriage return."""

    def __init__(self, stream=None):
        from ..schedule.progress import Progress

        self.bars = Progress(stream=stream)
        self.current = None

    def __call__(self, phase: str, done: int, total: int) -> None:
        if phase != self.current:
            self.close()
            self.current = phase
            self.bars.phase(f"audit: {phase}", total, "instructions" if phase != "modules" else "modules")
        self.bars.update(done)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self.current is not None:
            self.bars.end()
            self.current = None


def _progress(stream=None) -> _Progress:
    return _Progress(stream)
