"""The persistent proof cache's findings: segments appended per harvest, compacted without losing
the newest finding of a key, and without rewriting a large old segment for every few new ones."""

from __future__ import annotations

import random

from relocverify.store.cache import COMPACT_AFTER, CachedFinding, ProofCache, _merge_from

TAG = b"test-tag"


def _finding(i: int) -> CachedFinding:
    return CachedFinding(False, "proved", f"reason {i % 7}", "fast-path", "copy", "copy", "plain", i)


def _segments(cache: ProofCache) -> list[tuple[int, int]]:
    return cache.db.execute("SELECT id, entries FROM segments WHERE tag=? ORDER BY id", (TAG,)).fetchall()


def test_later_findings_win_through_every_compaction(tmp_path):
    rng = random.Random(7)
    cache = ProofCache(str(tmp_path))
    expected: dict[bytes, CachedFinding] = {}
    for round_ in range(60):
        batch = {}
        for _ in range(rng.choice((1, 5, 40, 300))):
            key = b"k%d" % rng.randrange(2000)
            batch[key] = _finding(round_ * 10_000 + rng.randrange(1000))
        cache.add_findings(TAG, batch)
        expected.update(batch)
        assert len(_segments(cache)) <= COMPACT_AFTER + 1
    assert cache.findings(TAG) == expected
    cache.close()
    assert ProofCache(str(tmp_path)).findings(TAG) == expected  # as a later run reads it


def test_a_large_old_segment_is_not_rewritten(tmp_path):
    cache = ProofCache(str(tmp_path))
    cache.add_findings(TAG, {b"base%d" % i: _finding(i) for i in range(5000)})
    base_id = _segments(cache)[0][0]
    for round_ in range(3 * COMPACT_AFTER):
        cache.add_findings(TAG, {b"new%d" % round_: _finding(round_)})
    segments = _segments(cache)
    assert segments[0] == (base_id, 5000)  # compactions merged only the small segments after it
    assert len(segments) <= COMPACT_AFTER + 1
    assert len(cache.findings(TAG)) == 5000 + 3 * COMPACT_AFTER


def test_merge_from_keeps_every_segment_that_outweighs_its_successors():
    assert _merge_from([(1, 1000), (2, 10), (3, 10)]) == 1
    assert _merge_from([(1, 10), (2, 10), (3, 10)]) == 0
    assert _merge_from([(1, 1000), (2, 100), (3, 10), (4, 1)]) == 3  # halving sizes: only the newest
    assert _merge_from([]) == 0


def test_a_damaged_segment_loses_only_its_own_findings(tmp_path):
    cache = ProofCache(str(tmp_path))
    cache.add_findings(TAG, {b"a": _finding(1)})
    cache.add_findings(TAG, {b"b": _finding(2)})
    first = _segments(cache)[0][0]
    cache.db.execute("UPDATE segments SET data = ? WHERE id = ?", (b"\x00not marshal", first))
    assert cache.findings(TAG) == {b"b": _finding(2)}


# -- jump answers (engine.jumps.JumpMemory) ------------------------------------------------------------

def _jump_batch(rng: random.Random) -> dict[tuple, object]:
    batch: dict[tuple, object] = {}
    for _ in range(rng.choice((1, 5, 40, 300))):
        kind = rng.choice("psb")
        token = b"j-token-%d" % rng.randrange(50)
        if kind == "p":
            batch[("p", (token, rng.random() < 0.5))] = rng.random() < 0.9
        elif kind == "s":
            batch[("s", token)] = b"piece|%d" % rng.randrange(60)  # a few tokens meet two piece keys
        else:
            batch[("b", b"block|%d" % rng.randrange(100))] = ("eligible", "fast path")
    return batch


def test_jump_answers_merge_the_same_through_every_compaction(tmp_path):
    """Segments of jump answers, read back after any number of compactions, are what merging the
    batches in order gives (``merge_jump_entries``): a piece's False is never undone, and a branch
    token seen standing for a second piece key makes both of its pieces fail for good."""
    from relocverify.store.cache import merge_jump_entries

    rng = random.Random(11)
    cache = ProofCache(str(tmp_path))
    expected: dict[tuple, object] = {}
    conflicts = 0
    for _ in range(60):
        batch = _jump_batch(rng)
        cache.add_jump_entries(TAG, batch)
        conflicts += merge_jump_entries(expected, batch)
        assert cache.db.execute("SELECT count(*) FROM jump_segments").fetchone()[0] <= COMPACT_AFTER + 1
    assert conflicts > 0  # the generator does make tokens that stand for two piece keys
    assert cache.jump_entries(TAG) == expected
    cache.close()
    assert ProofCache(str(tmp_path)).jump_entries(TAG) == expected
    assert ProofCache(str(tmp_path)).jump_entries(b"another tag") == {}


def test_a_token_standing_for_two_piece_keys_fails_its_pieces():
    from relocverify.store.cache import merge_jump_entries

    kept = {("s", b"t"): b"piece|1", ("p", (b"t", True)): True, ("p", (b"t", False)): True}
    assert merge_jump_entries(kept, {("s", b"t"): b"piece|1"}) == 0 and kept[("p", (b"t", True))] is True
    assert merge_jump_entries(kept, {("s", b"t"): b"piece|2", ("p", (b"t", True)): True}) == 1
    assert kept[("p", (b"t", True))] is False and kept[("p", (b"t", False))] is False
    assert kept[("s", b"t")] == b"piece|1"  # the first piece key stays the one the token stood for


def test_a_damaged_jump_segment_is_skipped(tmp_path):
    cache = ProofCache(str(tmp_path))
    cache.add_jump_entries(TAG, {("p", b"piece|1"): True})
    cache.db.execute("INSERT INTO jump_segments (tag, entries, data) VALUES (?, 1, ?)", (TAG, b"\x00garbage"))
    cache.add_jump_entries(TAG, {("p", b"piece|2"): False})
    assert cache.jump_entries(TAG) == {("p", b"piece|1"): True, ("p", b"piece|2"): False}
