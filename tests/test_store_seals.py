"""A store's findings are sealed (``store.row_seals``): whatever edits a stored verdict outside relocverify's
writer (an ``UPDATE`` of an outcome, a row's outcome id, a packed blob, a function's bytes or configuration,
a run's summary) is detected by every reader that turns verdicts into claims (show, export, report, run),
which refuse the store in one line with exit 2; a run on the store verifies the altered functions again
(issue 44: a verdict updated from rejected to proved was exported as a safe probe point).

The edits are generated: Hypothesis picks a table, a row and a change."""

from __future__ import annotations

import io
import shutil
import sqlite3
import struct

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from relocverify import cli
from relocverify.errors import StoreError
from relocverify.store.store import Results

ASM = r"""
    .section .text, "ax"
    .globl f_irq
    .type f_irq, @function
f_irq:
    push %rbp
    sti
    pop %rbp
    ret
    .size f_irq, .-f_irq

    .globl f_plain
    .type f_plain, @function
f_plain:
    mov 0x10(%rip), %rax
    add %rbx, %rax
    ret
    .size f_plain, .-f_plain

    .globl f_cpuid
    .type f_cpuid, @function
f_cpuid:
    xor %eax, %eax
    cpuid
    jle 1f
    nop
1:  ret
    .size f_cpuid, .-f_cpuid
"""
LDS = """
SECTIONS {
  . = 0xffffffff81000000;
  .text : { *(.text) }
  /DISCARD/ : { *(.note.gnu.property) *(.comment) }
}
"""


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return cli.main(list(argv), out, err), out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import elfbuild

    d = tmp_path_factory.mktemp("seals")
    image = str(elfbuild.build_elf(d, ASM, LDS))
    db = str(d / "s.sqlite")
    assert _cli("vmlinux", image, "--db", db, "--no-progress", "--no-cache")[0] in (0, 1)
    return image, db


def _copy(db: str, to) -> str:
    path = str(to / "t.sqlite")
    shutil.copy(db, path)
    return path


def _checks(path: str) -> bool:
    store = Results(path)
    try:
        store.check_seals()
        return True
    except StoreError:
        return False
    finally:
        store.close()


def _flip(blob: bytes, where: int, xor: int) -> bytes:
    i = where % len(blob)
    return blob[:i] + bytes([blob[i] ^ xor]) + blob[i + 1:]


VERDICTS = ("proved", "opaque", "unknown", "rejected", "refuted")


@st.composite
def edits(draw, con: sqlite3.Connection):
    """One edit of a store, as a hand with sqlite3 makes it: (statement, arguments)."""
    fids = [r[0] for r in con.execute("SELECT function FROM packed ORDER BY function")]
    used = sorted({o for (blob,) in con.execute("SELECT outcomes FROM packed")
                   for o in struct.unpack(f"<{len(blob) // 4}i", blob)})
    fid = draw(st.sampled_from(fids))
    where, xor = draw(st.integers(0, 1 << 16)), draw(st.integers(1, 255))
    kind = draw(st.sampled_from(["verdict", "outcome-field", "packed-data", "packed-outcomes", "packed-counts",
                                 "bytes", "config", "image", "copy-row", "drop-seal", "section"]))
    if kind == "verdict":
        oid = draw(st.sampled_from(used))
        now = con.execute("SELECT verdict FROM outcomes WHERE id=?", (oid,)).fetchone()[0]
        return "UPDATE outcomes SET verdict=? WHERE id=?", (draw(st.sampled_from([v for v in VERDICTS if v != now])),
                                                            oid)
    if kind == "outcome-field":
        column = draw(st.sampled_from(["method", "plan_kind", "rule", "klass", "reason_key", "reason"]))
        return f"UPDATE outcomes SET {column}={column} || ? WHERE id=?", (draw(st.text(min_size=1, max_size=3)),
                                                                         draw(st.sampled_from(used)))
    if kind in ("packed-data", "packed-outcomes", "packed-counts"):
        column = kind.split("-")[1]
        blob = con.execute(f"SELECT {column} FROM packed WHERE function=?", (fid,)).fetchone()[0]
        return f"UPDATE packed SET {column}=? WHERE function=?", (_flip(blob, where, xor), fid)
    if kind == "bytes":
        code = con.execute("SELECT bytes FROM functions WHERE id=?", (fid,)).fetchone()[0]
        return "UPDATE functions SET bytes=? WHERE id=?", (_flip(code, where, xor), fid)
    if kind == "section":
        return "UPDATE functions SET section='.init.text' WHERE id=?", (fid,)
    if kind == "config":
        text = con.execute("SELECT text FROM configs").fetchone()[0]
        return "UPDATE configs SET text=?", (text.replace('"policy": "kernel"', '"policy": "user"')
                                             if draw(st.booleans()) else text + " ",)
    if kind == "image":
        return "UPDATE images SET sha256=?", ("0" * 64,)
    if kind == "copy-row":
        other = draw(st.sampled_from([f for f in fids if f != fid]))
        return ("UPDATE packed SET (outcomes, counts, names, variants, sites, data) = (SELECT outcomes, counts, "
                "names, variants, sites, data FROM packed WHERE function=?) WHERE function=?", (other, fid))
    return "DELETE FROM seals WHERE owner=?", (fid,)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_edit_of_a_finding_breaks_its_seal(built, tmp_path_factory, data):
    path = _copy(built[1], tmp_path_factory.mktemp("e"))
    con = sqlite3.connect(path)
    sql, args = data.draw(edits(con))
    try:
        changed = con.execute(sql, args).rowcount
    except sqlite3.IntegrityError:  # the edit would make two outcomes one: SQLite refuses it already
        changed = 0
    con.commit()
    con.close()
    assume(changed)
    assert not _checks(path), (sql, args)


def test_a_store_as_written_passes_and_a_no_op_edit_too(built, tmp_path):
    assert _checks(built[1])
    path = _copy(built[1], tmp_path)
    con = sqlite3.connect(path)
    con.execute("UPDATE outcomes SET verdict=verdict")
    con.execute("UPDATE packed SET data=data")
    con.commit()
    con.close()
    assert _checks(path)


def _forge_sti(path: str) -> None:
    con = sqlite3.connect(path)
    assert con.execute("UPDATE outcomes SET verdict='proved' WHERE klass='sti'").rowcount == 1
    con.commit()
    con.close()


@pytest.mark.parametrize("argv", [
    ["show", "{DB}", "f_irq"],
    ["export", "{DB}", "--format", "bpftrace", "-o", "{OUT}"],
    ["export", "{DB}", "--format", "json"],
    ["report", "{DB}", "-o", "{OUT}"],
    ["run", "--image", "{IMAGE}", "--function", "f_irq", "--db", "{DB}"],
])
def test_every_reader_refuses_a_forged_verdict_in_one_line(built, tmp_path, argv):
    image, db = built
    path = _copy(db, tmp_path)
    _forge_sti(path)
    out = tmp_path / "out"
    code, text, err = _cli(*[a.replace("{DB}", path).replace("{OUT}", str(out)).replace("{IMAGE}", image)
                             for a in argv])
    assert code == 2, err
    assert err.count("\n") == 1 and "altered after relocverify wrote them (first: f_irq)" in err
    assert "f_irq" not in text and not out.exists()


def test_a_run_verifies_the_altered_functions_again(built, tmp_path):
    image, db = built
    path = _copy(db, tmp_path)
    _forge_sti(path)
    code, text, err = _cli("vmlinux", image, "--db", path, "--no-progress", "--no-cache")
    assert code in (0, 1), err
    assert _checks(path)
    code, text, err = _cli("show", path, "f_irq")
    assert code == 0, err
    assert [line.split()[-1] for line in text.splitlines() if line.lstrip().startswith("+0x1 ")] == ["rejected"]


def test_a_summary_edited_by_hand_is_not_repeated(built, tmp_path):
    """A repeated command prints the last run's summary and exits by it: an edited summary is not used, the
    run is made again."""
    image, db = built
    path = _copy(db, tmp_path)
    first = _cli("vmlinux", image, "--db", path, "--no-progress", "--no-cache")
    con = sqlite3.connect(path)
    con.execute("UPDATE runs SET summary=replace(summary, '\"rejected\": 1', '\"rejected\": 0')")
    con.commit()
    con.close()
    again = _cli("vmlinux", image, "--db", path, "--no-progress", "--no-cache")
    assert again[0] == first[0]
    by_verdict = [line for line in again[1].splitlines() if line.startswith("by verdict")]
    assert by_verdict and "rejected 1" in by_verdict[0]


def test_a_store_from_before_seals_is_refused_by_readers(built, tmp_path):
    path = _copy(built[1], tmp_path)
    con = sqlite3.connect(path)
    con.execute("DELETE FROM meta WHERE key='seal_key'")
    con.execute("DROP TABLE seals")
    con.commit()
    con.close()
    code, _, err = _cli("export", path, "--format", "json")
    assert code == 2 and "carry no seals" in err and err.count("\n") == 1


def test_the_tracer_audit_judges_tracers_against_no_altered_verdict(built, tmp_path):
    from relocverify.tracers.audit import Auditor, audit_store

    path = _copy(built[1], tmp_path)
    _forge_sti(path)
    auditor = Auditor([], 0xffffffffc0001000)
    try:
        with pytest.raises(StoreError, match="altered after relocverify wrote them"):
            audit_store(path, auditor)
    finally:
        auditor.close()


def _copied_run(built, tmp_path, monkeypatch) -> tuple[str, list[int]]:
    """A cold run with a proof cache, then one into a new store that copies every function's rows from it; the
    copied run's store, and how many functions its merges sealed from the rows as stored."""
    from relocverify.store import shard

    image = built[0]
    cache = str(tmp_path / "cache")
    assert _cli("vmlinux", image, "--db", str(tmp_path / "cold.sqlite"), "--no-progress", "--cache-dir", cache)[0] \
        in (0, 1)
    sealed = []
    real = shard.seal_functions
    monkeypatch.setattr(shard, "seal_functions", lambda db, where, args=(): sealed.append(real(db, where, args)) or
                        sealed[-1])
    path = str(tmp_path / "copied.sqlite")
    code, _, err = _cli("vmlinux", image, "--db", path, "--no-progress", "--cache-dir", cache, "--summary-json",
                        str(tmp_path / "copied.json"))
    assert code in (0, 1), err
    assert '"functions_reused": 3' in (tmp_path / "copied.json").read_text()
    return path, sealed


def test_copied_rows_carry_the_seals_their_workers_made(built, tmp_path, monkeypatch):
    """A function copied from the proof cache is sealed by the worker that copies it (``engine.row_keeper``),
    and the merge stores that seal: it seals none itself, and every reader finds the seals the store's own
    rows give (the same store as a walk writes: ``test_row_memo``)."""
    path, sealed = _copied_run(built, tmp_path, monkeypatch)
    assert sum(sealed) == 0
    assert _checks(path)
    con = sqlite3.connect(path)
    from relocverify.store import row_seals

    assert row_seals.broken(con) == {} and con.execute("SELECT count(*) FROM seals WHERE owner > 0").fetchone()[0] == 3
    con.close()


def test_a_worker_seal_naming_another_reason_than_the_store_is_not_kept(built, tmp_path, monkeypatch):
    """Seals that name an outcome with another reason than the store holds (two workers defined it with two
    reasons; a worker's own reason for an id the store numbered) are not the store's: the merge seals those
    functions from their rows as stored."""
    from relocverify.engine.row_keeper import RowKeeper

    real = RowKeeper._outcome_ids_of

    def said_otherwise(self, digests, ids):
        got = real(self, digests, ids)
        return got if got is None else got[:4] + ({o: r + " (said otherwise)" for o, r in got[4].items()},)

    monkeypatch.setattr(RowKeeper, "_outcome_ids_of", said_otherwise)
    path, sealed = _copied_run(built, tmp_path, monkeypatch)
    assert sum(sealed) == 3
    assert _checks(path)


def test_a_wrong_worker_seal_is_caught_by_every_reader(built, tmp_path, monkeypatch):
    """The merge keeps a worker's seal as it is: one the rows do not give is a store every reader refuses (so a
    worker's seal is never trusted blindly), and a run verifies the function again."""
    from relocverify.engine import row_keeper

    monkeypatch.setattr(row_keeper, "function_mac", lambda seal, *parts: b"\0" * 16)
    path, sealed = _copied_run(built, tmp_path, monkeypatch)
    assert sum(sealed) == 0
    assert not _checks(path)
    code, _, err = _cli("export", path, "--format", "json")
    assert code == 2 and "altered after relocverify wrote them" in err


def test_a_shard_without_worker_seals_is_sealed_by_the_merge(tmp_path):
    """A shard written before worker seals (no ``seals`` or ``seal_outcomes`` table) holds none."""
    from relocverify.store.row_seals import shard_seals_hold

    con = sqlite3.connect(":memory:")
    con.execute("ATTACH ':memory:' AS old")
    con.execute("CREATE TABLE old.done (function INTEGER PRIMARY KEY, config INTEGER NOT NULL)")
    con.execute("CREATE TEMP TABLE idmap (pid INTEGER PRIMARY KEY, final INTEGER NOT NULL)")
    assert not shard_seals_hold(con, "old", "temp.idmap")


def test_a_worker_that_cannot_read_the_store_leaves_its_copied_rows_to_the_merge(built, tmp_path, monkeypatch):
    """A worker whose read of the store fails (a remote worker without the store's directory) seals nothing;
    the merge seals its copied functions from their rows as stored."""
    from relocverify.engine import row_keeper
    from relocverify.store.sqlite_errors import DatabaseError

    def unreadable(path):
        raise DatabaseError("unable to open database file")

    monkeypatch.setattr(row_keeper, "read_only", unreadable)
    path, sealed = _copied_run(built, tmp_path, monkeypatch)
    assert sum(sealed) == 3
    assert _checks(path)
