"""Benchmark: the false-proof generator at scale.  20,000 candidates by default, judged by this CPU.

    python benchmarks/bench_selftest.py [--pairs N] [--seed S] [--jobs N]

Prints the selftest table (per operator: generated, proved, refuted, unknown,
false proofs; the controls' share proved), the time per candidate, and how
many proved candidates the CPU judge ran (and on how many states).  Exit 1 on
any false proof.  The same run is `relocverify selftest --pairs N --seed S`;
this script adds the timing and the check that every operator got at least
500 candidates.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from relocverify.cli.selftest import render  # noqa: E402
from relocverify.selftest.run import run  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--states", type=int, default=12)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    t0 = time.perf_counter()
    done = [0]

    def progress(k, n):
        if k % 1000 == 0 or k == n:
            print(f"  {k}/{n} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
            done[0] = k

    report = run(args.pairs, seed, None, args.jobs, args.states, progress)
    elapsed = time.perf_counter() - t0
    print(render(report), end="")
    small = {name: t.generated for name, t in report.operators.items() if t.generated < 500}
    print(f"time: {elapsed:.0f} s for {args.pairs} candidates ({1000 * elapsed / args.pairs:.1f} ms each, "
          f"{args.jobs} jobs); seed {seed}")
    if small:
        print(f"operators under 500 candidates: {small}")
    return 1 if report.false_proofs or small else 0


if __name__ == "__main__":
    sys.exit(main())
