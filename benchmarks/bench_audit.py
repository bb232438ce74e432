"""Benchmark: auditing tracers over a whole kernel, against a cold ``relocverify vmlinux`` of it.

    python benchmarks/bench_audit.py [--kernel NAME | VMLINUX] [--tracer T ...] [--jobs N]
                                     [--cold-seconds S]

Measures, in one run (each a separate process, wall time):

  cold      relocverify vmlinux: an empty store and an empty proof cache (the reference;
            --cold-seconds S uses a cold time measured before instead of running it)
  first     relocverify audit --tracer T: a new store, the proof cache the cold run left, no
            remembered tracer outcomes (the tracer's relocations proved, or shared with the
            engine's own proofs)
  warm      the same audit into another new store: the proof cache and the tracer outcomes warm
            (goal: <= 2x cold)
  again     the same audit into the same store (the engine's run reused from the store)

and prints the bucket counts per tracer and whether they add up.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    if proc.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-400:]}")
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("vmlinux", nargs="?", default=None)
    p.add_argument("--kernel", default="debian-6.1-cloud")
    p.add_argument("--tracer", action="append", default=None)
    p.add_argument("--jobs", default=None)
    p.add_argument("--cold-seconds", type=float, default=None)
    args = p.parse_args()
    sys.path.insert(0, ROOT)
    from relocverify.image.fetch import fetch

    vmlinux = args.vmlinux or str(fetch(args.kernel).vmlinux)
    tracers = args.tracer or ["kprobes@6.1"]
    py = [sys.executable, "-m", "relocverify"]
    jobs = ["--jobs", args.jobs] if args.jobs else []
    work = tempfile.mkdtemp(prefix="bench-audit-")
    env = dict(os.environ, PYTHONPATH=ROOT)
    try:
        cache = os.path.join(work, "cache")
        if args.cold_seconds is None:
            cold = timed(py + ["vmlinux", vmlinux, "--db", os.path.join(work, "cold.sqlite"), "--cache-dir", cache,
                               "--no-progress"] + jobs, env)
        else:
            cold = args.cold_seconds
            cache = os.environ.get("RELOCVERIFY_PROOF_CACHE") or os.path.expanduser("~/.cache/relocverify")
        audit = py + ["audit", vmlinux, "--cache-dir", cache, "--no-progress"] + jobs
        for t in tracers:
            audit += ["--tracer", t]
        first = timed(audit + ["--db", os.path.join(work, "a.sqlite")], env)
        summary = os.path.join(work, "warm.json")
        warm = timed(audit + ["--db", os.path.join(work, "b.sqlite"), "--summary-json", summary], env)
        again = timed(audit + ["--db", os.path.join(work, "b.sqlite")], env)
        doc = json.load(open(summary))
        print(f"kernel: {vmlinux}; {doc['instructions']:,} instructions; tracers: {', '.join(tracers)}")
        print(f"cold vmlinux run        {cold:8.1f} s{' (given)' if args.cold_seconds else ''}")
        print(f"audit, first            {first:8.1f} s  ({first / cold:.2f}x cold)")
        print(f"audit, warm (new store) {warm:8.1f} s  ({warm / cold:.2f}x cold; goal <= 2x)")
        print(f"audit, again (same db)  {again:8.1f} s  ({again / cold:.2f}x cold)")
        print(f"phases of the warm audit: {doc['phases']}, cases {doc['cases']:,}, {doc['counts']}")
        for name, t in doc["tracers"].items():
            print(f"  {name}: {t['buckets']} totals add up: {t['totals_add_up']}")
        return 0 if warm <= 2 * cold else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
