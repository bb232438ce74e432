"""Every decoder's answers for the distinct byte strings, each decoded once.

Answers are cached by (decoder, version, bytes) for the life of the
process.  Large batches are split over a fork pool; an adapter's own
subprocess (objdump, an external command) then runs once per chunk.
"""

from __future__ import annotations

import os
from itertools import compress
from operator import itemgetter, not_
from typing import Sequence

from ..processes import fork_map
from ..x86.decoders.protocol import Decoder, Facts

_SECOND = itemgetter(1)
_CACHE: dict[tuple[str, str], dict[bytes, Facts]] = {}  # (decoder, version) -> bytes -> answer
_POOL_MIN = 40_000  # below this a pool costs more than it saves
_ADAPTERS: list[Decoder] = []  # read by forked workers


def answers(adapters: Sequence[Decoder], items: Sequence[tuple[int, bytes]],
            jobs: int | None = None) -> dict[str, dict[bytes, Facts]]:
    """decoder name -> bytes -> Facts, for (at least) every ``(address, bytes)`` in ``items``."""
    tables = [_CACHE.setdefault((a.name, a.version()), {}) for a in adapters]
    raws = list(map(_SECOND, items))
    work = [(k, list(compress(items, map(not_, map(table.__contains__, raws)))) if table else list(items))
            for k, table in enumerate(tables)]
    jobs = jobs or os.cpu_count() or 1
    if jobs > 1 and sum(len(m) for _, m in work) >= _POOL_MIN:
        results = _pooled(adapters, work, jobs)
    else:
        results = [(k, adapters[k].decode_many(m)) for k, m in work]
    for (k, missing), (_, facts) in zip(work, results):
        tables[k].update(zip(map(_SECOND, missing), facts))
    return {a.name: t for a, t in zip(adapters, tables)}


def remember(decoder: Decoder, facts: dict[bytes, Facts]) -> None:
    """Record answers obtained elsewhere (iced-x86's, from the image sweep) as ``decoder``'s own,
    under the key ``answers`` looks them up by."""
    _CACHE.setdefault((decoder.name, decoder.version()), {}).update(facts)


def _pooled(adapters, work, jobs):
    # Workers are forked after ``_WORK`` is set: a task names a slice, and
    # only the answers travel back, as plain tuples (the cheapest to pickle).
    _ADAPTERS[:] = adapters
    _WORK[:] = [m for _, m in work]
    chunk = max(5_000, sum(len(m) for _, m in work) // (jobs * 4))
    tasks = [(k, i, i + chunk) for k, (_, m) in enumerate(work) for i in range(0, len(m), chunk)]
    try:
        done = fork_map(_decode_chunk, tasks, jobs)
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
