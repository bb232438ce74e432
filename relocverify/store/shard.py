"""Shards: each worker writes its results to a file of its own, and the run's parent merges them.

SQLite has one writer at a time, and a run inserts millions of rows: written
by one process they cost that process about 3.5 µs each, which on a 2-core
machine is the run's bottleneck.  So every worker writes whole functions,
one transaction per task, into its own shard (``<store>.shard-<pid>-<n>``),
in parallel, and the parent moves a shard into the store with a handful of
``INSERT ... SELECT`` statements (about 1 µs a row, in C) when the worker
is done with it.

A shard holds the store's row tables (``instructions``, ``packed``,
``variants``), made from ``schema.sql`` (``schema.shard_schema``), with
three differences, all resolved by the merge:

* an outcome or a variant name the worker found new has a provisional
  negative id, defined in ``new_outcomes`` or ``new_names``; the merge numbers
  it in the store and maps it (a packed function names its outcomes and
  variant names by its own indexes, so the merge rewrites its two small id
  arrays, ``packed_rows.remap_ids``, and copies its other blobs as they are);
* a row of ``variants`` (a variant with a reason of its own) names its
  variant by its text;
* a counterexample has the shard's own id (the merge offsets it).

``done`` lists the functions whose rows the shard holds, with the
configuration they were verified under, and ``seals`` the seals the worker
made of those it copied from the proof cache (``engine.row_keeper``), with
the reasons they give their outcomes (``seal_outcomes``): the merge stores
them where they hold (``row_seals.shard_seals_hold``) and seals every other
function from its rows as stored.  A merge is one transaction, and
merging a shard twice (a parent killed between the merge and deleting the
file) replaces the rows of its functions: merging is idempotent.  Shards
found next to a store are merged when the next run opens it, so functions a
killed run finished are never lost.

A shard is written through a rollback journal without waiting for the disk (``journal_mode=TRUNCATE``,
``synchronous=OFF``).  A shard only grows, so a transaction journals the few pages it changes, where a
write-ahead log wrote every page twice (into the log, then into the file); and a hot journal is rolled back by
the next reader, so any end of the writing process, kill -9 included, leaves the shard whole (SQLite's
"Atomic Commit In SQLite" and its ``PRAGMA synchronous`` page: with OFF, "if the application running SQLite
crashes, the data will be safe").  Only the
operating system's end (a crash, a power loss) can leave one torn: so a shard's name carries the boot it was
written in (``/proc/sys/kernel/random/boot_id``), and a shard an earlier run left that was written in another
boot is deleted unread (``leftover_shards(..., this_boot=True)``, when a run opens its store): its functions
are verified again.  A run merges its own workers' shards whatever their boot (a Dask worker's host has its
own).  Writing shards took a fifth of a warm run's workers' time with a log and ``synchronous=NORMAL``, and
about half that now (the store itself keeps both).
"""

from __future__ import annotations

import json
import os
import sqlite3
from urllib.parse import quote

from ..errors import StoreError
from .packed_rows import Remapper
from .row_seals import TABLE as SEALS_TABLE
from .row_seals import seal_functions, seal_of, shard_seals_hold
from .schema import shard_schema

_SUFFIX = ".shard-"


def _this_boot() -> str:
    """The running kernel's boot, as a shard's name carries it (``""``: unknown, and a shard written then is
    merged whatever boot reads it, as every shard was before the tag)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip().replace("-", "")[:16]
    except OSError:
        return ""


BOOT = _this_boot()


def same_boot(path: str) -> bool:
    """Whether the shard at ``path`` was written in this boot (or carries no boot: written where none was known)."""
    tag = os.path.basename(path).rpartition(_SUFFIX)[2].partition(".")[2]
    return not tag or not BOOT or tag == BOOT


def uri(path: str) -> str:
    """``path`` as an SQLite URI: its bytes percent-encoded, so a name of any bytes (a Latin-1 name, carried as
    surrogates, which SQLite's UTF-8 text cannot hold) and one with '?', '#' or '%' reach SQLite whole.
    ``ATTACH`` reads it as a URI when its connection was opened with ``uri=True`` (``connect``)."""
    return "file:" + quote(os.fsencode(os.path.abspath(path)))


def connect(path: str) -> sqlite3.Connection:
    """A connection that writes the store at ``path`` and attaches shards by ``uri``."""
    return sqlite3.connect(uri(path), timeout=60, isolation_level=None, uri=True)


class ShardWriter:
    """A worker's shard, created when first written."""

    def __init__(self, path: str):
        self.path = path
        self.db: sqlite3.Connection | None = None
        self._defined: set[int] = set()  # provisional outcome ids this shard defines already

    def _open(self) -> sqlite3.Connection:
        if self.db is None:
            try:
                self.db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
                self.db.execute("PRAGMA journal_mode=TRUNCATE")  # see the module's doc
                self.db.execute("PRAGMA synchronous=OFF")  # a torn shard is another boot's (``same_boot``)
                self.db.executescript(shard_schema())
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"{self.path}: cannot write a shard of the store ({exc})") from None
        return self.db

    def write(self, config: int, batch) -> None:
        """One ``RowBatch`` (whole functions) in one transaction."""
        if not batch.functions:
            return
        db = self._open()
        db.execute("BEGIN IMMEDIATE")
        try:
            new = [(pid,) + tuple(outcome) + (reason,) for pid, outcome, reason in batch.outcomes
                   if pid not in self._defined]
            db.executemany("INSERT OR IGNORE INTO new_outcomes VALUES (?,?,?,?,?,?,?,?)", new)
            names = [(pid, name) for pid, name in batch.names if pid not in self._defined]
            db.executemany("INSERT OR IGNORE INTO new_names VALUES (?,?)", names)
            # Nearly every row is plain: packed with the function's counts, sites and variants,
            # one SQLite row per function (``store.packed_rows``).
            db.executemany("INSERT INTO packed VALUES (?,?,?,?,?,?,?)", batch.packed)
            db.executemany("INSERT INTO instructions VALUES (?,?,?,?,?,?,?,?,?,?)",
                           [r[:9] + (None if r[9] is None else self._counterexample(db, r[9]),) for r in batch.full])
            db.executemany("INSERT INTO variants VALUES (?,?,?,?,?)", batch.variants)
            db.executemany("INSERT OR REPLACE INTO done VALUES (?,?)", [(f, config) for f in batch.functions])
            db.executemany("INSERT OR REPLACE INTO seals VALUES (?,?)", batch.seals)
            db.executemany("INSERT OR IGNORE INTO seal_outcomes VALUES (?,?)", batch.seal_outcomes.items())
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._defined.update(r[0] for r in new)
        self._defined.update(r[0] for r in names)

    @staticmethod
    def _counterexample(db: sqlite3.Connection, c) -> int:
        return db.execute("INSERT INTO counterexamples (state, differences, replay) VALUES (?,?,?)",
                          (c.state_json(), json.dumps([[d.what, d.original, d.relocated] for d in c.differences]),
                           c.replay_command)).lastrowid

    def close(self) -> str | None:
        """Close the shard; its path if it was written, for the merge."""
        if self.db is None:
            return None
        self.db.close()
        self.db = None
        return self.path


def shard_path(store_path: str, pid: int, n: int) -> str:
    return f"{store_path}{_SUFFIX}{pid}-{n}" + (f".{BOOT}" if BOOT else "")


def leftover_shards(store_path: str, pid: int | None = None, this_boot: bool = False) -> list[str]:
    """Shards found next to the store (a killed run's, or a dead worker's: ``pid``).  ``this_boot``: those written
    in another boot (``same_boot``), perhaps torn, are deleted instead."""
    directory, name = os.path.split(os.path.abspath(store_path))
    prefix = name + _SUFFIX + ("" if pid is None else f"{pid}-")
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return []
    found = sorted(os.path.join(directory, f) for f in names
                   if f.startswith(prefix) and not f.endswith(("-wal", "-shm", "-journal")))
    if this_boot:
        for path in [p for p in found if not same_boot(p)]:
            _remove(path)
            found.remove(path)
    return found


MAX_ATTACHED = 8  # SQLite attaches at most 10 databases by default; merge in groups


def merge(db: sqlite3.Connection, paths: list[str]) -> tuple[int, dict[int, int]]:
    """Move shards into the store behind ``db``, up to ``MAX_ATTACHED`` per transaction, then
    delete their files.  The rows of a group go in in primary-key order, so that the store's
    B-trees are appended to and stay dense.  Returns (how many functions, provisional outcome
    or variant name id -> store id)."""
    paths = sorted({os.path.abspath(p) for p in paths if os.path.exists(p)})
    total, final = 0, {}
    for i in range(0, len(paths), MAX_ATTACHED):
        group = paths[i:i + MAX_ATTACHED]
        names = []
        try:
            for k, path in enumerate(group):
                db.execute(f"ATTACH DATABASE ? AS shard{k}", (uri(path),))
                names.append(f"shard{k}")
            names = [n for n in names if db.execute(f"SELECT count(*) FROM {n}.sqlite_schema WHERE name='done'")
                     .fetchone()[0]]  # a shard killed before its schema was written holds nothing
            if names:
                n, ids = _merge_attached(db, names)
                total += n
                final.update(ids)
        finally:
            for k in range(len(group)):
                try:
                    db.execute(f"DETACH DATABASE shard{k}")
                except sqlite3.OperationalError:
                    pass
        for path in group:
            _remove(path)
    return total, final


#: A shard's files: the database and what SQLite keeps beside it (the rollback journal; a log from before it).
FILES = ("", "-journal", "-wal", "-shm")


def _remove(path: str) -> None:
    """A shard's files deleted."""
    for suffix in FILES:
        try:
            os.remove(path + suffix)
        except FileNotFoundError:
            pass


def _seal(db: sqlite3.Connection, names: list[str], done: str) -> None:
    """Seal the shards' functions in the merge's transaction: with the seals their workers made where those are
    the store's (``row_seals.shard_seals_hold``), the others from their rows as stored."""
    sealed = [n for n in names if shard_seals_hold(db, n, "temp.idmap")]
    if not sealed or seal_of(db) is None:
        seal_functions(db, f"f.id IN ({done})")
        return
    db.execute(SEALS_TABLE)
    db.execute(f"INSERT OR REPLACE INTO main.seals SELECT s.function, s.mac FROM "
               f"({_union(sealed, 'seals', 'function, mac')}) s WHERE s.function IN ({done})")
    unsealed = f"SELECT d.function FROM ({done}) d WHERE d.function NOT IN ({_union(sealed, 'seals', 'function')})"
    if db.execute(unsealed + " LIMIT 1").fetchone() is not None:
        seal_functions(db, f"f.id IN ({unsealed})")


def _union(names: list[str], table: str, columns: str) -> str:
    return " UNION ALL ".join(f"SELECT {columns} FROM {n}.{table}" for n in names)


def _merge_attached(db: sqlite3.Connection, names: list[str]) -> tuple[int, dict[int, int]]:
    db.execute("BEGIN IMMEDIATE")
    try:
        n = sum(db.execute(f"SELECT count(*) FROM {name}.done").fetchone()[0] for name in names)
        outcome_columns = "verdict, method, plan_kind, rule, klass, reason_key"
        db.execute(f"INSERT OR IGNORE INTO main.outcomes ({outcome_columns}, reason) "
                   f"{_union(names, 'new_outcomes', outcome_columns + ', reason')}")
        db.execute("CREATE TEMP TABLE IF NOT EXISTS idmap (pid INTEGER PRIMARY KEY, final INTEGER NOT NULL)")
        db.execute("DELETE FROM temp.idmap")
        db.execute(f"INSERT OR IGNORE INTO temp.idmap SELECT u.pid, o.id FROM "
                   f"({_union(names, 'new_outcomes', 'pid, ' + outcome_columns)}) u "
                   f"JOIN main.outcomes o USING ({outcome_columns})")
        db.execute(f"INSERT OR IGNORE INTO main.variant_names (name) SELECT name FROM "
                   f"({_union(names, 'new_names', 'name')} UNION ALL {_union(names, 'variants', 'name')}) "
                   "ORDER BY 1")
        db.execute(f"INSERT OR IGNORE INTO temp.idmap SELECT u.pid, n.id FROM "
                   f"({_union(names, 'new_names', 'pid, name')}) u JOIN main.variant_names n USING (name)")
        final = dict(db.execute("SELECT pid, final FROM temp.idmap"))
        remap = Remapper(final)
        db.create_function("rv_remap", 1, remap, deterministic=True)
        # each shard's counterexample ids, offset past the store's and the shards' before it
        offsets = []
        for name in names:
            base = db.execute("SELECT coalesce(max(id), 0) FROM main.counterexamples").fetchone()[0]
            db.execute(f"INSERT INTO main.counterexamples SELECT id + ?, state, differences, replay "
                       f"FROM {name}.counterexamples", (base,))
            offsets.append(base)
        done = _union(names, "done", "function")
        # Functions stored before (under another configuration, or by an earlier merge of these very
        # shards) lose their old rows first.  CROSS JOIN makes SQLite walk the shard's functions and look
        # each up, where a plain JOIN let it scan the store's whole function table (a package store:
        # 100 k rows, eight scans per image).
        db.execute("CREATE TEMP TABLE IF NOT EXISTS redo (function INTEGER PRIMARY KEY)")
        db.execute("DELETE FROM temp.redo")
        db.execute(f"INSERT OR IGNORE INTO temp.redo SELECT d.function FROM ({done}) d "
                   f"CROSS JOIN main.functions f ON f.id = d.function WHERE f.config IS NOT NULL")
        for table in ("instructions", "packed", "variants"):
            db.execute(f"DELETE FROM main.{table} WHERE function IN temp.redo")
        rows = " UNION ALL ".join(
            f"SELECT function, offset, length, outcome, reason, proof_us, fresh, sites, answers, cex + {base} AS cex "
            f"FROM {name}.instructions" for name, base in zip(names, offsets))
        db.execute("INSERT INTO main.instructions SELECT i.function, i.offset, i.length, coalesce(m.final, i.outcome), "
                   f"i.reason, i.proof_us, i.fresh, i.sites, i.answers, i.cex FROM ({rows}) i "
                   "LEFT JOIN temp.idmap m ON m.pid = i.outcome ORDER BY i.function, i.offset")
        try:
            db.execute("INSERT INTO main.packed SELECT function, rv_remap(outcomes), counts, rv_remap(names), "
                       f"variants, sites, data FROM ({_union(names, 'packed', '*')}) ORDER BY 1")
        except sqlite3.OperationalError:
            if remap.error is not None:
                raise remap.error from None
            raise
        db.execute("INSERT INTO main.variants SELECT v.function, v.offset, n.id, coalesce(m.final, v.outcome), "
                   f"v.reason FROM ({_union(names, 'variants', '*')}) v JOIN main.variant_names n ON n.name = v.name "
                   "LEFT JOIN temp.idmap m ON m.pid = v.outcome ORDER BY 1, 2, 3")
        db.execute(f"UPDATE main.functions SET config = (SELECT d.config FROM ({_union(names, 'done', '*')}) d "
                   f"WHERE d.function = functions.id) WHERE id IN ({done})")
        _seal(db, names, done)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return n, final
