"""Functions' rows kept in the proof cache (``engine.row_memo``).

A run into a new store that copies the rows a run kept must store what a run that walks every
function would: every field of every instruction, every variant, every function's counts.  The
key must change with every input the rows depend on, and a kept value that does not fit (another
store's reason for an outcome, a damaged value, an outcome the cache cannot name) must make the
function be walked, never be copied wrongly."""

from __future__ import annotations

import dataclasses
import functools
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relocverify.engine.row_memo import (
    context_digest,
    function_key,
    kept_rows,
    unpack_rows,
)
from relocverify.engine.run import RunOptions, run
from relocverify.errors import ImageError
from relocverify.image.fetch import fetch
from relocverify.image.loader import load_image
from relocverify.kernel.sites import Site
from relocverify.store.packed_rows import pack_u32, unpack_u32
from relocverify.store.store import Results, Store

TRAMP = 0xFFFFFFFFC0001000
LIMIT = 1500  # the kernel's first functions: fentry, alternatives, jump labels, static calls, retpolines


@pytest.fixture(scope="module")
def cloud_image():
    return load_image(fetch("debian-6.1-cloud").vmlinux)


def _run(image, db, cache, reuse=True, jobs=2):
    return run(image, str(db), RunOptions(TRAMP, jobs, 10.0, LIMIT, True, str(cache), reuse_rows=reuse))


def _stored(db, proof_times=True) -> tuple[dict, dict, dict]:
    """Every row (all fields, by address), every live variant and every function's counts of a store."""
    store = Results(str(db))
    try:
        image = store.find_image()
        starts = {f.id: f.start for f in store.iter_functions(image)}
        rows = {}
        for r in store.iter_rows(image):
            rows[r.address] = r if proof_times else dataclasses.replace(r, proof_us=0)
        variants = {(starts[fid], off): v for (fid, off), v in store.image_variants(image).items()}
        counts = {f.start: c for f, c in store.function_counts(image)}
        return rows, variants, counts
    finally:
        store.close()


@pytest.mark.slow
def test_copied_rows_are_the_rows_a_walk_writes(cloud_image, tmp_path):
    """The kernel's first functions, cold, then into new stores from the warm cache: walked (no reuse)
    and copied.  Everything stored is the same; the proof times too when one worker made each proof
    (with two, a key both proved is cached with the later time, while a kept row has its own)."""
    cache = tmp_path / "cache"
    for jobs in (1, 2):
        cold = _run(cloud_image, tmp_path / f"cold{jobs}.sqlite", cache / str(jobs), jobs=jobs)
        walked = _run(cloud_image, tmp_path / f"walked{jobs}.sqlite", cache / str(jobs), reuse=False, jobs=jobs)
        copied = _run(cloud_image, tmp_path / f"copied{jobs}.sqlite", cache / str(jobs), jobs=jobs)
        assert cold["run"]["proof_cache"]["proved"] > 0 and walked["run"]["proof_cache"]["proved"] == 0
        assert walked["run"]["proof_cache"]["functions_reused"] == 0
        assert copied["run"]["proof_cache"]["functions_reused"] == copied["functions"] == LIMIT
        assert copied["by_verdict"] == walked["by_verdict"] == cold["by_verdict"]
        a = _stored(tmp_path / f"walked{jobs}.sqlite", proof_times=jobs == 1)
        b = _stored(tmp_path / f"copied{jobs}.sqlite", proof_times=jobs == 1)
        assert a[0] == b[0] and a[1] == b[1] and a[2] == b[2]
        assert len(a[0]) == copied["instructions"] and a[1]
        assert {s for r in a[0].values() for s in r.sites} >= {"fentry", "alternative", "jump_label"}


@pytest.mark.slow
def test_rows_that_do_not_fit_are_walked(cloud_image, tmp_path):
    """A store that already holds every outcome under other words, a damaged kept value, an outcome
    digest the cache lost: those functions are walked, and the store holds what a walk writes.

    One worker throughout, and the damage done to rows a walk kept: an outcome's reason is the first
    its worker met (an alternative's variants differ in their cpuid number only), and a kept function
    that names an outcome under other words than the store's is walked too.  With one worker the
    functions come in one order, so a damaged function walked defines an outcome with the reason its
    kept rows had; rows kept by the run into the store that says otherwise would not."""
    cache = tmp_path / "cache"
    run1 = functools.partial(_run, jobs=1)
    run1(cloud_image, tmp_path / "cold.sqlite", cache)
    run1(cloud_image, tmp_path / "walked.sqlite", cache, reuse=False)
    expected = _stored(tmp_path / "walked.sqlite")

    proofs = cache / "proofs.sqlite"
    db = sqlite3.connect(proofs, isolation_level=None)
    keys = [k for (k,) in db.execute("SELECT key FROM function_rows ORDER BY key")]
    db.execute("UPDATE function_rows SET data = x'00ff' WHERE key = ?", (keys[0],))
    db.execute("UPDATE function_rows SET data = substr(data, 1, length(data) / 2) WHERE key = ?", (keys[1],))
    db.close()
    summary = run1(cloud_image, tmp_path / "damaged.sqlite", cache)
    assert summary["run"]["proof_cache"]["functions_reused"] == LIMIT - 2
    assert _stored(tmp_path / "damaged.sqlite") == expected

    other = tmp_path / "other.sqlite"
    Store(str(other)).close()
    db = sqlite3.connect(other, isolation_level=None)
    db.execute("ATTACH ? AS w", (str(tmp_path / "walked.sqlite"),))
    db.execute("INSERT INTO outcomes (verdict, method, plan_kind, rule, klass, reason_key, reason) "
               "SELECT verdict, method, plan_kind, rule, klass, reason_key, reason || ' (said otherwise)' "
               "FROM w.outcomes")
    db.close()
    summary = run1(cloud_image, other, cache)
    assert summary["run"]["proof_cache"]["functions_reused"] == 0
    assert _stored(other) == expected

    db = sqlite3.connect(proofs, isolation_level=None)
    db.execute("DELETE FROM row_outcomes")
    db.close()
    summary = run1(cloud_image, tmp_path / "unnamed.sqlite", cache)
    assert summary["run"]["proof_cache"]["functions_reused"] == 0
    assert _stored(tmp_path / "unnamed.sqlite") == expected
    # walking them kept them again, with their outcomes named
    assert run1(cloud_image, tmp_path / "again.sqlite", cache)["run"]["proof_cache"]["functions_reused"] == LIMIT


# --- the key follows every input ---------------------------------------------------------------------


class _Image:
    """What ``function_key`` reads of an image: an alternative's replacement bytes."""

    def __init__(self, memory: dict[int, bytes]):
        self.memory = memory

    def read(self, address: int, size: int) -> bytes:
        if address not in self.memory:
            raise ImageError(f"no section maps {size} bytes at {address:#x}")
        return self.memory[address][:size]


_START = 0xFFFFFFFF81000000
_DATA = bytes.fromhex("e800000000" "55" "4889e5" "f0ff4710" "0f1f440000" "5d" "c3")
_SITES = [Site("fentry", _START, 5), Site("alternative", _START + 9, 5, "", 0xFFFFFFFF82000000, 4, 0x1D),
          Site("jump_label", _START + 13, 5, "key", _START + 19, None, 1), Site("smp_lock", _START + 9, 1)]
_MEMORY = {0xFFFFFFFF82000000: bytes.fromhex("0f0b9090")}
_SIZE = len(_DATA)


def _key(context=b"c" * 16, start=_START, size=_SIZE, data=_DATA, skip=(), sites=_SITES, memory=_MEMORY):
    return function_key(context, start, size, data, set(skip), sites, _Image(memory))


_FIELD_CHANGES = {"kind": lambda v: "static_call", "address": lambda v: v + 1, "length": lambda v: v + 1,
                  "detail": lambda v: v + "!", "target": lambda v: (v or 0) + 1,
                  "target_length": lambda v: (v or 0) + 1, "tag": lambda v: (v or 0) ^ 2}


def test_every_site_field_has_a_change_here():
    assert set(_FIELD_CHANGES) == set(Site._fields)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_key_changes_with_every_input(data):
    """One input changed, anywhere: another key.  The same inputs: the same key."""
    base = _key()
    assert _key() == base
    change = data.draw(st.sampled_from(["context", "start", "size", "byte", "skip", "site", "replacement",
                                        "no sites", "one site fewer"]))
    if change == "context":
        other = _key(context=data.draw(st.binary(min_size=16, max_size=16).filter(lambda c: c != b"c" * 16)))
    elif change == "start":
        other = _key(start=_START + data.draw(st.integers(1, 1 << 20)))
    elif change == "size":
        other = _key(size=len(_DATA) + data.draw(st.integers(1, 64)))
    elif change == "byte":
        i = data.draw(st.integers(0, len(_DATA) - 1))
        flipped = bytearray(_DATA)
        flipped[i] ^= data.draw(st.integers(1, 255))
        other = _key(data=bytes(flipped))
    elif change == "skip":
        other = _key(skip=[_START + data.draw(st.integers(0, len(_DATA) - 1))])
    elif change == "site":
        i = data.draw(st.integers(0, len(_SITES) - 1))
        name = data.draw(st.sampled_from(sorted(_FIELD_CHANGES)))
        changed = _SITES[i]._replace(**{name: _FIELD_CHANGES[name](getattr(_SITES[i], name))})
        other = _key(sites=_SITES[:i] + [changed] + _SITES[i + 1:])
    elif change == "replacement":
        repl = bytearray(_MEMORY[0xFFFFFFFF82000000])
        repl[data.draw(st.integers(0, 3))] ^= data.draw(st.integers(1, 255))
        other = _key(memory={0xFFFFFFFF82000000: bytes(repl)})
    elif change == "no sites":
        other = _key(sites=None)
    else:
        gone = data.draw(st.integers(0, len(_SITES) - 1))
        other = _key(sites=[s for j, s in enumerate(_SITES) if j != gone])
    assert other != base


def test_the_context_follows_every_run_input():
    args = {"tag": b"t" * 24, "source": b"s" * 32, "tramp": TRAMP, "timeout_s": 10.0, "with_sites": True,
            "thunks": {0xFFFFFFFF81E00000: "rax"}}
    base = context_digest(**args)
    changes = {"tag": b"u" * 24, "source": b"z" * 32, "tramp": TRAMP + 64, "timeout_s": 10.5, "with_sites": False,
               "thunks": {0xFFFFFFFF81E00000: "rbx"}}
    assert context_digest(**args) == base
    for name, value in changes.items():
        assert context_digest(**(args | {name: value})) != base, name


def test_kept_rows_are_as_a_warm_run_writes_them():
    """A fresh row's bit is cleared; a row kept out of the packed rows only by its counterexample joins them,
    in offset order, its site mask with the others; other rows stay full; the packed columns round-trip."""
    import struct

    data = struct.pack("<9I", 0, 5 | 16 | 0 << 5, 7, 5, 1, 3, 9, 3 | 16 | 1 << 5, 11)
    sites = pack_u32([0, 4, 9, 8])
    counts, variants = pack_u32([3, 2, 0]), pack_u32([9, 0, 2])
    full = [(6, 3, 1, None, 40, 2, None, True),  # only its counterexample kept it full: it joins, mask 2
            (12, 1, 0, "its own reason", 2, None, None, False),
            (14, 2, 0, None, 3, 8, '{"iced": "x"}', True)]  # answers keep it full
    value = kept_rows(5, b"A" * 8 + b"B" * 8 + b"C" * 8, counts, ["fentry: nop5"], variants, sites, data, True,
                      full, [(9, "retpoline: call *%rax", 1, "its own")])
    n, digests, kept_counts, names, kept_variants, kept_sites, kept_data, kept_full, reasoned = unpack_rows(value)
    assert (n, digests, kept_counts, names, kept_variants) == (5, [b"A" * 8, b"B" * 8, b"C" * 8], counts,
                                                              ("fentry: nop5",), variants)
    assert list(struct.iter_unpack("<III", kept_data)) == [(0, 5, 7), (5, 1, 3), (6, 3 | 1 << 5, 40),
                                                           (9, 3 | 1 << 5, 11)]
    assert list(unpack_u32(kept_sites)) == [0, 4, 6, 2, 9, 8]
    assert kept_full == [(12, 1, 0, "its own reason", 2, None, None), (14, 2, 0, None, 3, 8, '{"iced": "x"}')]
    assert reasoned == [(9, "retpoline: call *%rax", 1, "its own")]
    assert unpack_rows(value[:-3]) is None and unpack_rows(b"junk") is None


@pytest.mark.slow
def test_a_copying_run_killed_resumes_to_the_rows_and_seals_of_an_uninterrupted_one(tmp_path):
    """kill -9 while the workers copy the kernel's rows from the proof cache into their shards (each copied
    function sealed by its worker, ``engine.row_keeper``); the next run merges what they finished, copies the
    rest, and the store holds what an uninterrupted copying run writes, every seal as its rows give it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from relocverify.store.shard import leftover_shards

    vmlinux = fetch("debian-6.1-cloud").vmlinux
    base = [sys.executable, "-m", "relocverify", "vmlinux", vmlinux, "--jobs", "2", "--no-progress", "--cache-dir",
            str(tmp_path / "cache")]
    assert subprocess.run(base + ["--db", str(tmp_path / "cold.sqlite")], capture_output=True).returncode == 0
    killed, clean = tmp_path / "killed.sqlite", tmp_path / "clean.sqlite"
    proc = subprocess.Popen(base + ["--db", str(killed)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and not _copied_in_shards(killed):
        time.sleep(0.01)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert leftover_shards(str(killed))
    assert subprocess.run(base + ["--db", str(killed)], capture_output=True).returncode == 0
    assert subprocess.run(base + ["--db", str(clean)], capture_output=True).returncode == 0
    assert not leftover_shards(str(killed))
    assert _stored(killed, proof_times=False) == _stored(clean, proof_times=False)
    for db in killed, clean:
        store = Results(str(db))
        try:
            store.check_seals()
        finally:
            store.close()


def _copied_in_shards(db) -> bool:
    """Whether a worker's shard next to the store holds a function it copied and sealed."""
    from relocverify.store.shard import leftover_shards

    for path in leftover_shards(str(db)):
        try:
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                if con.execute("SELECT count(*) FROM seals").fetchone()[0]:
                    return True
            finally:
                con.close()
        except sqlite3.Error:
            pass
    return False
