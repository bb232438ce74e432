"""Benchmark: a whole vmlinux against ``objdump -d`` of the same file, measured in one run.

    python benchmarks/bench_vmlinux.py [--kernel NAME | VMLINUX] [--jobs N] [--jump-probes] [--package]

NAME is one of ``relocverify corpus fetch``'s kernels (default debian-6.1-cloud).
Prints, each as a ratio to ``objdump -d`` timed here first (the goals are
Performance II's):

  cold      an empty store and an empty proof cache          (goal <= 3x)
  warm      a new store, the proof cache the cold run left     (goal <= 1x)
  again     the cold run's command once more                   (goal <= 0.2x)

with the split by phase, the peak PSS of the process tree (goal <= 1 GiB;
forked workers share pages, which RSS would count once per process) and
the store's bytes per instruction (goal <= 40).  Optional rows:

  --jump-probes   ``vmlinux --jump-probes`` into a new store with the warm
                  proof cache, twice: "first" (the cache holds no jump
                  answers yet) and "warm" (it holds the first one's); each
                  one's ``jump_probes`` phase against the cold run's whole
                  wall time                                      (goal <= 1x)
  --package       ``package NAME`` (the vmlinux and every module) with an
                  empty store and an empty proof cache, in seconds (goal <= 180)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def tree_pss_bytes(pid: int) -> int:
    """Proportional set size of a process and its children."""
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
        time.sleep(0.1)
    return time.perf_counter() - t0, peak, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("vmlinux", nargs="?")
    ap.add_argument("--kernel", default="debian-6.1-cloud")
    ap.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--jump-probes", action="store_true", help="also time the --jump-probes phase")
    ap.add_argument("--package", action="store_true", help="also time the whole package, cold")
    args = ap.parse_args()
    path = args.vmlinux
    if path is None:
        from relocverify.image.fetch import fetch

        path = fetch(args.kernel).vmlinux
    work = tempfile.mkdtemp(prefix="relocverify-bench-")
    rv = [sys.executable, "-m", "relocverify", "vmlinux", path, "--jobs", str(args.jobs), "--no-progress",
          "--cache-dir", os.path.join(work, "cache")]
    cold_db, warm_db = os.path.join(work, "cold.sqlite"), os.path.join(work, "warm.sqlite")

    objdump_s, _, _ = timed(["objdump", "-d", path])
    runs = {}
    for name, db in (("cold", cold_db), ("warm", warm_db), ("again", cold_db)):
        out = os.path.join(work, f"{name}.json")
        runs[name] = timed(rv + ["--db", db, "--summary-json", out]) + (json.load(open(out)),)
    summary = runs["cold"][3]
    n = summary["instructions"]
    print(f"image: {path}")
    print(f"instructions: {n:,} in {summary['functions']:,} functions   jobs: {args.jobs}   "
          f"totals add up: {summary['totals_add_up']}")
    print(f"objdump -d:   {objdump_s:7.1f} s")
    goals = {"cold": 3, "warm": 1, "again": 0.2}
    for name, (wall, pss, rc, s) in runs.items():
        phases = ", ".join(f"{k[:-2]} {v:.1f}" for k, v in s["run"]["phases"].items() if v >= 0.05)
        print(f"{name + ':':<13} {wall:7.1f} s = {wall / objdump_s:5.2f}x objdump (goal {goals[name]}x)  "
              f"peak PSS {pss / 2**30:.2f} GiB (goal 1)  exit {rc}  [{phases}]")
    pc = runs["cold"][3]["run"]["proof_cache"]
    print(f"proof cache: {pc['keys']:,} instance keys for {n:,} instructions "
          f"({n / max(pc['keys'], 1):.0f} per key)")
    reused = runs["warm"][3]["run"]["proof_cache"].get("functions_reused", 0)
    cache_file = os.path.join(work, "cache", "proofs.sqlite")
    print(f"warm: {reused:,} of {summary['functions']:,} functions' rows copied from the proof cache "
          f"(engine.row_memo); the cache file {os.path.getsize(cache_file) / 2**20:.1f} MiB")
    size = os.path.getsize(cold_db)
    print(f"store: {size / 2**20:.1f} MiB = {size / n:.1f} bytes per instruction (goal 40)")
    print("verdicts: " + ", ".join(f"{k} {v:,}" for k, v in summary["by_verdict"].items()))
    if args.jump_probes:
        for name in ("first", "warm"):
            out = os.path.join(work, f"jump-{name}.json")
            wall, pss, rc = timed(rv + ["--db", os.path.join(work, f"jump-{name}.sqlite"), "--summary-json", out,
                                        "--jump-probes"])
            doc = json.load(open(out))
            phase = doc["run"]["phases"].get("jump_probes_s", 0.0)
            print(f"jump {name + ':':<7} phase {phase:7.1f} s = {phase / runs['cold'][0]:5.2f}x the cold run (goal 1x); "
                  f"{doc['jump_probe'].get('block_proofs', 0):,} block proofs; the whole run {wall:.1f} s, "
                  f"peak PSS {pss / 2**30:.2f} GiB, exit {rc}")
    if args.package:
        name = args.kernel if args.vmlinux is None else path
        out = os.path.join(work, "package.json")
        wall, pss, rc = timed([sys.executable, "-m", "relocverify", "package", name, "--jobs", str(args.jobs),
                               "--no-progress", "--cache-dir", os.path.join(work, "package-cache"),
                               "--db", os.path.join(work, "package.sqlite"), "--summary-json", out])
        doc = json.load(open(out))
        print(f"package cold: {wall:7.1f} s (goal 180 s), peak PSS {pss / 2**30:.2f} GiB, exit {rc}, "
              f"{len(doc['images'])} images, totals {doc['totals']}, add up: {doc['totals_add_up']}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
