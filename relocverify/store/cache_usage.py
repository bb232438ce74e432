"""The proof cache's bound: what each generation of its rows last served, and the oldest generations
dropped once the file holds more than its limit.

The cache files every row under a generation that a change of tools, policy or relocverify's own source
replaces: a proof tag (``proofs``, ``derivations``, ``segments``, ``proof_seals``; a jump tag for
``jump_segments``), a run's context digest (``function_rows``, the bulk of the file: 15-35 MB a kernel), a
site key (``site_indexes``).  Rows of a replaced generation are never read again, and a cache used
across many versions grew without end (1.4 GB after one day of development, 52 row contexts of which one
was live).  ``usage`` keeps when each generation was last read or written (once per process); ``trim``,
called when a process that wrote closes the cache, drops whole generations, least recently used first,
while the rows in use exceed the limit, and never one this process used.  A generation with no ``usage``
row (written before the bound) counts as the oldest.

Dropping a generation loses time, never a verdict: a key it held is proved again (``store.cache``).  SQLite
reuses the freed pages for later rows and does not give them back to the file system, so the file stops
growing at about the limit rather than shrinking to it (``VACUUM`` would rewrite the whole file)."""

from __future__ import annotations

import os
import sqlite3
import time

#: The rows in use a cache keeps at most (its pages minus its free pages): about 30 whole-kernel
#: generations.  ``RELOCVERIFY_CACHE_LIMIT_MB`` sets another.
LIMIT = 1 << 30
#: Once over the limit, generations are dropped until the rows in use fit in this share of it: a trim
#: then serves several runs.
TRIM_TO = 0.75

#: kind -> (table, column) pairs whose rows a generation of that kind names.
GENERATIONS = {
    "tag": (("proofs", "tag"), ("derivations", "tag"), ("segments", "tag"), ("proof_seals", "tag"),
            ("jump_segments", "tag")),
    "context": (("function_rows", "context"),),
    "site": (("site_indexes", "key"),),
}

#: A row's bytes, as ``trim`` estimates them, where a table has no ``data`` column (its key and a few
#: short columns).
SIZE_OF_ROW = {"proofs": "length(key) + 64", "derivations": "length(key) + 64", "proof_seals": "length(key) + 64"}

SCHEMA = """CREATE TABLE IF NOT EXISTS usage (kind TEXT NOT NULL, name BLOB NOT NULL, used INTEGER NOT NULL,
    PRIMARY KEY (kind, name)) WITHOUT ROWID;"""


def limit_from_environment() -> int:
    """``RELOCVERIFY_CACHE_LIMIT_MB`` in bytes, else ``LIMIT`` (a value that is no positive number: ``LIMIT``)."""
    text = os.environ.get("RELOCVERIFY_CACHE_LIMIT_MB", "")
    try:
        mb = float(text)
    except ValueError:
        return LIMIT
    return int(mb * (1 << 20)) if 0 < mb < 1 << 40 else LIMIT


class Usage:
    """When each generation of one cache file was last used, and the trim that keeps the file bounded."""

    def __init__(self, db: sqlite3.Connection, limit: int | None = None):
        self.db = db
        self.limit = limit_from_environment() if limit is None else limit
        self.used: set[tuple[str, bytes]] = set()  # generations this process read or wrote
        self.wrote = False

    def touch(self, kind: str, names, wrote: bool = False) -> None:
        """``names`` of ``kind`` (``GENERATIONS``) served now; recorded once per process."""
        fresh = [(kind, bytes(n)) for n in names if (kind, bytes(n)) not in self.used]
        self.wrote = self.wrote or wrote
        if not fresh:
            return
        self.used.update(fresh)
        now = int(time.time())
        try:
            self.db.executemany("INSERT INTO usage VALUES (?,?,?) ON CONFLICT (kind, name) DO UPDATE SET used=?",
                                [(k, n, now, now) for k, n in fresh])
        except sqlite3.OperationalError:  # busy or read-only: the generation keeps its older time
            pass

    def in_use_bytes(self) -> int:
        """The bytes of the file's pages that hold rows (its free pages left out)."""
        pages, = self.db.execute("PRAGMA page_count").fetchone()
        free, = self.db.execute("PRAGMA freelist_count").fetchone()
        size, = self.db.execute("PRAGMA page_size").fetchone()
        return (pages - free) * size

    def trim(self) -> list[tuple[str, bytes]]:
        """Drop the least recently used generations (never one this process used) while the rows in use
        exceed the limit, down to ``TRIM_TO`` of it; the generations dropped, oldest first."""
        in_use = self.in_use_bytes()
        if in_use <= self.limit:
            return []
        over = in_use - int(self.limit * TRIM_TO)
        sizes = self._sizes()
        used = {(k, bytes(n)): t for k, n, t in self.db.execute("SELECT kind, name, used FROM usage")}
        order = sorted((g for g in sizes if g not in self.used), key=lambda g: (used.get(g, 0), g))
        dropped, freed = [], 0
        for g in order:
            if freed >= over:
                break
            dropped.append(g)
            freed += sizes[g]
        if dropped:
            self._drop(dropped)
        return dropped

    def _sizes(self) -> dict[tuple[str, bytes], int]:
        """Every generation's bytes of row data (one scan of each table)."""
        out: dict[tuple[str, bytes], int] = {}
        for kind, places in GENERATIONS.items():
            for table, column in places:
                measure = SIZE_OF_ROW.get(table, "length(data)")
                for name, n in self.db.execute(f"SELECT {column}, sum({measure}) FROM {table} GROUP BY {column}"):
                    out[(kind, bytes(name))] = out.get((kind, bytes(name)), 0) + (n or 0)
        return out

    def _drop(self, generations: list[tuple[str, bytes]]) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            for kind, places in GENERATIONS.items():
                names = [n for k, n in generations if k == kind]
                for i in range(0, len(names), 500):  # one scan of a table for up to 500 generations
                    part = names[i:i + 500]
                    marks = ",".join("?" * len(part))
                    for table, column in places:
                        self.db.execute(f"DELETE FROM {table} WHERE {column} IN ({marks})", part)
                    self.db.execute(f"DELETE FROM usage WHERE kind=? AND name IN ({marks})", [kind, *part])
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
