"""The store: what it refuses untouched, what it answers, and how small it stays."""

from __future__ import annotations

import sqlite3

import pytest

from relocverify.cli import main
from relocverify.engine.run import RunOptions, run
from relocverify.errors import StoreError
from relocverify.image.loader import load_image
from relocverify.store.store import SITE_KINDS, Store, site_kinds, site_mask

TRAMP = 0xFFFFFFFFC0001000


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    import elfbuild
    import test_engine

    d = tmp_path_factory.mktemp("small")
    image = load_image(elfbuild.build_elf(d, test_engine.SMALL_ASM, test_engine.SMALL_LDS))
    db = d / "s.sqlite"
    run(image, str(db), RunOptions(TRAMP, 1, 10.0, None, True, None))
    return image, db


def test_a_text_file_is_not_a_store_and_is_left_alone(tmp_path, capsys, small_store):
    image, _ = small_store
    db = tmp_path / "notes.txt"
    db.write_bytes(b"my notes, not a database\n" * 10)
    before = db.read_bytes()
    assert main(["vmlinux", image.path, "--db", str(db), "--no-progress", "--no-cache"]) == 2
    assert db.read_bytes() == before
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a relocverify store" in err


def test_another_programs_sqlite_file_is_left_alone(tmp_path, small_store):
    db = tmp_path / "other.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE customers (name TEXT)")
    con.execute("INSERT INTO customers VALUES ('ada')")
    con.commit()
    con.close()
    before = db.read_bytes()
    with pytest.raises(StoreError, match="another program"):
        Store(str(db))
    assert db.read_bytes() == before
    con = sqlite3.connect(db)
    assert [r[0] for r in con.execute("SELECT name FROM sqlite_schema")] == ["customers"]
    con.close()


def test_a_schema_1_store_is_refused_with_what_to_do(tmp_path):
    db = tmp_path / "v1.sqlite"
    con = sqlite3.connect(db)
    con.executescript("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                      "INSERT INTO meta VALUES ('schema', '1');"
                      "CREATE TABLE instructions (image TEXT, address INTEGER, verdict TEXT);")
    con.commit()
    con.close()
    before = db.read_bytes()
    with pytest.raises(StoreError, match="schema-1 store.*new --db"):
        Store(str(db))
    assert db.read_bytes() == before


def test_queries_by_address_function_verdict_and_the_function_table(small_store):
    image, db = small_store
    store = Store(str(db), readonly=True)
    try:
        iid = store.find_image(image.identity)
        rows = list(store.iter_rows(iid))
        assert len(rows) == 19
        for r in rows:
            assert store.instruction_at(iid, r.address) == r
            assert image.read(r.address, r.length) == r.raw
        assert store.instruction_at(iid, rows[2].address + 1) is None  # inside the 7-byte load: no instruction
        functions = {f.name: (f, counts) for f, counts in store.function_counts(iid)}
        assert set(functions) == {"f_plain", "f_cpuid", "f_loop", "f_twice"}
        f, counts = functions["f_cpuid"]
        assert counts == {"proved": 4, "opaque": 1}
        assert [r.address for r in store.function_rows(f.id)] == [r.address for r in rows if r.function == "f_cpuid"]
        opaque = list(store.rows_with(iid, "opaque"))
        assert [r.klass for r in opaque] == ["cpuid"]
        assert list(store.rows_with(iid, "proved", "proved by fast-path")) == [r for r in rows if r.verdict == "proved"]
        by_function = {}
        for r in rows:
            by_function.setdefault((r.function_start, r.function), []).append(
                (r.address - r.function_start, r.length, r.verdict, site_mask(r.sites) if r.sites else None))
        assert [((start, name), rs) for _, start, name, _, rs in store.function_verdicts(iid)] == \
            list(by_function.items())  # the packed and the full rows, as iter_rows gives them
        plan = store.db.execute("EXPLAIN QUERY PLAN SELECT function FROM function_outcomes WHERE outcome=? AND weak",
                                (1,)).fetchall()
        assert "function_outcomes_weak" in str(plan)
    finally:
        store.close()


def test_site_kinds_round_trip():
    for kinds in [(), ("bug",), ("alternative", "fentry"), SITE_KINDS]:
        assert site_kinds(site_mask(kinds)) == tuple(kinds)
