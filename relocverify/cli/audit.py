"""``relocverify audit``: what kprobes, uprobes, kinst and fasttrap do with every instruction
of an image, each relocation proved or refuted (``tracers.audit``).

    relocverify audit --tracer kprobes@6.1 --tracer kinst VMLINUX --db STORE [--summary-json F]

The image is verified into STORE first (as ``relocverify vmlinux`` or ``elf`` would, resuming or
reusing a complete run), which gives relocverify's own verdict for every instruction; then every
instruction lands in one bucket per tracer.  Exit codes: 0 no tracer-wrong, 1 a tracer-wrong,
2 usage or input error, 3 the totals do not add up.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from .arguments import add_batch_options
from ..engine.verify import user_trampoline
from .render import escape


def add_parser(sub, types) -> None:
    a = sub.add_parser("audit", help="audit tracers (kprobes, optprobes, uprobes, kinst, fasttrap) over every "
                                     "instruction of an image: agree, tracer-wrong, tracer-refuses-provable, "
                                     "both-refuse, unknown")
    a.add_argument("image", nargs="?", default=None, type=types["IN_FILE"],
                   help="vmlinux, or a user-space ELF (default: the Debian 6.1 cloud kernel)")
    a.add_argument("--tracer", action="append", default=[], metavar="NAME",
                   help="a modelled tracer: kprobes@6.1, kprobes@6.12, optprobes@6.1, optprobes@6.12, uprobes@6.1, "
                        "uprobes@6.12, kinst, fasttrap, or a history version (kprobes@5.19 ...); repeatable")
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
    add_batch_options(a, types, "also write the audit summary as JSON to FILE (exit 1 when any tracer is "
                      "tracer-wrong, 3 when the totals do not add up)", fail_on=False)
    a.set_defaults(func=command)


def command(args, out: TextIO) -> int:
    from ..engine.executors import default_jobs
    from ..engine.progress import Progress
    from ..engine.run import RunOptions, run
    from ..environment import default_proof_cache_dir
    from ..errors import InputError
    from ..image.loader import load_image
    from ..plan.plan import DEFAULT_TRAMP
    from ..x86.registers import KERNEL_HALF
    from ..tracers import get_model
    from ..tracers.audit import Auditor, audit_store, save_summary

    if not args.tracer and not args.tracer_cmd:
        raise InputError("name at least one --tracer (e.g. --tracer kprobes@6.1) or --tracer-cmd")
    models = [get_model(t) for t in args.tracer]
    if args.tracer_cmd:
        from ..tracers.external import ExternalTracer

        models += [ExternalTracer(c) for c in args.tracer_cmd]
    if len({m.name for m in models}) != len(models):
        raise InputError("a tracer is named twice")
    path = args.image
    if path is None:
        from ..image.fetch import fetch
        from .vmlinux import DEFAULT_KERNEL

        path = str(fetch(DEFAULT_KERNEL, None).vmlinux)
    image = load_image(path, args.system_map)
    kernel = any(s.address >= KERNEL_HALF for s in image.iter_executable_sections())
    if kernel:
        from ..image.loader import require_kernel

        require_kernel(image)
        tramp = args.trampoline_base if args.trampoline_base is not None else DEFAULT_TRAMP
        policy = "kernel"
    else:
        tramp, policy = user_trampoline(image, args.trampoline_base), "user"
    db = args.db or os.path.join(os.path.dirname(os.path.abspath(path)), f"relocverify-{image.identity[:12]}.sqlite")
    cache_dir = None if args.no_cache else (args.cache_dir or default_proof_cache_dir())
    options = RunOptions(tramp, args.jobs or default_jobs(), args.timeout, args.limit, kernel, cache_dir, policy)
    own = run(image, db, options, Progress(enabled=not args.no_progress))
    from ..store.store import Store

    store = Store(db, readonly=True)
    try:
        image_id = store.find_image(image.identity)
    finally:
        store.close()
    facts = image_facts(image, sites=kernel) if any(getattr(m, "per_function", False) for m in models) else None
    auditor = Auditor(models, tramp, args.timeout, cache_dir)
    say = None if args.no_progress else _progress()
    try:
        summary = audit_store(db, auditor, image_id, args.limit, say, facts)
    finally:
        auditor.close()
        if say is not None:
            sys.stderr.write("\n")
    summary["image"] = {"path": image.path, "identity": image.identity, "policy": policy}
    summary["own"] = {"by_verdict": own["by_verdict"], "instructions": own["instructions"]}
    save_summary(db, summary)
    if args.json:
        import json

        json.dump(summary, out, indent=2)
        out.write("\n")
    else:
        out.write(render(summary))
        out.write(f"store: {escape(db)}\n")
    if args.summary_json:
        import json

        from ..outputs import write_atomic

        write_atomic(args.summary_json, json.dumps(summary, indent=2))
    if not all(t["totals_add_up"] for t in summary["tracers"].values()):
        out.write("incomplete: the totals do not add up\n")
        return 3
    return 1 if any(t["buckets"]["tracer-wrong"] for t in summary["tracers"].values()) else 0


def image_facts(image, sites: bool):
    """What optprobes reads from the image: the retpoline thunk range, and every transfer into a
    range (``kernel.patch_range.PatchRanges``: one walk over every function, and the site tables)."""
    import hashlib

    from ..image.functions import find_functions
    from ..kernel.patch_range import PatchRanges
    from ..kernel.sites import find_sites
    from ..tracers.audit import ImageFacts
    from ..tracers.optprobes import entries_of

    ranges = PatchRanges(image, find_functions(image), find_sites(image) if sites else None)
    lo, hi = image.symbol_address("__indirect_thunk_start"), image.symbol_address("__indirect_thunk_end")

    def digest(start: int, size: int) -> bytes:
        return hashlib.blake2b(repr(ranges.entries_inside(start - 1, size + 1)).encode(), digest_size=12).digest()

    return ImageFacts(None if lo is None or hi is None else (lo, hi), entries_of(ranges), digest)


def render(summary: dict) -> str:
    from ..tracers.audit import BUCKETS

    lines = [f"{summary['instructions']:,} instructions in {summary['functions']:,} functions, slot at "
             f"{summary['tramp']}; {summary['wall_s']:.1f} s"]
    width = max(len(n) for n in summary["tracers"]) + 2
    lines.append(" " * width + "".join(f"{b:>25}" for b in BUCKETS))
    for name, t in summary["tracers"].items():
        lines.append(f"{escape(name):<{width}}" + "".join(f"{t['buckets'][b]:>25,}" for b in BUCKETS)
                     + ("" if t["totals_add_up"] else "   (totals do not add up)"))
    for name, t in summary["tracers"].items():
        for g in t["groups"]["tracer-wrong"]:
            ex = g["examples"][0]
            lines.append(f"  tracer-wrong {escape(name)}: {g['count']:,} x {escape(g['group'])} "
                         f"(e.g. {ex['function']} {ex['bytes']})")
            cex = g["detail"].get("counterexample")
            if cex and g["detail"].get("answer", {}).get("block"):  # replayed inside the block proof, or structural
                lines.append(f"    {escape(cex['replay_note'])}")
            elif cex:
                lines.append(f"    replay: {escape(cex['replay'])}")
    return "\n".join(lines) + "\n"


def _progress():
    def say(phase: str, done: int, total: int) -> None:
        sys.stderr.write(f"\raudit: {phase} {done:,}/{total:,}   ")
        sys.stderr.flush()

    return say
