"""Benchmark: instructions per second against the number of workers, local pool and Dask.

    python benchmarks/bench_scaling.py [--kernel NAME] [--limit N] [--workers 1,2]

Each configuration verifies the kernel's first ``N`` functions cold (an empty
store and an empty proof cache, so the proofs are part of the work), in this
process, one after the other:

  local-1, local-2, ...   the embedded process pool with that many workers
  dask-1, dask-2, ...     a Dask LocalCluster with that many worker processes

and prints instructions/s, the speed-up against the one-worker run of the
same engine measured here, and the scaling efficiency (speed-up / workers).
Dask's wall time includes starting the cluster and each worker loading the
image itself, which a long run amortises; its ``setup`` column says how much.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

TRAMP = 0xFFFFFFFFC0001000


def main() -> int:
    from relocverify.engine.run import RunOptions, run
    from relocverify.image.fetch import fetch
    from relocverify.image.loader import load_image

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", default="debian-6.1-cloud")
    ap.add_argument("--limit", type=int, default=2000, help="functions (default 2000)")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--engines", default="local,dask")
    args = ap.parse_args()
    image = load_image(fetch(args.kernel).vmlinux)
    counts = [int(w) for w in args.workers.split(",")]
    rows = []
    for engine in args.engines.split(","):
        base = None
        for n in counts:
            with tempfile.TemporaryDirectory() as d:
                options = RunOptions(TRAMP, n, 10.0, args.limit, True, os.path.join(d, "cache"),
                                     dask_local=n if engine == "dask" else None)
                t0 = time.perf_counter()
                summary = run(image, os.path.join(d, "store.sqlite"), options)
                wall = time.perf_counter() - t0
            insns = summary["instructions"]
            rate = insns / wall
            base = base or rate
            speedup = rate / base
            phases = summary["run"]["phases"]
            setup = phases.get("setup_s", 0.0)
            rows.append((f"{engine}-{n}", insns, wall, rate, speedup, speedup / n, setup,
                         summary["run"]["proof_cache"]["proved"], summary["totals_add_up"]))
            print(f"{engine}-{n}: {insns:,} instructions in {wall:.1f} s = {rate:,.0f}/s; speed-up {speedup:.2f}, "
                  f"efficiency {speedup / n:.2f}; {summary['run']['proof_cache']['proved']:,} proofs; "
                  f"phases {phases}", flush=True)
    print("\n| run | instructions | wall s | insn/s | speed-up | efficiency | proofs | totals add up |")
    print("|---|---|---|---|---|---|---|---|")
    for name, insns, wall, rate, speedup, eff, setup, proofs, ok in rows:
        print(f"| {name} | {insns:,} | {wall:.1f} | {rate:,.0f} | {speedup:.2f} | {eff:.2f} | {proofs:,} | {ok} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
