"""Benchmark: ``relocverify gate --decoder iced`` over a whole vmlinux against
``objdump -d`` of the same file, measured in one run (goal: at most 2x).

    python benchmarks/bench_gate.py [--kernel NAME | VMLINUX] [--jobs N] [--repeat K]

NAME is one of ``relocverify corpus fetch``'s kernels (default debian-6.1-amd64).
The gate runs as the CLI would (a fresh process: image loaded, every
instruction swept, each distinct byte string decoded by iced-x86 and by
capstone, compared, digested), with a baseline it writes.  objdump and the
gate alternate ``--repeat`` times; the ratio of the medians is reported, so a
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
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args(argv)
    if args.vmlinux is None:
        from relocverify.image.fetch import fetch

        args.vmlinux = fetch(args.kernel).vmlinux
    with tempfile.TemporaryDirectory() as tmp:
        gate = [sys.executable, "-m", "relocverify", "gate", "--decoder", "iced", "--image", args.vmlinux,
                "--baseline", os.path.join(tmp, "baseline.json"), "--update-baseline"]
        if args.jobs:
            gate += ["--jobs", str(args.jobs)]
        objdump_s, gate_s = [], []
        for _ in range(args.repeat):
            objdump_s.append(timed(["objdump", "-d", args.vmlinux]))
            gate_s.append(timed(gate))
    o, g = statistics.median(objdump_s), statistics.median(gate_s)
    print(json.dumps({"vmlinux": args.vmlinux, "cpus": os.cpu_count(), "objdump_s": round(o, 2),
                      "gate_s": round(g, 2), "ratio": round(g / o, 2), "goal": 2.0,
                      "runs": {"objdump": [round(x, 2) for x in objdump_s], "gate": [round(x, 2) for x in gate_s]}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
