"""The proof cache's bound (issue 43: ``proofs.sqlite`` grew to 1.4 GB in a day, one generation of 52 live):
runs of generated sizes write generations of rows, and re-read older ones; after each run closes the cache the
rows in use fit the limit unless the run itself used more, a generation the run used is kept, the ones dropped
are the least recently used, and what was dropped reads back as absent, never as another value."""

from __future__ import annotations

import os
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relocverify.store import cache_usage
from relocverify.store.cache import CachedProof, ProofCache

KB = 1024


def _run(directory: str, limit: int, write: dict[int, int], read: list[int], clock: list[int], monkeypatch):
    """One run: generation g's rows written (``write``: g -> KiB) and generations read, then the cache closed."""
    def tick() -> int:  # every use a moment of its own: no two generations tie
        clock[0] += 1
        return clock[0]

    monkeypatch.setattr(cache_usage.time, "time", tick)
    cache = ProofCache(directory)
    cache.usage.limit = limit
    for g in read:
        cache.function_rows([_key(g, i) for i in range(4)])
        cache.proof(_tag(g), b"k")
    for g, kib in write.items():
        rows = {_key(g, i): (_context(g), os.urandom(kib * KB // 4)) for i in range(4)}
        cache.add_function_rows(rows, {})
        cache.add(_tag(g), {}, {b"k": CachedProof("proved", f"generation {g}", "smt", 1)})
    used = {bytes(c) for k, c in cache.usage.used if k == "context"}
    cache.close()
    return used


def _key(g: int, i: int) -> bytes:
    return f"key-{g}-{i}".encode()


def _context(g: int) -> bytes:
    return f"context-{g}".encode()


def _tag(g: int) -> bytes:
    return f"tag-{g}".encode()


def _in_use(directory: str) -> tuple[int, set[bytes], dict[bytes, int]]:
    db = sqlite3.connect(os.path.join(directory, "proofs.sqlite"))
    try:
        usage = cache_usage.Usage(db)
        contexts = {bytes(c) for (c,) in db.execute("SELECT DISTINCT context FROM function_rows")}
        used = {bytes(n): t for k, n, t in db.execute("SELECT kind, name, used FROM usage") if k == "context"}
        return usage.in_use_bytes(), contexts, used
    finally:
        db.close()


@settings(max_examples=10, deadline=None)
@given(runs=st.lists(st.tuples(st.dictionaries(st.integers(0, 11), st.integers(16, 160), min_size=1, max_size=2),
                               st.lists(st.integers(0, 11), max_size=2)), min_size=3, max_size=9),
       limit_kib=st.integers(300, 900))
def test_every_run_leaves_the_cache_within_its_bound(tmp_path_factory, runs, limit_kib):
    with pytest.MonkeyPatch.context() as monkeypatch:
        _runs(str(tmp_path_factory.mktemp("bound")), runs, limit_kib, monkeypatch)


def _runs(directory, runs, limit_kib, monkeypatch):
    limit = limit_kib * KB
    clock = [1_000_000]
    written: set[int] = set()
    size: dict[bytes, int] = {}  # a generation's rows, as last written
    for write, read in runs:
        _, before, used_before = _in_use(directory) if written else (0, set(), {})
        used = _run(directory, limit, write, read, clock, monkeypatch)
        written |= set(write)
        size.update({_context(g): kib * KB for g, kib in write.items()})
        in_use, contexts, when = _in_use(directory)
        assert used <= contexts  # what this run used is kept
        own = sum(size[c] for c in used)  # what the run used may be more than the limit: it is kept
        assert in_use <= max(limit, own + 64 * KB) + 128 * KB, (in_use, limit, own)  # pages beyond the rows
        dropped = before - contexts
        if dropped:  # the least recently used went first
            kept_older = [c for c in contexts - used if used_before.get(c, 0) < max(used_before.get(d, 0) for d in dropped)]
            assert not kept_older, (dropped, kept_older)
        cache = ProofCache(directory)
        try:
            for g in written:  # a dropped generation reads as absent, a kept one as what was written
                rows = cache.function_rows([_key(g, i) for i in range(4)])
                proof = cache.proof(_tag(g), b"k")
                assert (len(rows) == 4) == (_context(g) in contexts)
                assert proof is None or proof.reason == f"generation {g}"
        finally:
            cache.usage.wrote = False  # a reader: no trim
            cache.close()


def test_a_cache_from_before_the_bound_opens_and_its_rows_go_first(tmp_path, monkeypatch):
    """A cache written before ``usage`` existed: opened as it is, its unrecorded generations the oldest."""
    directory = str(tmp_path)
    clock = [1_000_000]
    _run(directory, 1 << 30, {0: 200, 1: 200}, [], clock, monkeypatch)
    db = sqlite3.connect(os.path.join(directory, "proofs.sqlite"))
    db.execute("DROP TABLE usage")
    db.commit()
    db.close()
    _run(directory, 1 << 30, {2: 200}, [], clock, monkeypatch)  # opens; records generation 2 only
    _run(directory, 450 * KB, {3: 100}, [2], clock, monkeypatch)
    _, contexts, _ = _in_use(directory)
    assert _context(0) not in contexts and _context(2) in contexts and _context(3) in contexts


def test_the_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("RELOCVERIFY_CACHE_LIMIT_MB", "64")
    assert cache_usage.limit_from_environment() == 64 << 20
    for bad in ("", "x", "-1", "0", "1e300", "nan"):
        monkeypatch.setenv("RELOCVERIFY_CACHE_LIMIT_MB", bad)
        assert cache_usage.limit_from_environment() == cache_usage.LIMIT
