"""Benchmark: time per verdict, over the bundled corpus and a random sample of a real kernel.

    python benchmarks/bench_proofs.py [--sample 10000] [--seed 1] [VMLINUX]

Every proof here is made fresh (no proof cache).  Prints the median and p90
time per verdict, the share of ``proved`` among relocatable plans, and the
reasons of every ``opaque`` and ``unknown`` verdict with their counts.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter, defaultdict

from relocverify.plan.plan import PlanKind, make_plan
from relocverify.proof.prove import prove_plan
from relocverify.x86.decode import decode

TRAMP = 0xFFFFFFFFC0001000


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def report(title: str, results: list[tuple[str, str, float, bool]]) -> None:
    by = defaultdict(list)
    for verdict, _, seconds, _ in results:
        by[verdict].append(seconds * 1000)
    print(f"\n== {title}: {len(results):,} instructions")
    for verdict, times in sorted(by.items()):
        print(f"  {verdict:<9} n={len(times):>6,}  median {statistics.median(times):8.3f} ms  "
              f"p90 {pct(times, 0.9):8.3f} ms  max {max(times):9.3f} ms")
    relocatable = [r for r in results if r[3]]
    proved = sum(1 for r in relocatable if r[0] == "proved")
    print(f"  proved among relocatable plans: {proved:,}/{len(relocatable):,} "
          f"({100.0 * proved / max(len(relocatable), 1):.2f}%)")
    for verdict in ("opaque", "unknown", "refuted"):
        reasons = Counter(r[1] for r in results if r[0] == verdict)
        for reason, n in reasons.most_common():
            print(f"  {verdict:<8} {n:>6,}  {reason[:150]}")


def run_one(raw: bytes, at: int, tramp: int):
    t0 = time.perf_counter()
    d = decode(raw, at)
    plan = make_plan(d, tramp)
    r = prove_plan(d, plan)
    return r.verdict.value, r.reason, time.perf_counter() - t0, plan.kind is not PlanKind.REJECT


def corpus_entries():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "corpora" / "instructions.toml"
    doc = tomllib.loads(root.read_text())
    for e in doc.get("entry", doc.get("entries", [])):
        yield bytes.fromhex(e["hex"].replace(" ", "")), int(str(e.get("at", "0xffffffff81234560")), 0), \
            int(str(e.get("tramp", hex(TRAMP))), 0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("vmlinux", nargs="?")
    ap.add_argument("--sample", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    results = [run_one(raw, at, t) for raw, at, t in corpus_entries()]
    report("bundled corpus (corpora/instructions.toml)", results)

    from relocverify.image.functions import find_functions, iter_instruction_spans
    from relocverify.image.loader import load_image

    path = args.vmlinux
    if path is None:
        from relocverify.engine.verify import DEFAULT_KERNEL
        from relocverify.image.fetch import fetch

        path = fetch(DEFAULT_KERNEL).vmlinux
    image = load_image(path)
    spans = [s for f in find_functions(image) if f.section == ".text" for s in iter_instruction_spans(image, f)]
    rng = random.Random(args.seed)
    sample = rng.sample(spans, args.sample)
    t0 = time.perf_counter()
    results = [run_one(raw, at, TRAMP) for at, raw in sample]
    report(f"random sample of {path} .text (seed {args.seed}), {time.perf_counter() - t0:.1f} s", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
