"""Benchmark: ``relocverify gate --decoder iced`` over a whole vmlinux against
``objdump -d`` of the same file, measured in one run (goal: at most 2x).

    python benchmarks/bench_gate.py [--kernel NAME | VMLINUX] [--decoder NAME ...] [--jobs N] [--repeat K]

NAME is one of ``relocverify corpus fetch``'s kernels (default debian-6.1-amd64).
The gate runs as the CLI would (a fresh process: image loaded, every
instruction swept, each distinct byte string decoded by the decoder under
test and by the consensus (capstone and iced-x86, less the one under test),
compared, digested), with a baseline it writes.  ``--decoder`` is repeatable,
one row each (default ``iced``); the linux-insn row is
``--kernel debian-6.1-cloud --decoder linux-insn@6.1``: the kernel's own
decoder, built once before timing (its build is cached), then every
instruction through it, capstone and iced-x86.  objdump and each gate row
alternate ``--repeat`` times; the ratio of the medians is reported, so a
busy machine slows both alike.  Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("vmlinux", nargs="?", default=None)
    p.add_argument("--kernel", default="debian-6.1-amd64")
    p.add_argument("--decoder", action="append", default=None, metavar="NAME",
                   help="the decoder under test; repeatable, one row each (default iced)")
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args(argv)
    decoders = args.decoder or ["iced"]
    if args.vmlinux is None:
        from relocverify.image.fetch import fetch

        args.vmlinux = fetch(args.kernel).vmlinux
    for name in decoders:  # build what needs building (linux-insn@) outside the timing
        from relocverify.x86.decoders.adapters import get_adapter

        get_adapter(name)
    with tempfile.TemporaryDirectory() as tmp:
        gates = {}
        for name in decoders:
            gates[name] = [sys.executable, "-m", "relocverify", "gate", "--decoder", name, "--image", args.vmlinux,
                           "--baseline", os.path.join(tmp, "baseline.json"), "--update-baseline"]
            if args.jobs:
                gates[name] += ["--jobs", str(args.jobs)]
        objdump_s, gate_s = [], {name: [] for name in decoders}
        for _ in range(args.repeat):
            for name, command in gates.items():
                objdump_s.append(timed(["objdump", "-d", args.vmlinux]))
                gate_s[name].append(timed(command))
    o = statistics.median(objdump_s)
    rows = [{"decoder": name, "gate_s": round(statistics.median(runs), 2),
             "ratio": round(statistics.median(runs) / o, 2), "runs": [round(x, 2) for x in runs]}
            for name, runs in gate_s.items()]
    print(json.dumps({"vmlinux": args.vmlinux, "cpus": os.cpu_count(), "objdump_s": round(o, 2),
                      "gate_s": rows[0]["gate_s"], "ratio": rows[0]["ratio"], "goal": 2.0, "rows": rows,
                      "runs": {"objdump": [round(x, 2) for x in objdump_s], "gate": rows[0]["runs"]}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
