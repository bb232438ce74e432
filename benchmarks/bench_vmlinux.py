"""Benchmark: a whole vmlinux against ``objdump -d`` of the same file, measured in one run.

    python benchmarks/bench_vmlinux.py [--kernel NAME | VMLINUX] [--jobs N] [--repeat N] [--no-memory]
                                       [--jump-probes] [--package]

NAME is one of ``relocverify corpus fetch``'s kernels (default debian-6.1-cloud).
Prints, each as a ratio to ``objdump -d`` timed here (the goals are Engine v3's, issue 45):

  cold      an empty store and an empty proof cache          (goal <= 2.5x)
  warm      a new store, the proof cache a cold run left      (goal <= 0.7x)
  again     the cold run's command once more                   (goal <= 0.1x)
  first     the first run after an install: cold, and also an empty image index and none of
            relocverify's own compiled bytecode (pip compiles the dependencies' when it installs
            them, not an editable checkout's)                  (goal: within 10% of cold)

with the split by phase, the store's bytes per instruction (goal <= 40) and, from runs of their
own, the peak PSS of the process tree (goal <= 1 GiB; forked workers share pages, which RSS would
count once per process).  Optional rows:

  --jump-probes   ``vmlinux --jump-probes`` into a new store with the warm
                  proof cache, twice: "first" (the cache holds no jump
                  answers yet) and "warm" (it holds the first one's); each
                  one's ``jump_probes`` phase against the cold run's median
                  wall time                                      (goal <= 1x)
  --package       ``package NAME`` (the vmlinux and every module) with an
                  empty store and an empty proof cache, in seconds (goal <= 150)

How it measures.  The host this runs on varies by 10-20% from minute to minute, so ``objdump -d``
and each timed row run ``--repeat`` times (default 3), interleaved, and the ratio is of the medians
(the spread is printed).  A timed run is a bare subprocess: sampling PSS every 0.1 s (reading
``smaps_rollup`` of three 1 GB processes) took CPU from the run it measured, about 10% of a cold
run on two cores, so the peak memory comes from separate runs of the same commands
(``--no-memory`` skips them).  The image's on-disk index (``~/.cache/relocverify/index``: the
file's SHA-256 and symbols) is warm in every row, as in every earlier measurement; "cold" is the
issue's: an empty store and an empty proof cache.  relocverify's own bytecode is compiled before the
rows and again after each "first" run, which deletes it: with ``PYTHONDONTWRITEBYTECODE`` set (as in
CI and in sandboxes) Python never writes it back, and every later run compiled relocverify's modules
(0.1 s, a third of an "again" run).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
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


def timed(cmd: list[str]) -> tuple[float, int]:
    """(wall seconds, exit code) of a bare run."""
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    return time.perf_counter() - t0, rc


def peak_pss(cmd: list[str]) -> tuple[int, int]:
    """(peak PSS of the process tree, sampled every 0.1 s, exit code)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_pss_bytes(proc.pid))
        time.sleep(0.1)
    return peak, proc.returncode


def spread(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f}" if len(values) > 1 else f"{values[0]:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("vmlinux", nargs="?")
    ap.add_argument("--kernel", default="debian-6.1-cloud")
    ap.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of objdump and of each row (median)")
    ap.add_argument("--no-memory", action="store_true", help="skip the runs that sample the peak PSS")
    ap.add_argument("--jump-probes", action="store_true", help="also time the --jump-probes phase")
    ap.add_argument("--package", action="store_true", help="also time the whole package, cold")
    args = ap.parse_args()
    path = args.vmlinux
    if path is None:
        from relocverify.image.fetch import fetch

        path = fetch(args.kernel).vmlinux
    work = tempfile.mkdtemp(prefix="relocverify-bench-")

    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def bytecode() -> None:
        """relocverify's bytecode, as an installed relocverify has it (``py_compile`` writes it whatever
        ``PYTHONDONTWRITEBYTECODE`` says)."""
        compileall.compile_dir(os.path.join(package_dir, "relocverify"), quiet=1)

    def first_run(r: int) -> tuple[float, int]:
        """A cold run as the first after an install: its image index and relocverify's bytecode made anew;
        the bytecode is compiled again after it, for the next rows."""
        for root, dirs, _ in os.walk(os.path.join(package_dir, "relocverify")):
            if "__pycache__" in dirs:
                shutil.rmtree(os.path.join(root, "__pycache__"), ignore_errors=True)
        env = dict(os.environ, RELOCVERIFY_CACHE=os.path.join(work, f"home-{r}"))
        t0 = time.perf_counter()
        rc = subprocess.run(rv(f"first-{r}", f"first-{r}.sqlite"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env).returncode
        wall = time.perf_counter() - t0
        bytecode()
        return wall, rc

    def rv(tag: str, db: str, *extra: str) -> list[str]:
        return [sys.executable, "-m", "relocverify", "vmlinux", path, "--jobs", str(args.jobs), "--no-progress",
                "--cache-dir", os.path.join(work, f"cache-{tag}"), "--db", os.path.join(work, db), *extra]

    bytecode()
    objdump: list[float] = []
    walls: dict[str, list[float]] = {"cold": [], "warm": [], "again": []}
    firsts: list[float] = []
    docs: dict[str, dict] = {}
    codes: dict[str, set[int]] = {name: set() for name in [*walls, "first"]}
    for r in range(args.repeat):
        objdump.append(timed(["objdump", "-d", path])[0])
        out = {name: os.path.join(work, f"{name}-{r}.json") for name in walls}
        steps = (("cold", rv(str(r), f"cold-{r}.sqlite", "--summary-json", out["cold"])),
                 ("warm", rv(str(r), f"warm-{r}.sqlite", "--summary-json", out["warm"])),
                 ("again", rv(str(r), f"cold-{r}.sqlite", "--summary-json", out["again"])))
        for name, cmd in steps:
            wall, rc = timed(cmd)
            walls[name].append(wall)
            codes[name].add(rc)
            docs.setdefault(name, json.load(open(out[name])))
        wall, rc = first_run(r)
        firsts.append(wall)
        codes["first"].add(rc)
    base = statistics.median(objdump)
    summary = docs["cold"]
    n = summary["instructions"]
    print(f"image: {path}")
    print(f"instructions: {n:,} in {summary['functions']:,} functions   jobs: {args.jobs}   "
          f"totals add up: {summary['totals_add_up']}   timed runs: {args.repeat} each, medians")
    print(f"objdump -d:   {base:7.1f} s  ({spread(objdump)})")
    goals = {"cold": 2.5, "warm": 0.7, "again": 0.1}
    for name, values in walls.items():
        wall = statistics.median(values)
        phases = ", ".join(f"{k[:-2]} {v:.1f}" for k, v in docs[name]["run"]["phases"].items() if v >= 0.05)
        print(f"{name + ':':<13} {wall:7.1f} s = {wall / base:5.2f}x objdump (goal {goals[name]}x)  "
              f"({spread(values)} s = {min(values) / base:.2f}-{max(values) / base:.2f}x)  "
              f"exit {','.join(map(str, sorted(codes[name])))}  [first run: {phases}]")
    cold = statistics.median(walls["cold"])
    first = statistics.median(firsts)
    print(f"{'first:':<13} {first:7.1f} s = {first / base:5.2f}x objdump = {first / cold:.2f}x cold (goal 1.10x cold)  "
          f"({spread(firsts)} s)  exit {','.join(map(str, sorted(codes['first'])))}")
    pc = summary["run"]["proof_cache"]
    print(f"proof cache: {pc['keys']:,} instance keys for {n:,} instructions ({n / max(pc['keys'], 1):.0f} per key)")
    reused = docs["warm"]["run"]["proof_cache"].get("functions_reused", 0)
    cache_file = os.path.join(work, "cache-0", "proofs.sqlite")
    print(f"warm: {reused:,} of {summary['functions']:,} functions' rows copied from the proof cache "
          f"(engine.row_memo); the cache file {os.path.getsize(cache_file) / 2**20:.1f} MiB")
    size = os.path.getsize(os.path.join(work, "cold-0.sqlite"))
    print(f"store: {size / 2**20:.1f} MiB = {size / n:.1f} bytes per instruction (goal 40)")
    print("verdicts: " + ", ".join(f"{k} {v:,}" for k, v in summary["by_verdict"].items()))
    if not args.no_memory:
        peaks = {"cold": peak_pss(rv("m", "mem-cold.sqlite")), "warm": peak_pss(rv("m", "mem-warm.sqlite")),
                 "again": peak_pss(rv("m", "mem-cold.sqlite"))}
        print("peak PSS (runs of their own): " + ", ".join(f"{k} {p / 2**30:.2f} GiB (exit {rc})"
                                                             for k, (p, rc) in peaks.items()) + "  (goal 1 GiB)")
    if args.jump_probes:
        cold = statistics.median(walls["cold"])
        if not args.no_memory:  # the memory runs' own copy of a cache with no jump answers yet
            shutil.copytree(os.path.join(work, "cache-0"), os.path.join(work, "cache-jm"))
        for name in ("first", "warm"):
            out = os.path.join(work, f"jump-{name}.json")
            wall, rc = timed(rv("0", f"jump-{name}.sqlite", "--summary-json", out, "--jump-probes"))
            doc = json.load(open(out))
            phase = doc["run"]["phases"].get("jump_probes_s", 0.0)
            print(f"jump {name + ':':<7} phase {phase:7.1f} s = {phase / cold:5.2f}x the cold run (goal 1x); "
                  f"{doc['jump_probe'].get('block_proofs', 0):,} block proofs; the whole run {wall:.1f} s, exit {rc}")
        if not args.no_memory:
            first, rc1 = peak_pss(rv("jm", "jump-mem-first.sqlite", "--jump-probes"))
            again, rc2 = peak_pss(rv("jm", "jump-mem-warm.sqlite", "--jump-probes"))
            print(f"jump peak PSS (runs of their own): first {first / 2**30:.2f} GiB (exit {rc1}), "
                  f"warm {again / 2**30:.2f} GiB (exit {rc2})  (goal 1 GiB)")
    if args.package:
        name = args.kernel if args.vmlinux is None else path

        def package(tag: str) -> list[str]:
            return [sys.executable, "-m", "relocverify", "package", name, "--jobs", str(args.jobs), "--no-progress",
                    "--cache-dir", os.path.join(work, f"package-cache-{tag}"),
                    "--db", os.path.join(work, f"package-{tag}.sqlite"), "--summary-json",
                    os.path.join(work, f"package-{tag}.json")]

        wall, rc = timed(package("t"))
        doc = json.load(open(os.path.join(work, "package-t.json")))
        print(f"package cold: {wall:7.1f} s (goal 150 s), exit {rc}, {len(doc['images'])} images, "
              f"totals {doc['totals']}, add up: {doc['totals_add_up']}")
        if not args.no_memory:
            pss, rc = peak_pss(package("m"))
            print(f"package peak PSS (a run of its own): {pss / 2**30:.2f} GiB (exit {rc})  (goal 1 GiB)")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
