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
    c.add_argument("--tracer", required=True, metavar="T",
                   help="kprobes (int3; optimized with --optimized on), optprobes (kprobes optimized), uprobes; "
                        "a version suffix (kprobes@6.1) is the audit's name for the same tracer")
    c.add_argument("--site", action="append", default=[], metavar="LOCATION",
                   help="where to probe: FUNCTION+0xOFF, 0xADDR, kprobe:FUNCTION+28 (repeatable); for uprobes, "
                        "in the program --elf names (or the shipped trigger's)")
    c.add_argument("--cmdline", default="", metavar="WORDS",
                   help="kernel command line words added to every boot, e.g. 'spectre_v2=retpoline'")
    c.add_argument("--elf", default=None, metavar="PROGRAM", type=types["IN_FILE"],
                   help="uprobes: the statically linked program the sites are in (run as the trigger unless "
                        "--trigger says otherwise)")
    c.add_argument("--optimized", choices=("on", "off"), default=None,
                   help="kprobes: debug.kprobes-optimization (default off for kprobes, on for optprobes)")
    c.add_argument("--via", choices=("events", "module"), default="events",
                   help="kprobes: place the probe through kprobe_events (default) or a module's register_kprobe")
    c.add_argument("--trigger-timeout", type=types["SECONDS"], default=20.0, metavar="S",
                   help="how long the trigger may run in the guest (default 20)")
    c.add_argument("--boot-timeout", type=types["SECONDS"], default=90.0, metavar="S",
                   help="how long a boot may take besides the trigger (default 90)")
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

    tracer = args.tracer.split("@", 1)[0]
    request = Request(tracer=tracer, sites=tuple(args.site), cmdline=args.cmdline, trigger=tuple(args.trigger),
                      elf=args.elf, optimized=None if args.optimized is None else args.optimized == "on",
                      via=args.via, trigger_timeout_s=max(1, int(args.trigger_timeout)),
                      boot_timeout_s=args.boot_timeout, accel=args.accel)
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


def render(r) -> str:
    d, s = r.decision, r.site
    how = "" if r.tracer == "uprobes" else (" optimized" if r.optimized else " not optimized")
    lines = [f"{s.where} ({s.address:#x}: {s.file_bytes.hex(' ')}) {r.tracer}{how}: {d.outcome.label}",
             f"  {d.evidence}"]
    facts = [f"hits {d.hits if d.hits is not None else '?'}"]
    if d.optimized is not None:
        facts.append("listed [OPTIMIZED]" if d.optimized else "listed as an int3 kprobe")
    if d.live is not None:
        facts.append(f"live bytes {d.live.hex()}" + (" (the file's)" if d.live == s.file_bytes else ""))
    base, mine = r.baseline.console.trigger, r.probed.console.trigger
    if base is not None:
        facts.append(f"without the probe the trigger {base.describe()}" +
                     (f", with it the trigger {mine.describe()}" if mine is not None else ", with it no report"))
    lines.append("  " + "; ".join(facts))
    if d.excerpt:
        lines.append("  console:")
        lines += [f"    {line}" for line in d.excerpt]
    lines.append(f"  boots: {r.baseline.seconds:.1f} s without the probe, {r.probed.seconds:.1f} s with it, at once "
                 f"({r.probed.accel}: {r.accel_why}); command line: {r.probed.cmdline}")
    lines.append(f"  trigger: {' '.join(r.trigger)}")
    return "\n".join(escape(line) for line in lines) + "\n"
