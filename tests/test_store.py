"""The store: what it refuses untouched, what it answers, and how small it stays."""

from __future__ import annotations

import os
import sqlite3
from collections import Counter

import pytest

from relocverify.cli import main
from relocverify.engine.run import RunOptions, run
from relocverify.errors import StoreError
from relocverify.image.loader import load_image
from relocverify.store.store import SITE_KINDS, Results, Store, site_kinds, site_mask

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


@pytest.mark.parametrize("older", ["1", "3"])
def test_an_older_schema_store_is_refused_with_what_to_do(tmp_path, older):
    db = tmp_path / f"v{older}.sqlite"
    con = sqlite3.connect(db)
    con.executescript("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                      "INSERT INTO meta VALUES ('application', 'relocverify');"
                      f"INSERT INTO meta VALUES ('schema', '{older}');"
                      "CREATE TABLE instructions (image TEXT, address INTEGER, verdict TEXT);")
    con.commit()
    con.close()
    before = db.read_bytes()
    with pytest.raises(StoreError, match=f"schema-{older} store.*new --db"):
        Store(str(db))
    assert db.read_bytes() == before


def test_queries_by_address_function_verdict_and_the_function_table(small_store):
    image, db = small_store
    store = Results(str(db))
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
        assert sorted(store.counts(iid)) == sorted(
            (r[0],) + r[1] + (n,) for r, n in Counter(
                (row.section, (row.verdict.value, row.method, row.plan_kind, row.rule, row.klass, row.reason_key))
                for row in rows).items())  # the packed counts add up to the rows
    finally:
        store.close()


def test_site_kinds_round_trip():
    for kinds in [(), ("bug",), ("alternative", "fentry"), SITE_KINDS]:
        assert site_kinds(site_mask(kinds)) == tuple(kinds)


def test_jump_rows_packed_per_function_read_back_with_rows_an_older_store_kept(tmp_path, small_store):
    """``--jump-probes`` answers are written packed, one row per function (``store.jump_rows``); every
    reader gives back what was written, and still reads the one-row-per-instruction ``jump_probes`` of
    stores written before: counts, one instruction, one function, the whole image."""
    import random
    import shutil

    from relocverify.store.jump_rows import pack_jump_row

    _, db = small_store
    copy = tmp_path / "j.sqlite"
    shutil.copy(db, copy)
    store = Store(str(copy))
    try:
        image = store.find_image()
        fids = [r[0] for r in store.db.execute("SELECT id FROM functions WHERE image=? ORDER BY id", (image,))]
        assert len(fids) >= 3
        rng = random.Random(7)
        buckets = ["eligible", "range:site:bug", "block:call-in-range", "proof:unknown"]
        want = {fid: [(off, rng.choice(buckets)) for off in sorted(rng.sample(range(1 << 20), rng.randrange(1, 300)))]
                for fid in fids[1:]}
        store.write_jump_probes([pack_jump_row(fid, rows) for fid, rows in want.items()],
                                {b: f"why {b}" for b in buckets})
        # the first function as an older store kept it: one row per instruction
        old = [(0, "eligible"), (3, "range:exception-table")]
        with store.db:
            store.db.execute("INSERT INTO jump_buckets (name, example) VALUES ('range:exception-table', 'old why')")
            ids = dict(store.db.execute("SELECT name, id FROM jump_buckets"))
            store.db.executemany("INSERT INTO jump_probes VALUES (?,?,?)", [(fids[0], off, ids[b]) for off, b in old])
        want[fids[0]] = old
        assert store.functions_without_jump_probes(image) == []
        for fid, rows in want.items():
            got = store.jump_answers(fid)
            assert got == {off: ids[b] for off, b in rows}
            off, bucket = rng.choice(rows)
            assert store.jump_probe_at(fid, off)[0] == bucket
        assert store.jump_probe_at(fids[1], 1 << 21) is None
        counts: dict[str, int] = {}
        for rows in want.values():
            for _, b in rows:
                counts[b] = counts.get(b, 0) + 1
        assert store.jump_probe_counts(image) == counts and list(store.jump_probe_counts(image).values()) == \
            sorted(counts.values(), reverse=True)
        names = {fid: name for fid, name in store.db.execute("SELECT id, name FROM functions")}
        assert sorted((names[fid], off, b) for fid, rows in want.items() for off, b in rows) == \
            sorted((name, off, b) for _, name, off, b in store.jump_rows(image))
    finally:
        store.close()


def test_a_packed_jump_row_is_its_answers():
    from hypothesis import given, strategies as st

    from relocverify.store.jump_rows import pack_jump_row

    @given(st.lists(st.tuples(st.integers(0, (1 << 32) - 1), st.sampled_from(["eligible", "a", "b", "c"]))))
    def check(answers):
        row = pack_jump_row(5, answers)
        assert row.answers() == answers and len(row) == len(answers) and len(set(row.buckets)) == len(row.buckets)

    check()


def test_a_function_with_more_buckets_than_a_byte_holds_is_refused_in_words():
    from relocverify.store.jump_rows import MAX_BUCKETS, pack_jump_row

    assert len(pack_jump_row(1, [(k, f"b{k}") for k in range(MAX_BUCKETS)]).buckets) == MAX_BUCKETS
    with pytest.raises(StoreError, match="more than 255 jump-probe buckets"):
        pack_jump_row(1, [(k, f"b{k}") for k in range(MAX_BUCKETS + 1)])


def test_the_results_digest_follows_every_decision_and_no_timing(tmp_path, small_store):
    """``results_digest`` is the same for a store verified again (other proof times and fresh marks) and
    changes when one outcome's verdict or reason, or a function's name, changes."""
    import shutil

    image, db = small_store
    again = tmp_path / "again.sqlite"
    run(image, str(again), RunOptions(TRAMP, 1, 10.0, None, True, None))
    first, second = Store(str(db)), Store(str(again))
    try:
        digest = first.results_digest(first.find_image())
        assert second.results_digest(second.find_image()) == digest
    finally:
        first.close()
        second.close()
    for sql in ("UPDATE outcomes SET verdict='unknown' WHERE verdict='proved' AND id=(SELECT min(id) FROM outcomes "
                "WHERE verdict='proved')",
                "UPDATE outcomes SET reason=reason || ' (changed)' WHERE id=(SELECT max(id) FROM outcomes)",
                "UPDATE functions SET name=name || '!' WHERE id=(SELECT min(id) FROM functions)"):
        changed = tmp_path / "changed.sqlite"
        shutil.copy(again, changed)
        con = sqlite3.connect(changed)
        con.execute(sql)
        assert con.total_changes == 1, sql
        con.commit()
        con.close()
        store = Store(str(changed))
        try:
            assert store.results_digest(store.find_image()) != digest, sql
        finally:
            store.close()
        changed.unlink()


def test_a_merges_log_is_checkpointed_behind_and_nothing_is_lost(tmp_path, small_store, monkeypatch):
    """``merge_shards`` leaves the write-ahead log its merge grew to a checkpoint on a thread of its own
    (``_Checkpoint``), which copies all of it into the file while the run reads and writes on; a store whose
    checkpoint never ran holds the same results, and both pass SQLite's integrity check."""
    import threading

    from relocverify.store import store as store_module

    image, db = small_store
    seen: list[tuple] = []
    real_run = store_module._Checkpoint.run

    def run_and_look(self):
        real_run(self)
        con = sqlite3.connect(self.path)
        try:
            seen.append((threading.current_thread() is not threading.main_thread(),
                         con.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()))
        finally:
            con.close()

    monkeypatch.setattr(store_module._Checkpoint, "run", run_and_look)
    behind = tmp_path / "behind.sqlite"
    run(image, str(behind), RunOptions(TRAMP, 2, 10.0, None, True, None))
    assert seen and all(off_main and busy == 0 for off_main, (busy, _, _) in seen)
    monkeypatch.setattr(store_module._Checkpoint, "run", lambda self: None)  # never checkpointed behind
    never = tmp_path / "never.sqlite"
    run(image, str(never), RunOptions(TRAMP, 2, 10.0, None, True, None))
    digests = [_checked_digest(path) for path in (db, behind, never)]
    assert digests[0] == digests[1] == digests[2]


def _checked_digest(path) -> str:
    """The store's results digest, once SQLite's integrity check has passed on it."""
    store = Store(str(path))
    try:
        store.check_integrity()
        return store.results_digest(store.find_image())
    finally:
        store.close()


def _merges_seen(monkeypatch) -> list[bool]:
    """``store.shard.merge`` wrapped to note, for each merge, whether it ran on the main thread (False: behind)."""
    import threading

    from relocverify.store import shard as shard_module

    real_merge = shard_module.merge
    threads: list[bool] = []

    def merge_and_look(con, paths):
        threads.append(threading.current_thread() is threading.main_thread())
        return real_merge(con, paths)

    monkeypatch.setattr(shard_module, "merge", merge_and_look)
    return threads


def _run_failing_merges_behind(monkeypatch, image, path) -> None:
    """A run into ``path`` whose merges behind the workers fail (``store.shard.merge`` made to raise off the main
    thread), as a killed run's do not happen: it raises, its workers' shards left beside the store.  The merge is
    itself again afterwards."""
    import threading

    from relocverify.store import shard as shard_module

    real_merge = shard_module.merge

    def fail_behind(con, paths):
        if threading.current_thread() is not threading.main_thread():
            raise sqlite3.OperationalError("disk I/O error (injected)")
        return real_merge(con, paths)

    monkeypatch.setattr(shard_module, "merge", fail_behind)
    with pytest.raises(sqlite3.OperationalError, match="injected"):
        run(image, str(path), RunOptions(TRAMP, 2, 10.0, None, True, None))
    monkeypatch.setattr(shard_module, "merge", real_merge)


def test_shards_merged_behind_round_by_round_equal_one_merge_and_a_failure_loses_nothing(tmp_path, small_store,
                                                                                         monkeypatch):
    """The rows phase closes its workers' shards in rounds and merges each round on a thread of its own
    (``Store.merge_shards_behind``) while the workers go on: the store holds what one merge at the end gives.
    A merge that fails behind is raised by the run's next merge; its shards stay beside the store, and the
    next run merges them, with the same results."""
    from relocverify.engine.phases import sizes
    from relocverify.store import shard as shard_module

    image, db = small_store
    monkeypatch.setattr(sizes, "CHUNK_FUNCTIONS", 1)  # four functions: two rows tasks per worker
    real_merge, threads = shard_module.merge, _merges_seen(monkeypatch)
    digests = []
    for rounds in (1, 2):
        monkeypatch.setattr(sizes, "ROWS_ROUNDS", rounds)
        threads.clear()
        path = tmp_path / f"rounds-{rounds}.sqlite"
        assert run(image, str(path), RunOptions(TRAMP, 2, 10.0, None, True, None))["totals_add_up"]
        assert (False in threads) == (rounds > 1)  # a round merged behind, off the main thread
        digests.append(_checked_digest(path))
    assert digests[0] == digests[1]

    broken = tmp_path / "broken.sqlite"
    _run_failing_merges_behind(monkeypatch, image, broken)
    from relocverify.store.shard import leftover_shards

    assert leftover_shards(str(broken))  # the round's shards were kept
    monkeypatch.setattr(shard_module, "merge", real_merge)
    assert run(image, str(broken), RunOptions(TRAMP, 2, 10.0, None, True, None))["totals_add_up"]
    assert not leftover_shards(str(broken))
    assert _checked_digest(broken) == digests[0]


@pytest.mark.parametrize("boot", ["this", "another", "none"])
def test_a_killed_run_s_shard_is_merged_only_when_written_in_this_boot(tmp_path, small_store, monkeypatch, boot):
    """Shards are written without waiting for the disk (``store.shard``): a process's end cannot tear one, the
    system's end can.  A shard an earlier run left is merged when its name says it was written in this boot
    (or says no boot), and deleted unread when it names another; either way the store ends as a clean run's."""
    from relocverify.engine.phases import sizes
    from relocverify.store.shard import BOOT, FILES, leftover_shards

    assert BOOT, "this Linux has a boot id"
    image, db = small_store
    monkeypatch.setattr(sizes, "CHUNK_FUNCTIONS", 1)
    monkeypatch.setattr(sizes, "ROWS_ROUNDS", 2)
    path = tmp_path / "left.sqlite"
    _run_failing_merges_behind(monkeypatch, image, path)  # its workers' shards left beside the store
    left = leftover_shards(str(path))
    assert left and all(p.endswith("." + BOOT) for p in left)
    if boot != "this":
        for p in left:
            renamed = p[:-len(BOOT) - 1] + ("." + "0" * 16 if boot == "another" else "")
            for suffix in FILES:
                if os.path.exists(p + suffix):
                    os.rename(p + suffix, renamed + suffix)
    summary = run(image, str(path), RunOptions(TRAMP, 2, 10.0, None, True, None))
    assert summary["totals_add_up"] and not leftover_shards(str(path))
    assert (summary["run"]["resumed"] > 0) == (boot != "another")
    assert _checked_digest(path) == _checked_digest(db)


def test_a_warm_survey_merged_in_rounds_equals_one_merge(tmp_path, small_store, monkeypatch):
    """On a warm proof cache the survey writes every function (its rows copied from the cache) and merges its
    shards in rounds beside the workers, as the rows phase does: the store is what one merge gives, sealed."""
    from relocverify.engine.phases import sizes

    image, _ = small_store
    cache = tmp_path / "cache"
    options = RunOptions(TRAMP, 2, 10.0, None, True, str(cache))
    assert run(image, str(tmp_path / "cold.sqlite"), options)["totals_add_up"]  # the cache keeps the rows
    monkeypatch.setattr(sizes, "CHUNK_FUNCTIONS", 1)  # four functions: two survey tasks per worker
    threads = _merges_seen(monkeypatch)
    digests = []
    for rounds in (1, 2):
        monkeypatch.setattr(sizes, "ROWS_ROUNDS", rounds)
        threads.clear()
        path = tmp_path / f"warm-{rounds}.sqlite"
        summary = run(image, str(path), options)
        assert summary["totals_add_up"] and summary["run"]["proof_cache"]["functions_reused"] == 4
        assert (False in threads) == (rounds > 1)  # a round of the survey merged behind, off the main thread
        digests.append(_checked_digest(path))
        store = Store(str(path))
        try:
            store.check_seals(store.find_image())  # every copied function sealed, by its worker or the merge
        finally:
            store.close()
    assert digests[0] == digests[1] == _checked_digest(tmp_path / "cold.sqlite")


def test_no_fork_while_a_thread_of_ours_is_inside_sqlite():
    """``store.forking``: a fork waits until no thread of ours is inside SQLite (a child forked while one held
    SQLite's process-wide mutexes hung in its first connect), and a thread enters again once it is made."""
    import os
    import threading
    import time

    from relocverify.store.forking import sqlite_work

    inside, left = threading.Event(), []

    def work():
        with sqlite_work():
            con = sqlite3.connect(":memory:")
            con.execute("CREATE TABLE t (x)")
            inside.set()
            time.sleep(0.3)
            con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(1000)])
            con.close()
            left.append(time.monotonic())

    thread = threading.Thread(target=work)
    thread.start()
    inside.wait()
    pid = os.fork()
    if pid == 0:  # the child: SQLite answers here
        try:
            con = sqlite3.connect(":memory:")
            con.execute("SELECT 1").fetchone()
            with sqlite_work():
                pass
        finally:
            os._exit(0)
    forked = time.monotonic()
    thread.join()
    assert left and forked >= left[0]
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    with sqlite_work():  # the parent's threads enter again
        pass


def test_a_closed_store_s_lock_file_names_no_process(tmp_path):
    """The lock file stays beside the store (issue 43: it named the dead pid of a completed run): while a
    writer holds it, it names the writer; once closed, only ``closed`` and how the store was left."""
    import os

    path = str(tmp_path / "s.sqlite")
    store = Store(path)
    assert open(path + ".lock").read().split("\n")[0] == str(os.getpid())
    store.close()
    assert open(path + ".lock").read().split("\n")[0] == "closed"
    again = Store(path)  # opens for writing again: a closed store's file is no "store busy"
    again.close()
