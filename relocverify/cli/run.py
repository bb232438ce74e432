"""``relocverify run``: a real kernel function, unprobed and probed, from random inputs
(``runtime.run.run_function``; this module parses the command line and renders the report).

Exit codes: 0 no divergence, 1 a divergence (the first differing state and a
replay line), 2 an unknown function or a bad SPEC, 3 the reference run ran
out of its instruction budget or touched unmapped memory.
"""

from __future__ import annotations

import json
import shlex
from typing import TextIO

DEFAULT_TRIALS = 100


def add_parser(sub, types) -> None:
    r = sub.add_parser("run", help="run a kernel function in unicorn, unprobed and with probes, and compare")
    r.add_argument("--image", required=True, metavar="PATH", type=types["IN_FILE"], help="an ELF vmlinux or a bzImage")
    r.add_argument("--system-map", default=None, metavar="FILE", type=types["IN_FILE"], help="System.map or kallsyms for a stripped image")
    r.add_argument("--function", required=True, metavar="NAME",
                   help="the function to call: a symbol of the image, or NAME@0xADDR where static functions share NAME")
    r.add_argument("--args", default="", metavar="SPEC",
                   help="comma-separated arguments: u64, u64:LO-HI, buf:N (pointer to N random bytes), "
                        "str:N (pointer to a NUL-terminated string of at most N bytes)")
    r.add_argument("--trials", type=types["TRIALS"], default=DEFAULT_TRIALS, metavar="N",
                   help=f"random inputs to try (default {DEFAULT_TRIALS})")
    r.add_argument("--seed", type=int, default=0, metavar="N", help="trial i draws its inputs with seed N+i")
    r.add_argument("--probe-all", action="store_true",
                   help="probe every instruction of the function (default: only its first)")
    r.add_argument("--jump-probes", action="store_true",
                   help="place jump probes (a jmp rel32 over the instructions covering 5 bytes, patched by "
                        "the cross-modifying-code protocol) where the block is proved and the range safe, "
                        "int3 probes elsewhere")
    r.add_argument("--cpu-features", default=None, metavar="LIST",
                   help="CPU features for boot patching: comma-separated names, 'default', -NAME to drop one")
    r.add_argument("--budget", type=types["COUNT"], default=None, metavar="N",
                   help="instructions per call before it counts as a runaway loop (default 100000)")
    r.add_argument("--db", default=None, metavar="STORE", type=types["IN_FILE"],
                   help="take verdicts by address from this result store (still re-proved per trampoline)")
    r.add_argument("--timeout", type=types["SECONDS"], default=10.0, metavar="S", help="proof timeout per instruction")
    r.add_argument("--json", action="store_true", help="print the report as JSON")
    r.set_defaults(func=command)


def replay_line(args) -> str:
    words = ["relocverify", "run", "--image", args.image]
    if args.system_map:
        words += ["--system-map", args.system_map]
    words += ["--function", args.function, "--args", args.args]
    if args.cpu_features:
        words += ["--cpu-features", args.cpu_features]
    if args.probe_all:
        words.append("--probe-all")
    if getattr(args, "jump_probes", False):
        words.append("--jump-probes")
    return " ".join(shlex.quote(w) for w in words)


def command(args, out: TextIO) -> int:
    from ..runtime.run import run_function

    done = run_function(args.image, args.system_map, args.function, args.args, trials=args.trials, seed=args.seed,
                        probe_all=args.probe_all, jump_probes=getattr(args, "jump_probes", False),
                        cpu_features=args.cpu_features, budget=args.budget, db=args.db, timeout=args.timeout,
                        replay=replay_line(args))
    report = done.report
    if args.json:
        doc = report.as_json()
        if done.jump_summary is not None:
            doc["jump_probes"] = dict(done.jump_summary)
        json.dump(doc, out, indent=2)
        out.write("\n")
    else:
        _render(report, out)
        if done.jump_summary is not None:
            from ..runtime.jump_probes import jump_summary_lines
            out.write("".join(line + "\n" for line in jump_summary_lines(done.jump_summary)))
    if report.divergences:
        return 1
    return 3 if report.stopped else 0


def _render(report, out: TextIO) -> None:
    out.write(f"{report.function}: {report.trials} trials, {len(report.divergences)} divergences; "
              f"{report.instructions_executed:,} instructions executed, {report.probes_fired:,} probes fired "
              f"({report.probes_placed} placed, {len(report.refused)} refused)\n")
    for r in report.refused:
        out.write(f"refused {r.address:#x}: {r.verdict}: {r.reason}\n")
    for d in report.divergences[:1]:
        out.write(f"divergence in trial {d.trial}: {d.what}: unprobed {d.unprobed}, probed {d.probed}\n")
        out.write(f"replay: {d.replay}\n")
    if report.stopped:
        out.write(f"stopped: {report.stopped}\n")
