"""The persistent proof cache: verdicts reused across runs, stores and images.

One SQLite file, ``proofs.sqlite`` in the cache directory (``--cache-dir``,
else ``$RELOCVERIFY_CACHE`` or ``~/.cache/relocverify``).  Every row is
filed under a tag, the versions of every tool and the policy table's digest
(``proof.cache_key.cache_tag``), so a verdict is only ever reused under the
same tools and the same policy:

  proofs       full key (``proof.cache_key.cache_key``) -> a reusable verdict
  derivations  instance key (``engine.keys``) -> the full key it determines
               (what ``tests/test_cache.py`` checks; kept for audit)
  segments     instance key -> the finding of every instruction with that key,
               appended in segments, one per run, each a ``marshal`` blob:
               a warm run loads 100 k findings in a few tens of milliseconds,
               where one row each took a second
  jump_segments  what the jump-probe phase learned (``engine.jumps.JumpMemory``):
               the answers of block pieces and fast-path block proofs under
               their position-independent keys, and which piece key each
               branch token stood for; segments as above, merged by
               ``merge_jump_entries``, under the jump tag (``engine.jumps.jump_tag``:
               the proof tag and the digest of relocverify's own source)
  function_rows  a function's rows under the digest of everything they depend on
               (``engine.row_memo``), as a run on a warm cache writes them: a later
               run into any store copies them instead of walking the function
  row_outcomes  what the outcome digests those rows name stand for (an outcome's
               fields and reason)
  site_indexes  an image's kernel sites (``kernel.sites.SiteIndex``), under the digest
               of the image and relocverify's source (``engine.site_memo``)

Every value is sealed (``store.seal``: a keyed BLAKE2b MAC, the key in ``proofs.key`` beside the file, bound
to the value's tag or key); one whose seal does not match (edited, forged, from another cache or from before
seals) is absent: proved again and written again sealed.  ``proof_seals`` holds the seals of ``proofs``.

Why an instance key may stand for its finding: it determines the full key
(tested), and a full key determines a reusable verdict (the argument is in
``proof.cache_key``).  A key marked ``per_instance`` has no shareable
finding: its instructions are proved one by one.

The file is written by a run's parent, except ``function_rows`` and
``row_outcomes``, which each worker writes in transactions of its own (SQLite
lets one writer in at a time; the others wait, up to a minute).  A segment
that does not load is ignored with the others kept: deleting the file, or
any part of it, loses nothing but time.  The blobs are only ever read from
the user's own cache directory; ``marshal`` is not meant for data from
elsewhere.
"""

from __future__ import annotations

import marshal
import os
import sqlite3
import stat
from dataclasses import dataclass, fields
from operator import attrgetter
from urllib.parse import quote

from ..environment import default_cache_dir, unusable_directory
from ..errors import StoreError
from .cache_usage import SCHEMA as USAGE_SCHEMA, Usage
from .seal import Seal

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS proofs (
    tag BLOB NOT NULL, key BLOB NOT NULL, verdict TEXT NOT NULL, reason TEXT NOT NULL, method TEXT NOT NULL,
    proof_us INTEGER NOT NULL, PRIMARY KEY (tag, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS derivations (
    tag BLOB NOT NULL, key BLOB NOT NULL, full_key BLOB, PRIMARY KEY (tag, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS segments (id INTEGER PRIMARY KEY, tag BLOB NOT NULL, entries INTEGER NOT NULL,
    data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS jump_segments (id INTEGER PRIMARY KEY, tag BLOB NOT NULL, entries INTEGER NOT NULL,
    data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS function_rows (key BLOB PRIMARY KEY, context BLOB NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS row_outcomes (digest BLOB PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS site_indexes (key BLOB PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS proof_seals (tag BLOB NOT NULL, key BLOB NOT NULL, seal BLOB NOT NULL,
    PRIMARY KEY (tag, key)) WITHOUT ROWID;
"""
CACHE_SCHEMA = "2"
FILE_NAME = "proofs.sqlite"
#: SQLite's application_id of a relocverify proof cache ('RVPC'): how the file says what it is.
APPLICATION_ID = 0x52565043
_TABLES = frozenset({"meta", "proofs", "derivations", "segments", "jump_segments", "function_rows", "row_outcomes",
                     "site_indexes", "proof_seals", "usage"})
_OLDER_TABLES = (frozenset({"meta", "proofs", "derivations", "segments"}),  # before jump answers were kept
                 frozenset({"meta", "proofs", "derivations", "segments", "jump_segments"}),  # before rows were
                 _TABLES - {"site_indexes", "proof_seals"},  # before sites were
                 _TABLES - {"proof_seals", "usage"},  # before seals were
                 _TABLES - {"usage"})  # before the cache was bounded (``cache_usage``)
ROWS_BATCH = 500  # function keys asked for in one query (SQLite allows 32,766 parameters)
COMPACT_AFTER = 16  # segments under one tag before they are merged into one

__all__ = ["CachedFinding", "CachedProof", "ProofCache", "default_cache_dir", "merge_jump_entries"]


@dataclass(frozen=True)
class CachedFinding:
    """What the cache holds for an instance key."""

    per_instance: bool
    verdict: str = ""
    reason: str = ""
    method: str = ""
    plan_kind: str = ""
    rule: str = ""
    klass: str = ""
    proof_us: int = 0
    answers: str | None = None

    def template(self) -> tuple:
        return (self.per_instance, self.verdict, self.reason, self.method, self.plan_kind, self.rule, self.klass,
                self.answers)

    def __reduce__(self):  # its fields by position: a cold kernel run sends 40 thousand between processes
        return CachedFinding, _FINDING_FIELDS(self)


@dataclass(frozen=True)
class CachedProof:
    verdict: str
    reason: str
    method: str
    proof_us: int

    def __reduce__(self):  # its fields by position (see ``CachedFinding.__reduce__``)
        return CachedProof, _PROOF_FIELDS(self)


# Every field, in order (a new one travels by itself), in one C call.
_FINDING_FIELDS = attrgetter(*[f.name for f in fields(CachedFinding)])
_PROOF_FIELDS = attrgetter(*[f.name for f in fields(CachedProof)])


def _refuse_foreign(path: str) -> None:
    """Refuse, untouched, a ``proofs.sqlite`` that is not a relocverify proof cache: another program's
    database, a result store, any other file.  Ours carry ``APPLICATION_ID`` (older ones: exactly our
    tables, and a ``schema`` row in ``meta``)."""
    if not os.path.exists(path):
        return
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"{path}: not a regular file; pass --cache-dir elsewhere or --no-cache")
    if st.st_size == 0:
        return
    with open(path, "rb") as fh:
        head = fh.read(100)
    if not head.startswith(b"SQLite format 3\x00"):
        raise StoreError(f"{path}: not a relocverify proof cache (not an SQLite file), left untouched; pass "
                         f"--cache-dir elsewhere or --no-cache")
    app = int.from_bytes(head[68:72], "big")
    if app == APPLICATION_ID:
        return
    try:
        con = sqlite3.connect(f"file:{quote(os.fsencode(path))}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            meta = dict(con.execute("SELECT key, value FROM meta")) if "meta" in tables else {}
        finally:
            con.close()
    except sqlite3.DatabaseError:
        tables, meta = set(), {}
    ours = tables == _TABLES or tables in _OLDER_TABLES
    if app != 0 or not ours or "schema" not in meta or "application" in meta:
        raise StoreError(f"{path}: another program's SQLite file (or a result store), not a relocverify proof "
                         f"cache; left untouched: pass --cache-dir elsewhere or --no-cache")


class ProofLookup:
    """``get(key)`` over one tag of a ``ProofCache``, one query per key."""

    def __init__(self, cache: "ProofCache", tag: bytes):
        self.cache, self.tag = cache, tag

    def get(self, key: bytes, default=None):
        hit = self.cache.proof(self.tag, key)
        return default if hit is None else hit


class ProofCache:
    """The cache file, or nothing (``directory=None``: ``--no-cache``)."""

    def __init__(self, directory: str | None):
        self.directory = directory
        self.path = None if directory is None else os.path.join(directory, FILE_NAME)
        self.db = None
        self.seal: Seal | None = None
        self.usage: Usage | None = None  # when each generation of rows was last used; the bound (``cache_usage``)
        if self.path is None:
            return
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"the proof cache's directory: {unusable_directory(directory, exc)}: name a directory "
                             f"with RELOCVERIFY_PROOF_CACHE (or a batch command's --cache-dir), or pass --no-cache"
                             ) from None
        _refuse_foreign(self.path)
        try:
            self.seal = Seal(directory)
        except OSError as exc:
            raise StoreError(f"{directory}: cannot read or make the proof cache's key ({exc.strerror}): pass "
                             f"--no-cache, or name another directory with RELOCVERIFY_PROOF_CACHE") from None
        try:
            self.db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            self.db.execute(f"PRAGMA application_id={APPLICATION_ID}")
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            row = None
            try:
                row = self.db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            except sqlite3.OperationalError:
                pass
            if row is not None and row[0] != CACHE_SCHEMA:
                raise StoreError(f"{self.path}: a proof cache of schema {row[0]}, this version uses "
                                 f"{CACHE_SCHEMA}: delete the file or pass --cache-dir elsewhere")
            self.db.executescript(_SCHEMA + USAGE_SCHEMA)
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (CACHE_SCHEMA,))
            self.usage = Usage(self.db)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: unusable proof cache ({exc}): delete it or pass --no-cache") from None

    @property
    def enabled(self) -> bool:
        return self.db is not None

    def close(self) -> None:
        """Closed; first trimmed to its bound (``cache_usage.Usage.trim``) when this process wrote to it."""
        if self.db is not None:
            try:
                if self.usage is not None and self.usage.wrote:
                    self.usage.trim()
            except sqlite3.OperationalError:  # busy or read-only: the next writer trims
                pass
            finally:
                self.db.close()
                self.db = None

    # -- findings --------------------------------------------------------------------
    def findings(self, tag: bytes) -> dict[bytes, CachedFinding]:
        """Every instance key's finding under ``tag`` (later segments win)."""
        if self.db is None:
            return {}
        self.usage.touch("tag", (tag,))
        return _loaded(self._opened(tag, self.db.execute("SELECT data FROM segments WHERE tag=? ORDER BY id",
                                                                (tag,))))

    def add_findings(self, tag: bytes, findings: dict[bytes, CachedFinding]) -> None:
        if self.db is None or not findings:
            return
        self.usage.touch("tag", (tag,), wrote=True)
        self._append(tag, findings)
        self._compact_when_due("segments", tag, lambda blobs: self._append(tag, _loaded(blobs)))

    def _append(self, tag: bytes, findings: dict[bytes, CachedFinding]) -> None:
        """One new segment holding ``findings``."""
        templates: dict[tuple, int] = {}
        entries = []
        for key, f in findings.items():
            t = f.template()
            i = templates.setdefault(t, len(templates))
            entries.append((key, i, f.proof_us))
        blob = self.seal.seal(marshal.dumps((list(templates), entries)), tag)
        self.db.execute("INSERT INTO segments (tag, entries, data) VALUES (?,?,?)", (tag, len(entries), blob))

    def _opened(self, tag: bytes, rows) -> list[bytes]:
        """The data of sealed blobs (one-column rows) whose seals match; the others are left out (their
        entries are made again)."""
        return [d for d in (self.seal.open(blob, tag) for (blob,) in rows) if d is not None]

    def _compact_when_due(self, table: str, tag: bytes, append_merged) -> None:
        """``_compact_segments`` once the tag has more than ``COMPACT_AFTER`` segments in ``table``."""
        n = self.db.execute(f"SELECT count(*) FROM {table} WHERE tag=?", (tag,)).fetchone()[0]
        if n > COMPACT_AFTER:
            self._compact_segments(table, tag, append_merged)

    def _compact_segments(self, table: str, tag: bytes, append_merged) -> None:
        """Merge the tag's newest segments of ``table`` into one (at least two), in one transaction:
        those after the newest segment that outweighs all its successors (``_merge_from``), so a large
        old segment is not rewritten for every few small new ones.  A package run adds two segments per
        image; rewriting every finding each 16 of them made its harvests grow with the cache.
        ``append_merged(blobs)`` writes the merged segment from the old ones' blobs, oldest first."""
        rows = self.db.execute(f"SELECT id, entries FROM {table} WHERE tag=? ORDER BY id", (tag,)).fetchall()
        ids = [r[0] for r in rows[min(_merge_from(rows), len(rows) - 2):]]
        if len(ids) < 2:
            return
        marks = ",".join("?" * len(ids))
        blobs = self._opened(tag, self.db.execute(f"SELECT data FROM {table} WHERE id IN ({marks}) ORDER BY id", ids))
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute(f"DELETE FROM {table} WHERE id IN ({marks})", ids)
            append_merged(blobs)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    # -- jump answers --------------------------------------------------------------------
    def jump_entries(self, tag: bytes) -> dict[tuple, object]:
        """Every jump answer kept under ``tag``, its segments merged in order (``merge_jump_entries``)."""
        if self.db is None:
            return {}
        self.usage.touch("tag", (tag,))
        return _merged_jump(self._opened(tag, self.db.execute(
            "SELECT data FROM jump_segments WHERE tag=? ORDER BY id", (tag,))))

    def add_jump_entries(self, tag: bytes, entries: dict[tuple, object]) -> None:
        """One new segment of jump answers; the newest segments merged into one past ``COMPACT_AFTER``."""
        if self.db is None or not entries:
            return
        self.usage.touch("tag", (tag,), wrote=True)
        self._append_jump(tag, entries)
        self._compact_when_due("jump_segments", tag, lambda blobs: self._append_jump(tag, _merged_jump(blobs)))

    def _append_jump(self, tag: bytes, entries: dict[tuple, object]) -> None:
        self.db.execute("INSERT INTO jump_segments (tag, entries, data) VALUES (?,?,?)",
                        (tag, len(entries), self.seal.seal(marshal.dumps(list(entries.items())), tag)))

    # -- functions' rows -----------------------------------------------------------------
    def function_rows(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """The kept rows (``engine.row_memo``) of those function keys the cache holds."""
        if self.db is None or not keys:
            return {}
        out = {}
        contexts = set()
        for i in range(0, len(keys), ROWS_BATCH):
            part = keys[i:i + ROWS_BATCH]
            marks = ",".join("?" * len(part))
            for key, context, blob in self.db.execute(
                    f"SELECT key, context, data FROM function_rows WHERE key IN ({marks})", part):
                data = self.seal.open(blob, key)
                if data is not None:
                    out[key] = data
                    contexts.add(context)
        self.usage.touch("context", contexts)
        return out

    def row_outcomes(self) -> dict[bytes, tuple[tuple, str]]:
        """What every outcome digest the kept rows name stands for: (outcome tuple, reason); a damaged
        one is left out (the rows naming it are not reused)."""
        if self.db is None:
            return {}
        out = {}
        for digest, blob in self.db.execute("SELECT digest, data FROM row_outcomes"):
            data = self.seal.open(blob, digest)
            if data is None:
                continue
            try:
                outcome, reason = marshal.loads(data)
                out[digest] = (tuple(outcome), reason)
            except (ValueError, TypeError, EOFError):
                continue
        return out

    def add_function_rows(self, rows: dict[bytes, tuple[bytes, bytes]], outcomes: dict[bytes, bytes]) -> None:
        """Functions' rows, key -> (the run's context digest, the kept rows), and what the outcome digests
        they name stand for, in one transaction."""
        if self.db is None or not (rows or outcomes):
            return
        self.usage.touch("context", {c for c, _ in rows.values()}, wrote=True)
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.executemany("INSERT OR REPLACE INTO row_outcomes VALUES (?,?)",
                                [(k, self.seal.seal(d, k)) for k, d in outcomes.items()])
            self.db.executemany("INSERT OR REPLACE INTO function_rows VALUES (?,?,?)",
                                [(k, c, self.seal.seal(d, k)) for k, (c, d) in rows.items()])
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    # -- sites -----------------------------------------------------------------------------
    def site_index(self, key: bytes) -> bytes | None:
        """An image's sites kept under ``key`` (``engine.site_memo``), or None."""
        if self.db is None:
            return None
        self.usage.touch("site", (key,))
        row = self.db.execute("SELECT data FROM site_indexes WHERE key=?", (key,)).fetchone()
        return None if row is None else self.seal.open(row[0], key)

    def add_site_index(self, key: bytes, data: bytes) -> None:
        if self.db is not None:
            self.usage.touch("site", (key,), wrote=True)
            self.db.execute("INSERT OR REPLACE INTO site_indexes VALUES (?,?)", (key, self.seal.seal(data, key)))

    # -- full keys -----------------------------------------------------------------------
    def proofs(self, tag: bytes) -> dict[bytes, CachedProof]:
        if self.db is None:
            return {}
        self.usage.touch("tag", (tag,))
        return {r[0]: CachedProof(*r[1:5]) for r in self.db.execute(
            "SELECT p.key, verdict, reason, method, proof_us, seal FROM proofs p JOIN proof_seals s "
            "ON s.tag = p.tag AND s.key = p.key WHERE p.tag=?", (tag,)) if self._proof_sealed(tag, r)}

    def proof(self, tag: bytes, key: bytes) -> CachedProof | None:
        """One proof by its full key (a single question need not load every proof of the tag)."""
        if self.db is None:
            return None
        self.usage.touch("tag", (tag,))
        row = self.db.execute("SELECT p.key, verdict, reason, method, proof_us, seal FROM proofs p JOIN proof_seals s "
                              "ON s.tag = p.tag AND s.key = p.key WHERE p.tag=? AND p.key=?", (tag, key)).fetchone()
        return None if row is None or not self._proof_sealed(tag, row) else CachedProof(*row[1:5])

    def _proof_sealed(self, tag: bytes, row) -> bool:
        key, verdict, reason, method, _, seal = row
        return self.seal.open(seal, tag, key, verdict.encode(), reason.encode(), method.encode()) == b""

    def lookup(self, tag: bytes) -> "ProofLookup":
        """A mapping for ``engine.pipeline.Prover`` that asks for each key on demand."""
        return ProofLookup(self, tag)

    def derivations(self, tag: bytes) -> dict[bytes, bytes | None]:
        if self.db is None:
            return {}
        return dict(self.db.execute("SELECT key, full_key FROM derivations WHERE tag=?", (tag,)))

    def add(self, tag: bytes, findings: dict[bytes, CachedFinding], proofs: dict[bytes, CachedProof],
            derivations: dict[bytes, bytes | None] | None = None) -> None:
        """Record new findings, proofs and derivations, each in one transaction."""
        if self.db is None:
            return
        if proofs or derivations:
            self.usage.touch("tag", (tag,), wrote=True)
            db = self.db
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany("INSERT OR REPLACE INTO proofs VALUES (?,?,?,?,?,?)",
                               [(tag, k, p.verdict, p.reason, p.method, p.proof_us) for k, p in proofs.items()])
                db.executemany("INSERT OR REPLACE INTO proof_seals VALUES (?,?,?)",
                               [(tag, k, self.seal.seal(b"", tag, k, p.verdict.encode(), p.reason.encode(),
                                                        p.method.encode())) for k, p in proofs.items()])
                db.executemany("INSERT OR REPLACE INTO derivations VALUES (?,?,?)",
                               [(tag, k, v) for k, v in (derivations or {}).items()])
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        self.add_findings(tag, findings)


def _merge_from(rows: list[tuple[int, int]]) -> int:
    """Where the segments to merge start, given (id, entries) oldest first: after the newest segment
    that holds more entries than all the segments after it together (0: merge them all)."""
    after = rows[-1][1] if rows else 0
    for i in range(len(rows) - 2, -1, -1):
        if rows[i][1] > after:
            return i + 1
        after += rows[i][1]
    return 0


def merge_jump_entries(into: dict[tuple, object], new: dict[tuple, object]) -> int:
    """Jump answers ``new`` merged into ``into``; returns the conflicts found.

    An entry is ``(kind, key) -> value``: ``("p", key)`` a piece's answer (a bool), ``("s", token)``
    the piece key a branch token stood for, ``("b", key)`` a block's (bucket, reason).  A piece's
    False wins over True (answers made under one key agree, unless a token was found standing for
    two piece keys, which makes both of its answers False for good); a token met with another piece
    key than the one kept is such a conflict (two workers or two runs each saw one of them)."""
    conflicts = 0
    for k, v in new.items():
        kind = k[0]
        if kind == "p":
            into[k] = into.get(k, True) and v
        elif kind == "s":
            old = into.setdefault(k, v)
            if old != v:
                conflicts += 1
                into[("p", (k[1], True))] = into[("p", (k[1], False))] = False
        else:
            into[k] = v
    return conflicts


def _merged_jump(blobs) -> dict[tuple, object]:
    """The entries of ``jump_segments`` blobs, merged in order (``merge_jump_entries``)."""
    out: dict[tuple, object] = {}
    for data in blobs:
        merge_jump_entries(out, _jump_segment(data))
    return out


def _jump_segment(data: bytes) -> dict[tuple, object]:
    """The entries of one ``jump_segments`` blob; a damaged one is empty (its answers are made again)."""
    try:
        return dict(marshal.loads(data))
    except (ValueError, TypeError, EOFError):
        return {}


def _loaded(blobs) -> dict[bytes, CachedFinding]:
    """The findings of segment blobs, in order (later ones win)."""
    out: dict[bytes, CachedFinding] = {}
    for data in blobs:
        try:
            templates, entries = marshal.loads(data)
            made: dict[tuple[int, int], CachedFinding] = {}
            for key, index, us in entries:
                f = made.get((index, us))
                if f is None:
                    t = templates[index]
                    f = made[(index, us)] = CachedFinding(*t[:7], us, t[7])
                out[key] = f
        except (ValueError, TypeError, EOFError, IndexError):
            continue  # a damaged segment: its keys are proved again
    return out
