"""Benchmark: the batch over a whole vmlinux against ``objdump -d`` of the same file.

    python benchmarks/bench_vmlinux.py [VMLINUX] [--jobs N]

Prints wall times and the ratios the batch issue sets: cold (empty store and
proof cache) <= 10x objdump, warm (a second run of the same command) <= 2x,
and peak PSS of the whole process tree <= 2 GB.  Also the "fresh rows, warm
proof cache" case: a new store seeded with the cold run's proof cache, which
re-decodes and re-plans every instruction but proves nothing again.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time


def tree_pss_bytes(pid: int) -> int:
    """Proportional set size of a process and its children: forked workers
    share the parent's pages, which RSS would count once per process."""
    total = 0
    pids = [pid]
    try:
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def timed(cmd: list[str]) -> tuple[float, int, int]:
    """(wall seconds, peak PSS of the process tree, exit code)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_pss_bytes(proc.pid))
        time.sleep(0.2)
    return time.perf_counter() - t0, peak, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("vmlinux", nargs="?")
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    args = ap.parse_args()
    path = args.vmlinux
    if path is None:
        from relocverify.batch import DEFAULT_KERNEL
        from relocverify.fetch import fetch

        path = fetch(DEFAULT_KERNEL).vmlinux
    work = tempfile.mkdtemp(prefix="relocverify-bench-")
    db = os.path.join(work, "cold.sqlite")
    rv = [sys.executable, "-m", "relocverify", "vmlinux", path, "--jobs", str(args.jobs), "--no-progress"]

    objdump_s, _, _ = timed(["objdump", "-d", path])
    cold_s, cold_rss, rc1 = timed(rv + ["--db", db, "--summary-json", os.path.join(work, "cold.json")])
    warm_s, warm_rss, rc2 = timed(rv + ["--db", db])
    seeded = os.path.join(work, "seeded.sqlite")
    shutil.copy(db, seeded)
    con = sqlite3.connect(seeded)
    con.executescript("DELETE FROM instructions; DELETE FROM functions_done; VACUUM;")
    con.close()
    seeded_s, seeded_rss, rc3 = timed(rv + ["--db", seeded])
    import json

    with open(os.path.join(work, "cold.json")) as fh:
        summary = json.load(fh)
    n = summary["instructions"]
    print(f"image: {path}")
    print(f"instructions: {n:,}   jobs: {args.jobs}")
    print(f"objdump -d:                 {objdump_s:8.1f} s")
    print(f"cold (empty store):         {cold_s:8.1f} s  = {cold_s / objdump_s:5.1f}x objdump  "
          f"({n / cold_s:,.0f} insn/s)  peak PSS {cold_rss / 2**30:.2f} GB  exit {rc1}")
    print(f"warm (same command again):  {warm_s:8.1f} s  = {warm_s / objdump_s:5.1f}x objdump  "
          f"peak PSS {warm_rss / 2**30:.2f} GB  exit {rc2}")
    print(f"fresh rows, warm cache:     {seeded_s:8.1f} s  = {seeded_s / objdump_s:5.1f}x objdump  "
          f"({n / seeded_s:,.0f} insn/s)  peak PSS {seeded_rss / 2**30:.2f} GB  exit {rc3}")
    print("verdicts: " + ", ".join(f"{k} {v:,}" for k, v in summary["by_verdict"].items()))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
