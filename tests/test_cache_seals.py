"""The proof cache hands back only what relocverify sealed (``store.seal``): a value edited by hand, forged
without the key or copied from another cache is treated as absent and made again (issue 44: rewritten
findings turned sti and popf into exported safe probe points)."""

from __future__ import annotations

import io
import marshal
import shutil

from hypothesis import given, settings
from hypothesis import strategies as st

from relocverify import cli
from relocverify.store.cache import CachedFinding, CachedProof, ProofCache

TAG = b"tag"
GOOD = CachedFinding(False, "rejected", "sti: ...", "policy", "reject", "sti", "sti", 3)
FORGED = CachedFinding(False, "proved", "the relocated IR is the original's", "fast-path", "copy",
                       "position-independent", "sti", 3)


def _forge_segment(cache: ProofCache, findings: dict) -> None:
    """A segment written as an attacker without the key writes it: the format, no valid seal."""
    templates, entries = {}, []
    for key, f in findings.items():
        entries.append((key, templates.setdefault(f.template(), len(templates)), f.proof_us))
    blob = b"\0" * 16 + marshal.dumps((list(templates), entries))
    cache.db.execute("INSERT INTO segments (tag, entries, data) VALUES (?,?,?)", (TAG, len(entries), blob))


def test_a_forged_segment_is_not_read(tmp_path):
    cache = ProofCache(str(tmp_path))
    cache.add_findings(TAG, {b"sti": GOOD})
    _forge_segment(cache, {b"sti": FORGED})
    assert cache.findings(TAG) == {b"sti": GOOD}


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 255))
def test_any_changed_byte_voids_a_seal(tmp_path_factory, where, xor):
    cache = ProofCache(str(tmp_path_factory.mktemp("c")))
    cache.add_findings(TAG, {b"k%d" % i: GOOD for i in range(20)})
    (rowid, blob), = cache.db.execute("SELECT id, data FROM segments").fetchall()
    i = where % len(blob)
    cache.db.execute("UPDATE segments SET data=? WHERE id=?", (blob[:i] + bytes([blob[i] ^ xor]) + blob[i + 1:], rowid))
    assert cache.findings(TAG) == {}


def test_a_proof_edited_by_hand_or_from_another_cache_is_absent(tmp_path):
    a = ProofCache(str(tmp_path / "a"))
    a.add(TAG, {}, {b"key": CachedProof("rejected", "sti", "policy", 1)})
    a.db.execute("UPDATE proofs SET verdict='proved'")
    assert a.proof(TAG, b"key") is None and a.proofs(TAG) == {}
    a.close()
    b = ProofCache(str(tmp_path / "b"))
    b.add(TAG, {}, {b"key": CachedProof("rejected", "sti", "policy", 1)})
    b.close()
    shutil.copy(tmp_path / "b" / "proofs.sqlite", tmp_path / "a" / "proofs.sqlite")  # another user's cache
    assert ProofCache(str(tmp_path / "a")).proof(TAG, b"key") is None


def test_a_run_on_a_forged_cache_keeps_its_verdicts(tmp_path, monkeypatch):
    """End to end: every finding of a small kernel's cache rewritten to 'proved' by someone without the key;
    the next run into a new store gives the verdicts of the first."""
    import elfbuild
    import test_engine

    image = str(elfbuild.build_elf(tmp_path, test_engine.SMALL_ASM, test_engine.SMALL_LDS))
    monkeypatch.setenv("RELOCVERIFY_PROOF_CACHE", str(tmp_path / "cache"))

    def verdicts(db: str) -> str:
        out = io.StringIO()
        assert cli.main(["vmlinux", image, "--db", db, "--no-progress", "--fail-on", "refuted"], out, io.StringIO()) \
            in (0, 1)
        return next(line for line in out.getvalue().splitlines() if line.startswith("by verdict:"))

    first = verdicts(str(tmp_path / "one.sqlite"))
    cache = ProofCache(str(tmp_path / "cache"))
    forged = {}
    for tag, in cache.db.execute("SELECT DISTINCT tag FROM segments").fetchall():
        for key, f in cache.findings(tag).items():
            forged[key] = CachedFinding(False, "proved", "forged", "fast-path", "copy", "position-independent",
                                        f.klass, 1)
        _forge_segment_tag(cache, tag, forged)
    cache.db.execute("DELETE FROM function_rows")  # no kept rows: every finding comes from the segments
    cache.close()
    assert forged, "the run kept findings"
    assert verdicts(str(tmp_path / "two.sqlite")) == first


def _forge_segment_tag(cache: ProofCache, tag: bytes, findings: dict) -> None:
    templates, entries = {}, []
    for key, f in findings.items():
        entries.append((key, templates.setdefault(f.template(), len(templates)), f.proof_us))
    cache.db.execute("INSERT INTO segments (tag, entries, data) VALUES (?,?,?)",
                     (tag, len(entries), b"\0" * 16 + marshal.dumps((list(templates), entries))))
