"""``relocverify confirm``: boot the package's kernel under QEMU, place the real tracer's probe at a site,
run a trigger, and say what happened (``confirm.confirmation``).

    relocverify confirm --package debian-6.1-cloud --tracer kprobes --site dcache_readdir+0x8f \\
        --cmdline spectre_v2=retpoline [--optimized on|off] [--json] [--trigger PROGRAM [ARGS...]]

Per site: reproduced, not-reproduced, not-executed, refused or patched-at-boot, with its evidence
and the console lines that show it.  Exit codes: 0 nothing reproduced and nothing patched at
boot, 1 a site reproduced or patched at boot, 2 usage or input error (a package without a
kernel, a site outside the text, a trigger that hangs or floods the console, QEMU missing).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from .render import escape


def add_parser(sub, types) -> None:
    c = sub.add_parser("confirm", help="boot the package's kernel under QEMU, place the real tracer's probe at a "
                                       "site, run a trigger: reproduced, not-reproduced, not-executed, refused or "
                                       "patched-at-boot")
    c.add_argument("--package", required=True, metavar="NAME|DEB|DIR",
                   help="the kernel: a named kernel (debian-6.1-cloud), a linux-image .deb or a directory")
    c.add_argument("--dbg", default=None, metavar="DEB", type=types["IN_FILE"],
                   help="with --package DEB: its -dbg package (the vmlinux with symbols)")
    c.add_argument("--tracer", default=None, metavar="T",
                   help="kprobes (int3; optimized with --optimized on), optprobes (kprobes optimized), uprobes; "
                        "a version suffix (kprobes@6.1) is the audit's name for the same tracer; with --audit, "
                        "only that tracer's groups")
    c.add_argument("--site", action="append", default=[], metavar="LOCATION",
                   help="where to probe: FUNCTION+0xOFF, 0xADDR, kprobe:FUNCTION+28, MODULE:FUNCTION+0xOFF "
                        "(repeatable); for uprobes, in the program --elf names (or the shipped trigger's)")
    c.add_argument("--audit", default=None, metavar="STORE", type=types["IN_FILE"],
                   help="confirm every tracer-wrong group of the audit stored in STORE (its STORE.audit.json) "
                        "instead of --site; the results are also written to STORE.confirm.json")
    c.add_argument("--groups", nargs="+", default=["all"], metavar="all|NAME",
                   help="with --audit: only the groups whose name contains one of these words (default all)")
    c.add_argument("--controls", type=types["COUNT"], default=0, metavar="N",
                   help="with --audit: also N sites per kernel tracer the audit calls agree, in functions the "
                        "syscalls trigger runs, probed all at once: each must come out not-reproduced")
    c.add_argument("--cmdline", default="", metavar="WORDS",
                   help="kernel command line words added to every boot, e.g. 'spectre_v2=retpoline'")
    c.add_argument("--elf", default=None, metavar="PROGRAM", type=types["IN_FILE"],
                   help="uprobes: the statically linked program the sites are in (run as the trigger unless "
                        "--trigger says otherwise)")
    c.add_argument("--module-trigger", default=None, metavar="FILE.ko", type=types["IN_FILE"],
                   help="a test module built for this kernel, loaded in both boots before the probe (its sites are "
                        "MODULE:FUNCTION+0xOFF; the trigger then exercises it, e.g. --trigger reading its /proc file)")
    c.add_argument("--optimized", choices=("on", "off"), default=None,
                   help="kprobes: debug.kprobes-optimization (default off for kprobes, on for optprobes)")
    c.add_argument("--via", choices=("events", "module"), default="events",
                   help="kprobes: place the probe through kprobe_events (default) or a module's register_kprobe")
    c.add_argument("--trigger-timeout", type=types["SECONDS"], default=20.0, metavar="S",
                   help="how long the trigger may run in the guest (default 20)")
    c.add_argument("--boot-timeout", type=types["SECONDS"], default=90.0, metavar="S",
                   help="how long a boot may take besides the trigger (default 90)")
    c.add_argument("--smp", type=types["COUNT"], default=1, metavar="N",
                   help="the guest's CPUs (default 1: a uniprocessor boot rewrites the .smp_locks LOCK prefixes "
                        "to DS, so such a site is patched-at-boot)")
    c.add_argument("--accel", choices=("auto", "tcg", "kvm"), default="auto",
                   help="QEMU's accelerator: auto is KVM only where a short boot ran a kernel-mode int3 under it "
                        "(remembered per host boot), else TCG")
    c.add_argument("--json", action="store_true", help="print every site's confirmation as JSON")
    c.add_argument("--trigger", nargs=argparse.REMAINDER, default=[], metavar="PROGRAM [ARGS...]",
                   help="what makes the site run: a shipped trigger by name (syscalls, strlen) or a statically "
                        "linked program and its arguments (default: the shipped trigger for the tracer); "
                        "give it last, it takes every argument after it")
    c.set_defaults(func=command)


def command(args, out: TextIO) -> int:
    from ..confirm import qemu
    from ..confirm.confirmation import Request, check_request, confirm
    from ..confirm.guest import build_guest
    from ..confirm.outcome import Outcome

    if args.audit:
        return _audit(args, out)
    if args.tracer is None:
        from ..errors import InputError

        raise InputError("name the tracer: --tracer kprobes, optprobes or uprobes (or give --audit STORE)")
    tracer = args.tracer.split("@", 1)[0]
    request = Request(tracer=tracer, sites=tuple(args.site), cmdline=args.cmdline, trigger=tuple(args.trigger),
                      elf=args.elf, optimized=None if args.optimized is None else args.optimized == "on",
                      via=args.via, trigger_timeout_s=max(1, int(args.trigger_timeout)),
                      boot_timeout_s=args.boot_timeout, accel=args.accel, cpus=args.smp,
                      module_trigger=args.module_trigger)
    check_request(request)
    qemu.find_qemu()  # both before anything is built
    say = None if args.json else (lambda line: print(escape(line), file=sys.stderr, flush=True))
    guest = build_guest(args.package, args.dbg, say=say)
    results = confirm(request, guest, say=say)
    if args.json:
        json.dump([r.as_json() for r in results], out, indent=1)
        out.write("\n")
    else:
        for r in results:
            out.write(render(r))
    found = any(r.outcome in (Outcome.REPRODUCED, Outcome.PATCHED_AT_BOOT) for r in results)
    return 1 if found else 0


def _audit(args, out: TextIO) -> int:
    from ..confirm import qemu
    from ..confirm.confirmation import Request
    from ..confirm.groups import confirm_audit, load_summary
    from ..confirm.guest import build_guest
    from ..confirm.outcome import Outcome
    from ..errors import InputError

    if args.site:
        raise InputError("--audit confirms the audit's groups: give no --site with it")
    load_summary(args.audit)  # before anything is built
    qemu.find_qemu()
    say = None if args.json else (lambda line: print(escape(line), file=sys.stderr, flush=True))
    guest = build_guest(args.package, args.dbg, say=say)
    base = Request(tracer="kprobes", sites=("-",), cmdline=args.cmdline,
                   optimized=None if args.optimized is None else args.optimized == "on",
                   trigger_timeout_s=max(1, int(args.trigger_timeout)), boot_timeout_s=args.boot_timeout,
                   accel=args.accel, cpus=args.smp)
    names = () if args.groups == ["all"] else tuple(args.groups)
    tracers = (args.tracer,) if args.tracer else ()
    results = confirm_audit(args.audit, guest, base, names, args.controls, tracers, say=say)
    if args.json:
        json.dump([r.as_json() for r in results], out, indent=1)
        out.write("\n")
    else:
        for r in results:
            out.write(render_group(r))
    found = any(r.bucket == "tracer-wrong" and r.outcome in (Outcome.REPRODUCED, Outcome.PATCHED_AT_BOOT)
                or r.bucket == "agree" and r.outcome not in (None, Outcome.NOT_EXECUTED, Outcome.NOT_REPRODUCED)
                for r in results)
    return 1 if found else 0


def render_group(r) -> str:
    outcome = r.outcome.label if r.outcome is not None else "no site confirmed"
    lines = [f"{r.tracer} {r.bucket} '{r.group}' ({r.count:,}): {outcome}"]
    if r.note:
        lines.append(f"  {r.note}")
    if r.bucket == "agree":
        counts: dict[str, int] = {}
        for c in r.confirmations:
            counts[c.outcome.label] = counts.get(c.outcome.label, 0) + 1
        lines.append("  " + ", ".join(f"{n} {label}" for label, n in sorted(counts.items())))
        lines += [f"  {c.site.where}: {c.outcome.label}: {c.decision.evidence}" for c in r.confirmations
                  if c.outcome.label not in ("not-reproduced", "not-executed")]
        return "\n".join(escape(line) for line in lines) + "\n"
    text = "\n".join(escape(line) for line in lines) + "\n"
    return text + "".join("  " + render(c).replace("\n", "\n  ").rstrip(" ") for c in r.confirmations)


def render(r) -> str:
    d, s = r.decision, r.site
    how = "" if r.tracer == "uprobes" else (" optimized" if r.optimized else " not optimized")
    lines = [f"{s.where} ({s.address:#x}: {s.file_bytes.hex(' ')}) {r.tracer}{how}: {d.outcome.label}",
             f"  {d.evidence}"]
    facts = [f"hits {d.hits if d.hits is not None else '?'}"]
    if d.optimized is not None:
        facts.append("listed [OPTIMIZED]" if d.optimized else "listed as an int3 kprobe")
    if d.live is not None:
        facts.append(f"live bytes {d.live.hex()}" + (" (the file's)" if d.live.startswith(s.file_bytes) else ""))
    base, mine = r.baseline.console.trigger, r.probed.console.trigger
    if base is not None:
        facts.append(f"without the probe the trigger {base.describe()}" +
                     (f", with it the trigger {mine.describe()}" if mine is not None else ", with it no report"))
    lines.append("  " + "; ".join(facts))
    for p in r.predictions:  # the optprobes models against kprobes/list
        said = "[OPTIMIZED]" if p.optimized else "not optimized" if p.optimized is False else "no answer"
        agrees = {True: "agrees with kprobes/list", False: "DISAGREES with kprobes/list", None: ""}[
            p.agrees(d.optimized)]
        said = p.why if p.why.startswith("not optimized") else said + ("" if p.optimized else f" ({p.why})")
        lines.append(f"  model {p.model}: {said}"
                     + (f"; {agrees}" if agrees else ""))
    if d.excerpt:
        lines.append("  console:")
        lines += [f"    {line}" for line in d.excerpt]
    lines.append(f"  boots: {r.baseline.seconds:.1f} s without the probe, {r.probed.seconds:.1f} s with it, at once "
                 f"({r.probed.accel}: {r.accel_why}); command line: {r.probed.cmdline}")
    lines.append(f"  trigger: {' '.join(r.trigger)}")
    return "\n".join(escape(line) for line in lines) + "\n"
