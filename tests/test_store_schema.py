"""One schema: a shard's row tables are the store's (``schema.sql``), as ``store.schema.shard_schema`` makes them."""

from __future__ import annotations

import sqlite3

from relocverify.store.schema import schema_sql, shard_schema


def _columns(sql: str) -> dict[str, list[tuple]]:
    db = sqlite3.connect(":memory:")
    db.executescript(sql)
    tables = [t for (t,) in db.execute("SELECT name FROM sqlite_schema WHERE type='table'")]
    return {t: [(r[1], r[2], r[3], r[5]) for r in db.execute(f"PRAGMA table_info({t})")] for t in tables}


def test_a_shards_row_tables_are_the_stores():
    store, shard = _columns(schema_sql()), _columns(shard_schema())
    for table in ("instructions", "packed", "counterexamples"):
        assert shard[table] == store[table], table
    named = [(c if c[0] != "name" else ("name", "TEXT", 1, c[3])) for c in store["variants"]]
    assert shard["variants"] == named  # a shard names a variant by its text
    assert [c[1:] for c in shard["new_outcomes"]] == [c[1:] for c in store["outcomes"]]
    assert shard["new_outcomes"][0][0] == "pid" and store["outcomes"][0][0] == "id"
    assert set(shard) == {"instructions", "packed", "variants", "counterexamples", "new_outcomes", "new_names", "done",
                          "seals", "seal_outcomes"}
