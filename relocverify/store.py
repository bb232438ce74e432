"""The result store: one SQLite file.

Tables:
  images        one row per kernel image (identity = sha256 of its ELF bytes)
  runs          one row per ``vmlinux`` run: inputs, tool versions, status, summary
  instructions  one row per instruction, keyed by (image, address): its verdict
  functions_done (image, start) of every function whose rows are all stored
  proof_cache   verdicts keyed by what a proof depends on (see proof.cache_key)

Nothing is half-written: a function's instruction rows and its
``functions_done`` row are written in one transaction, so after any
interruption (Ctrl-C, kill -9, power loss) a function is either wholly
stored or not at all, and a rerun verifies exactly the functions missing.
SQLite's WAL journal makes each commit durable and atomic.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass

from .errors import StoreError

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS images (
    identity TEXT PRIMARY KEY, path TEXT, format TEXT, symbol_source TEXT, info TEXT);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, image TEXT NOT NULL, started REAL, finished REAL,
    status TEXT, tramp INTEGER, versions TEXT, summary TEXT);
CREATE TABLE IF NOT EXISTS instructions (
    image TEXT NOT NULL, address INTEGER NOT NULL, section TEXT, function TEXT,
    bytes BLOB NOT NULL, verdict TEXT NOT NULL, reason TEXT, reason_key TEXT, method TEXT,
    plan_kind TEXT, rule TEXT, klass TEXT, sites TEXT, run INTEGER,
    PRIMARY KEY (image, address)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS functions_done (
    image TEXT NOT NULL, start INTEGER NOT NULL, name TEXT, instructions INTEGER, run INTEGER, config TEXT,
    PRIMARY KEY (image, start)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS byte_verdicts (
    tag BLOB NOT NULL, raw BLOB NOT NULL, row TEXT, PRIMARY KEY (tag, raw)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS proof_cache (
    key BLOB PRIMARY KEY, verdict TEXT NOT NULL, reason TEXT, method TEXT) WITHOUT ROWID;
"""


@dataclass(frozen=True)
class InstructionRow:
    address: int
    section: str
    function: str
    raw: bytes
    verdict: str
    reason: str
    reason_key: str
    method: str
    plan_kind: str
    rule: str
    klass: str
    sites: str = ""


def _signed(v: int) -> int:
    """SQLite integers are signed 64-bit: kernel addresses are stored two's-complement."""
    return v - (1 << 64) if v >= 1 << 63 else v


def _unsigned(v: int) -> int:
    return v + (1 << 64) if v < 0 else v


class Store:
    def __init__(self, path: str):
        self.path = path
        try:
            self.db = sqlite3.connect(path, timeout=30, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
            row = self.db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                self.db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise StoreError(f"{path}: store schema {row[0]}, this relocverify writes {SCHEMA_VERSION}")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path}: not a relocverify store ({exc})") from None

    def close(self) -> None:
        self.db.close()

    # -- images and runs ---------------------------------------------------
    def add_image(self, identity: str, path: str, fmt: str, symbol_source: str, info: dict) -> None:
        self.db.execute("INSERT OR REPLACE INTO images VALUES (?,?,?,?,?)",
                        (identity, path, fmt, symbol_source, json.dumps(info)))

    def start_run(self, image: str, tramp: int, config: str) -> int:
        cur = self.db.execute("INSERT INTO runs (image, started, status, tramp, versions) VALUES (?,?,?,?,?)",
                              (image, time.time(), "running", _signed(tramp), config))
        return cur.lastrowid

    def last_summary(self, image: str, config: str) -> dict | None:
        """The summary of the newest complete run of this image under this configuration."""
        row = self.db.execute("SELECT summary FROM runs WHERE image=? AND versions=? AND status='complete' "
                              "AND summary IS NOT NULL ORDER BY id DESC LIMIT 1", (image, config)).fetchone()
        return None if row is None else json.loads(row[0])

    def finish_run(self, run: int, status: str, summary: dict) -> None:
        self.db.execute("UPDATE runs SET finished=?, status=?, summary=? WHERE id=?",
                        (time.time(), status, json.dumps(summary), run))

    # -- instructions ------------------------------------------------------
    def done_functions(self, image: str, config: str) -> set[int]:
        """Functions already stored for this image under the same configuration
        (trampoline base and tool versions): a rerun with other settings redoes them."""
        return {_unsigned(r[0]) for r in self.db.execute(
            "SELECT start FROM functions_done WHERE image=? AND config=?", (image, config))}

    def write_functions(self, image: str, run: int, done: list[tuple[int, str, list[tuple]]],
                        cache: dict[bytes, tuple[str, str, str]], config: str = "") -> None:
        """Store whole functions and new proof-cache entries in one transaction.

        A row is (address, section, function, bytes, verdict, reason, method,
        plan kind, rule, class, reason key[, sites])."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            for start, name, rows in done:
                db.executemany(
                    "INSERT OR REPLACE INTO instructions VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    [(image, _signed(r[0]), r[1], r[2], r[3], r[4], r[5], r[10], r[6], r[7], r[8], r[9],
                      r[11] if len(r) > 11 else "", run) for r in rows])
                db.execute("INSERT OR REPLACE INTO functions_done VALUES (?,?,?,?,?,?)",
                           (image, _signed(start), name, len(rows), run, config))
            db.executemany("INSERT OR IGNORE INTO proof_cache VALUES (?,?,?,?)",
                           [(k, *v) for k, v in cache.items()])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def write_byte_verdicts(self, tag: bytes, verdicts: dict[bytes, tuple | None],
                            cache: dict[bytes, tuple[str, str, str]]) -> None:
        """Verdicts that depend on the bytes alone (None: the bytes' verdict depends on the address)."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("INSERT OR REPLACE INTO byte_verdicts VALUES (?,?,?)",
                           [(tag, raw, None if row is None else json.dumps(row)) for raw, row in verdicts.items()])
            db.executemany("INSERT OR IGNORE INTO proof_cache VALUES (?,?,?,?)", [(k, *v) for k, v in cache.items()])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def load_byte_verdicts(self, tag: bytes) -> dict[bytes, tuple | None]:
        rows: dict[str, tuple] = {}  # most rows are equal: share one tuple per distinct row
        out = {}
        for raw, row in self.db.execute("SELECT raw, row FROM byte_verdicts WHERE tag=?", (tag,)):
            if row is None:
                out[raw] = None
                continue
            t = rows.get(row)
            if t is None:
                t = rows[row] = tuple(json.loads(row))
            out[raw] = t
        return out

    def load_cache(self) -> dict[bytes, tuple[str, str, str]]:
        return {r[0]: (r[1], r[2], r[3]) for r in self.db.execute("SELECT key, verdict, reason, method FROM proof_cache")}

    def iter_rows(self, image: str):
        for r in self.db.execute("SELECT address, section, function, bytes, verdict, reason, reason_key, method, "
                                 "plan_kind, rule, klass, sites FROM instructions WHERE image=? ORDER BY address",
                                 (image,)):
            yield InstructionRow(_unsigned(r[0]), *r[1:])
