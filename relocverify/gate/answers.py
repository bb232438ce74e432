"""Every decoder's answers for the distinct byte strings, each decoded once.

Answers are cached by (decoder, version, bytes) for the life of the
process.  Large batches are split over a fork pool; an adapter's own
subprocess (objdump, an external command) then runs once per chunk.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Sequence

from ..x86.decoders.protocol import Adapter, Facts

_CACHE: dict[tuple[str, str, bytes], Facts] = {}
_POOL_MIN = 40_000  # below this a pool costs more than it saves
_ADAPTERS: list[Adapter] = []  # read by forked workers


def answers(adapters: Sequence[Adapter], items: Sequence[tuple[int, bytes]],
            jobs: int | None = None) -> dict[str, dict[bytes, Facts]]:
    """decoder name -> bytes -> Facts, for every ``(address, bytes)`` in ``items``."""
    out: dict[str, dict[bytes, Facts]] = {}
    work: list[tuple[int, list[tuple[int, bytes]]]] = []
    keys = []
    for k, adapter in enumerate(adapters):
        version = adapter.version()
        keys.append(version)
        known = out[adapter.name] = {}
        missing = []
        for address, raw in items:
            hit = _CACHE.get((adapter.name, version, raw))
            if hit is None:
                missing.append((address, raw))
            else:
                known[raw] = hit
        work.append((k, missing))
    jobs = jobs or os.cpu_count() or 1
    total = sum(len(m) for _, m in work)
    if jobs > 1 and total >= _POOL_MIN:
        results = _pooled(adapters, work, jobs)
    else:
        results = [(k, adapters[k].decode_many(m)) for k, m in work]
    for (k, missing), (_, facts) in zip(work, results):
        adapter = adapters[k]
        known = out[adapter.name]
        for (_, raw), f in zip(missing, facts):
            known[raw] = f
            _CACHE[(adapter.name, keys[k], raw)] = f
    return out


def remember(name: str, version: str, facts: dict[bytes, Facts]) -> None:
    """Record answers obtained elsewhere (iced-x86's, from the image sweep) as the adapter's own."""
    for raw, f in facts.items():
        _CACHE[(name, version, raw)] = f


def _pooled(adapters, work, jobs):
    # Workers are forked after ``_WORK`` is set: a task names a slice, and
    # only the answers travel back, as plain tuples (the cheapest to pickle).
    _ADAPTERS[:] = adapters
    _WORK[:] = [m for _, m in work]
    chunk = max(5_000, sum(len(m) for _, m in work) // (jobs * 4))
    tasks = [(k, i, i + chunk) for k, (_, m) in enumerate(work) for i in range(0, len(m), chunk)]
    try:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            done = pool.map(_decode_chunk, tasks, chunksize=1)
    finally:
        _WORK.clear()
    merged: dict[int, list[Facts]] = {k: [] for k in range(len(work))}
    make = Facts._make
    for (k, _, _), facts in zip(tasks, done):
        merged[k] += map(make, facts)
    return [(k, merged[i]) for i, (k, _) in enumerate(work)]


_WORK: list = []


def _decode_chunk(task):
    k, start, end = task
    return [tuple(f) for f in _ADAPTERS[k].decode_many(_WORK[k][start:end])]
