"""Benchmark: real kernel functions with every instruction probed, against unprobed runs.

    python benchmarks/bench_runtime.py [--trials 300] [--seed 1] [--function NAME ...] [VMLINUX]

For each function of ``runtime.leaf_functions`` (Debian 6.1 cloud vmlinux by
default): ``--trials`` differential trials (unprobed vs every instruction
probed; registers, memory and per-address counts compared), then a timing
pass over the same inputs without the reference's counting hook.  Prints per
function the divergences, instructions executed, probes fired, probes/s and
the fully-probed/unprobed slowdown, and the totals.  Exits 1 on a divergence.
"""

from __future__ import annotations

import argparse
import sys
import time

from relocverify.image.fetch import fetch
from relocverify.image.loader import load_image
from relocverify.runtime.args import parse_spec
from relocverify.runtime.differential import Differential, find_function
from relocverify.runtime.leaf_functions import LEAF_FUNCTIONS


def timing(diff: Differential, name: str, spec: str, trials: int, seed: int) -> tuple[float, float, int]:
    """(unprobed seconds, probed seconds, probe hits) over ``trials`` inputs, no counting hook."""
    fn = find_function(diff.image, name)
    enabled, _ = diff.probe(fn, probe_all=True)
    specs = parse_spec(spec)
    unprobed = probed = 0.0
    hits = 0
    try:
        for i in range(trials):
            regs, memory = diff.trial_inputs(specs, seed + i)
            t0 = time.perf_counter()
            diff.execute(diff.ref_runtime, fn, regs, memory, None)
            t1 = time.perf_counter()
            got = diff.execute(diff.runtime, fn, regs, memory, None)
            t2 = time.perf_counter()
            unprobed += t1 - t0
            probed += t2 - t1
            hits += sum(got.counts.values())
    finally:
        diff.unprobe(enabled)
    return unprobed, probed, hits


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("vmlinux", nargs="?", default=None)
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--function", action="append", default=None)
    args = p.parse_args()
    path = args.vmlinux or str(fetch("debian-6.1-cloud").vmlinux)
    t0 = time.perf_counter()
    diff = Differential(load_image(path))
    print(f"image and two boot-patched machines: {time.perf_counter() - t0:.1f} s")
    functions = [f for f in LEAF_FUNCTIONS if args.function is None or f.name in args.function]
    totals = dict(divergences=0, executed=0, fired=0, unprobed=0.0, probed=0.0, hits=0)
    print(f"{'function':<16} {'trials':>6} {'div':>4} {'executed':>10} {'fired':>10} {'probes/s':>9} {'slowdown':>9}")
    for f in functions:
        report = diff.run(f.name, parse_spec(f.spec), args.trials, args.seed, probe_all=True)
        unprobed, probed, hits = timing(diff, f.name, f.spec, args.trials, args.seed)
        totals["divergences"] += len(report.divergences) + len(report.refused) + bool(report.stopped)
        totals["executed"] += report.instructions_executed
        totals["fired"] += report.probes_fired
        totals["unprobed"] += unprobed
        totals["probed"] += probed
        totals["hits"] += hits
        note = f"  {report.divergences[0]}" if report.divergences else (f"  stopped: {report.stopped}"
                                                                        if report.stopped else "")
        print(f"{f.name:<16} {report.trials:>6} {len(report.divergences):>4} {report.instructions_executed:>10,} "
              f"{report.probes_fired:>10,} {hits / probed:>9,.0f} {probed / unprobed:>8.1f}x{note}")
        sys.stdout.flush()
    print(f"\n{len(functions)} functions, {args.trials} trials each: {totals['divergences']} divergences, "
          f"{totals['executed']:,} instructions executed, {totals['fired']:,} probes fired")
    print(f"probes/s (fully probed, timing pass): {totals['hits'] / totals['probed']:,.0f}; "
          f"slowdown fully-probed/unprobed: {totals['probed'] / totals['unprobed']:.1f}x "
          f"(unprobed {totals['unprobed']:.2f} s, probed {totals['probed']:.2f} s)")
    return 1 if totals["divergences"] else 0


if __name__ == "__main__":
    sys.exit(main())
