"""The engine over real kernels: totals add up, kill -9 resumes to the same
results, a warm proof cache proves nothing again, faults stay contained."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relocverify.cli import main
from relocverify.engine import pipeline
from relocverify.schedule.progress import Progress
from relocverify.engine.run import RunOptions, run
from relocverify.image.fetch import fetch, stripped_copy
from relocverify.image.functions import count_instructions, find_functions
from relocverify.image.loader import load_image
from relocverify.store.store import Results, Store

TRAMP = 0xFFFFFFFFC0001000
EXPECTED = Path(__file__).resolve().parent.parent / "corpora" / "expected"


@pytest.fixture(scope="module")
def cloud():
    return fetch("debian-6.1-cloud")


def _run(image, db, jobs=2, timeout_s=10.0, limit=None, cache=None, progress=None, reuse_rows=True):
    return run(image, str(db), RunOptions(TRAMP, jobs, timeout_s, limit, True, None if cache is None else str(cache),
                                          reuse_rows=reuse_rows), progress)


def _rows(db) -> list[tuple]:
    store = Results(str(db))
    try:
        image = store.find_image()
        return [(r.address, r.length, r.verdict, r.reason_key, r.plan_kind, r.rule, r.raw) for r in store.iter_rows(image)]
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["elf", "bzimage+map", "stripped"])
def test_totals_add_up_in_every_input_mode(cloud, tmp_path, mode):
    if mode == "elf":
        image = load_image(cloud.vmlinux)
    elif mode == "bzimage+map":
        image = load_image(cloud.vmlinuz, cloud.system_map)
    else:
        image = load_image(stripped_copy(cloud.vmlinux, tmp_path / "vmlinux.stripped"))
    functions = find_functions(image)[:40 if mode == "stripped" else 400]
    expected = sum(count_instructions(image, f) for f in functions)
    summary = _run(image, tmp_path / "s.sqlite", limit=len(functions))
    assert summary["instructions"] == expected == sum(summary["by_verdict"].values())
    assert summary["totals_add_up"]
    assert set(summary["by_verdict"]) == {"proved", "opaque", "unknown", "rejected", "refuted"}
    assert summary["by_verdict"]["refuted"] == 0
    assert sum(n for d in summary["by_section"].values() for n in d.values()) == expected
    assert summary["by_verdict"]["proved"] > 0.9 * expected


@pytest.mark.slow
def test_whole_cloud_kernel_matches_the_recorded_counts(cloud, tmp_path):
    """Every instruction of the Debian 6.1 cloud vmlinux gets one verdict, the
    totals add up, and the counts and every instruction's results are the recorded
    ones (corpora/expected); the store stays within 40 bytes per instruction."""
    expected = json.loads((EXPECTED / "debian-6.1-cloud.json").read_text())
    db = tmp_path / "s.sqlite"
    summary = _run(load_image(cloud.vmlinux), db, cache=tmp_path / "cache")
    assert summary["totals_add_up"] and summary["instructions"] == expected["instructions"]
    assert summary["by_verdict"] == expected["by_verdict"]
    assert summary["alternative_replacements"]["by_verdict"] == expected["alternative_replacements"]
    store = Store(str(db))
    try:
        assert store.results_digest(store.find_image()) == expected["results_sha256"], \
            "a verdict, reason, plan or variant of some instruction changed (corpora/expected says when this may be)"
    finally:
        store.close()
    for f in Path(str(db) + "-wal"), Path(str(db) + "-shm"):
        assert not f.exists() or f.stat().st_size < 1 << 20
    assert db.stat().st_size / summary["instructions"] <= 40


@pytest.mark.slow
def test_kill_9_then_rerun_equals_an_uninterrupted_run(cloud, tmp_path):
    limit = "8000"
    base = [sys.executable, "-m", "relocverify", "vmlinux", cloud.vmlinux, "--limit", limit, "--jobs", "2",
            "--no-progress", "--no-cache"]
    killed_db, clean_db = tmp_path / "killed.sqlite", tmp_path / "clean.sqlite"
    proc = subprocess.Popen(base + ["--db", str(killed_db)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        time.sleep(0.1)
        if _finished_functions(killed_db) > 0:
            break  # the first functions are written (in the store or a worker's shard): kill now
    assert proc.poll() is None, "the run finished before it could be killed: raise the limit"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    from relocverify.store.shard import leftover_shards

    assert leftover_shards(str(killed_db)), "the killed run left its workers' shards"
    partial = _finished_functions(killed_db)
    assert 0 < partial
    assert subprocess.run(base + ["--db", str(killed_db)], capture_output=True).returncode == 0
    assert subprocess.run(base + ["--db", str(clean_db)], capture_output=True).returncode == 0
    killed, clean = _rows(killed_db), _rows(clean_db)
    assert not leftover_shards(str(killed_db)), "the rerun merged them"
    assert killed == clean
    con = sqlite3.connect(killed_db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    statuses = [r[0] for r in con.execute("SELECT status FROM runs ORDER BY id")]
    con.close()
    assert statuses == ["killed", "complete"], "the killed run is marked so by the next run"


@pytest.mark.slow
def test_rows_made_by_a_worker_that_did_not_survey_them_are_the_same(cloud, tmp_path, monkeypatch):
    """The rows phase's tasks are stealable (``local_pool._Dispatch.steal``): a worker may make the rows of
    functions another surveyed, walking their keys again and making their function keys itself.  Here the first
    worker is given every rows task and the second takes from the end of its queue: the rows, and the
    functions kept for the proof cache, are those of a run in which no task moves."""
    import sqlite3

    from relocverify.engine.phases import rows as rows_phase
    from relocverify.schedule import local_pool

    image = load_image(cloud.vmlinux)
    monkeypatch.setattr(local_pool._Dispatch, "steal", lambda self, i: None)
    _run(image, tmp_path / "a.sqlite", limit=1500, cache=tmp_path / "ca")
    monkeypatch.undo()
    queues = rows_phase.Rows.queues

    def all_on_the_first(self, pool):
        got = queues(self, pool)
        moved = [t for q in got[1:] for t in q if t.method == "rows"]
        return [got[0] + moved] + [[t for t in q if t.method != "rows"] for q in got[1:]]

    monkeypatch.setattr(rows_phase.Rows, "queues", all_on_the_first)
    _run(image, tmp_path / "b.sqlite", limit=1500, cache=tmp_path / "cb")
    assert _rows(tmp_path / "a.sqlite") == _rows(tmp_path / "b.sqlite")

    def kept(cache):
        db = sqlite3.connect(str(cache / "proofs.sqlite"))
        try:
            return {k for (k,) in db.execute("SELECT key FROM function_rows")}
        finally:
            db.close()

    assert kept(tmp_path / "ca") == kept(tmp_path / "cb") and len(kept(tmp_path / "ca")) > 1000


def _finished_functions(db) -> int:
    """Functions written so far: in the store, and in the workers' shards next to it."""
    from relocverify.store.shard import leftover_shards

    n = 0
    for path, sql in [(db, "SELECT count(*) FROM functions WHERE config IS NOT NULL")] + \
            [(p, "SELECT count(*) FROM done") for p in leftover_shards(str(db))]:
        try:
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            n += con.execute(sql).fetchone()[0]
            con.close()
        except sqlite3.Error:
            pass
    return n


def test_bad_image_is_a_one_line_error(tmp_path, capsys):
    bad = tmp_path / "garbage"
    bad.write_bytes(b"\x7fELF" + b"\xff" * 100)
    assert main(["vmlinux", str(bad), "--db", str(tmp_path / "s.sqlite"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("relocverify: error:")


def test_missing_file(tmp_path, capsys):
    assert main(["vmlinux", str(tmp_path / "nope"), "--no-progress"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# --- a small real ELF built here ---------------------------------------------------

SMALL_ASM = r"""
    .section .text, "ax"
    .globl f_plain
    .type f_plain, @function
f_plain:
    push %rbp
    mov %rsp, %rbp
    mov 0x10(%rip), %rax
    add %rbx, %rax
    pop %rbp
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

    .globl f_loop
    .type f_loop, @function
f_loop:
    loop f_loop
    call f_plain
    ret
    .size f_loop, .-f_loop

    .globl f_twice
    .type f_twice, @function
f_twice:
    add $0x10, %rsp
    add $0x20, %rsp
    mov 0x18(%rdi), %rax
    mov 0x28(%rdi), %rax
    ret
    .size f_twice, .-f_twice
"""
SMALL_LDS = """
SECTIONS {
  . = 0xffffffff81000000;
  .text : { *(.text) }
  /DISCARD/ : { *(.note.gnu.property) *(.comment) }
}
"""


@pytest.fixture()
def small(tmp_path):
    import elfbuild

    return load_image(elfbuild.build_elf(tmp_path, SMALL_ASM, SMALL_LDS))


def _run_small(image, tmp_path, jobs=2, timeout_s=10.0, cache=None, db="s.sqlite", reuse_rows=True):
    summary = _run(image, tmp_path / db, jobs=jobs, timeout_s=timeout_s, cache=cache, reuse_rows=reuse_rows)
    store = Results(str(tmp_path / db))
    rows = {r.address: r for r in store.iter_rows(store.find_image(image.identity))}
    store.close()
    return summary, rows


@pytest.mark.parametrize("jobs", [1, 2])
def test_small_image_all_verdicts_add_up(small, tmp_path, jobs):
    summary, rows = _run_small(small, tmp_path, jobs=jobs)
    assert summary["totals_add_up"] and summary["instructions"] == len(rows) == 19
    assert {r.verdict for r in rows.values()} <= {"proved", "opaque"}
    assert next(r for r in rows.values() if r.klass == "cpuid").verdict == "opaque"
    # one proof per instance key: 19 instructions, 14 keys (the three rets share one; the two adds of
    # f_twice share one, their immediates zeroed; so do its two loads, their displacements zeroed)
    assert summary["run"]["proof_cache"]["proved"] == summary["run"]["proof_cache"]["keys"] == 14


def test_a_warm_cache_proves_nothing_again(small, tmp_path):
    """A second run into a new store copies every function's rows the first one kept (``row_memo``);
    told not to, it walks them, and every key is known."""
    cache = tmp_path / "cache"
    first, rows1 = _run_small(small, tmp_path, cache=cache, db="a.sqlite")
    second, rows2 = _run_small(small, tmp_path, cache=cache, db="b.sqlite")
    third, rows3 = _run_small(small, tmp_path, cache=cache, db="c.sqlite", reuse_rows=False)
    assert first["run"]["proof_cache"]["proved"] > 0
    assert first["run"]["proof_cache"]["functions_reused"] == 0
    assert second["run"]["proof_cache"]["proved"] == 0
    assert second["run"]["proof_cache"]["functions_reused"] == second["functions"] > 0
    assert third["run"]["proof_cache"]["proved"] == third["run"]["proof_cache"]["functions_reused"] == 0
    assert third["run"]["proof_cache"]["cached"] == first["run"]["proof_cache"]["keys"]
    assert [(r.verdict, r.reason) for r in rows1.values()] == [(r.verdict, r.reason) for r in rows2.values()]
    assert any(r.fresh for r in rows1.values()) and not any(r.fresh for r in rows2.values())
    assert rows2 == rows3


def test_the_same_command_again_answers_from_the_store(small, tmp_path):
    first, _ = _run_small(small, tmp_path)
    again, _ = _run_small(small, tmp_path)
    assert again["run"]["again"] == first["run"]["id"] and again["by_verdict"] == first["by_verdict"]


def test_the_same_command_again_does_not_load_the_image(small, tmp_path, monkeypatch):
    """A repeated ``vmlinux`` command finds its answer by the image's remembered identity, without
    loading the image; a changed file, or one whose hash is not remembered, is loaded and verified."""
    import shutil

    from relocverify.engine.requests import KernelRequest
    from relocverify.engine.verify import verify
    from relocverify.image import loader

    monkeypatch.setenv("RELOCVERIFY_CACHE", str(tmp_path / "home"))  # the identity memo starts empty
    path = tmp_path / "again" / "vmlinux"
    path.parent.mkdir()
    shutil.copy(small.path, path)
    options = RunOptions(TRAMP, 1, 10.0)
    db = str(tmp_path / "v.sqlite")
    first = verify(KernelRequest(str(path), options, db))
    real = loader.load_image

    def refuse(*args, **kwargs):
        raise AssertionError("the image was loaded again")

    monkeypatch.setattr(loader, "load_image", refuse)
    second = verify(KernelRequest(str(path), options, db))
    assert second.document["run"]["again"] == first.document["run"]["id"]
    assert second.by_verdict == first.by_verdict and second.complete
    path.write_bytes(path.read_bytes())  # the same bytes, written again: no longer known by its status
    assert loader.remembered_identity(path) is None
    with pytest.raises(AssertionError, match="loaded again"):
        verify(KernelRequest(str(path), options, db))
    monkeypatch.setattr(loader, "load_image", real)
    third = verify(KernelRequest(str(path), options, db))  # hashed again: the same image, nothing to do
    assert third.document["run"]["again"] == second.document["run"]["id"] and third.by_verdict == first.by_verdict
    assert loader.remembered_identity(path) == small.identity


ANSWERS_ASM = "".join(f"""
    .globl f_{i}
    .type f_{i}, @function
f_{i}:
    movw %cx, {disp:#x}(%rsp)
    ret
    .size f_{i}, .-f_{i}
""" for i, disp in enumerate((0x80, 0x9E, 0x164)))


def test_each_row_keeps_its_own_decoder_answers(tmp_path, monkeypatch):
    """Three instances of one key (a 16-bit store whose displacement the key zeroes), on which capstone's and
    iced's answers disagree (capstone's 2-byte displacement): each row keeps its own instruction's answers,
    not those of the instance its key was proved on, so the results do not depend on how the functions were
    split between the workers (one function per task here: one worker's representative is its last task's
    instance, two workers have one each)."""
    import elfbuild

    from relocverify.engine.phases import sizes
    from relocverify.engine.pipeline import answers_json
    from relocverify.x86.decode import decode

    image = load_image(elfbuild.build_elf(tmp_path, ".section .text, \"ax\"\n" + ANSWERS_ASM, SMALL_LDS))
    monkeypatch.setattr(sizes, "CHUNK_FUNCTIONS", 1)
    digests = []
    for jobs in (1, 2):
        summary = _run(image, tmp_path / f"{jobs}.sqlite", jobs=jobs)
        assert summary["totals_add_up"] and summary["run"]["proof_cache"]["proved"] == 2  # the store's key, ret's
        store = Results(str(tmp_path / f"{jobs}.sqlite"))
        image_id = store.find_image(image.identity)
        rows = [r for r in store.iter_rows(image_id) if r.answers is not None]
        digests.append(store.results_digest(image_id))
        store.close()
        assert len(rows) == 3 and len({r.answers for r in rows}) == 3
        for r in rows:
            assert r.answers == answers_json(decode(r.raw, r.address))
            disp = int.from_bytes(r.raw[4:8], "little")
            assert f" {disp:#x}(%rsp)" in json.loads(r.answers)["answers"]["capstone"]["text"]
    assert digests[0] == digests[1]


def test_a_crashing_worker_leaves_the_instruction_unknown_and_the_run_goes_on(small, tmp_path, monkeypatch):
    """Fault injection: verifying cpuid kills the worker process (os._exit)."""
    real = pipeline.Prover.verify

    def crash_on_cpuid(self, raw, address):
        if raw == b"\x0f\xa2":
            os._exit(1)
        return real(self, raw, address)

    monkeypatch.setattr(pipeline.Prover, "verify", crash_on_cpuid)
    summary, rows = _run_small(small, tmp_path)
    assert summary["totals_add_up"] and len(rows) == 19
    cpuid = next(r for r in rows.values() if r.raw == b"\x0f\xa2")
    assert cpuid.verdict == "unknown" and "crashed" in cpuid.reason
    assert all(r.verdict == "proved" for r in rows.values() if r.raw != b"\x0f\xa2")


def test_a_worker_dying_as_it_takes_the_proofs_findings_changes_no_verdict(small, tmp_path, monkeypatch):
    """Fault injection: a worker dies in ``accept``, the first task of its rows queue; the worker forked in
    its place is given every finding and writes the same rows as an undisturbed run."""
    from relocverify.engine.worker import Worker

    clean_summary, clean = _run_small(small, tmp_path, db="clean.sqlite")
    real = Worker.accept
    mark = tmp_path / "died"

    def die_once(self, learned):
        if not mark.exists():
            mark.touch()
            os._exit(1)
        return real(self, learned)

    monkeypatch.setattr(Worker, "accept", die_once)
    summary, rows = _run_small(small, tmp_path, db="died.sqlite")
    assert mark.exists() and summary["totals_add_up"]
    assert summary["by_verdict"] == clean_summary["by_verdict"]
    assert {a: (r.verdict, r.reason) for a, r in rows.items()} == {a: (r.verdict, r.reason) for a, r in clean.items()}


def test_a_hanging_proof_is_unknown_after_the_timeout(small, tmp_path, monkeypatch):
    """Fault injection: proving the loop hangs; the watchdog ends it and the run goes on."""
    real = pipeline.prove_plan

    def hang_on_loop(decoded, plan, timeout_ms, smt=None):
        if decoded.opname == "loop":
            time.sleep(60)
        return real(decoded, plan, timeout_ms, smt)

    monkeypatch.setattr(pipeline, "prove_plan", hang_on_loop)
    t0 = time.time()
    summary, rows = _run_small(small, tmp_path, timeout_s=0.5)
    assert time.time() - t0 < 30
    loop = next(r for r in rows.values() if r.klass == "loop")
    assert loop.verdict == "unknown" and loop.reason.startswith("timeout")
    assert summary["totals_add_up"]


def test_progress_off_a_terminal_is_one_plain_line_per_phase(small, tmp_path):
    import io

    stream = io.StringIO()
    _run(small, tmp_path / "s.sqlite", progress=Progress(True, stream, tty=False))
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text, "no bar, no control sequence in a log"
    lines = text.splitlines()
    assert {line.split(":")[0] for line in lines} >= {"survey", "proofs", "rows"}
    assert all(len(line) < 200 for line in lines)
    assert sum(line.startswith("survey:") for line in lines) == 1, "no progress lines, one line when it ends"


def test_progress_on_a_terminal_is_a_rich_bar_then_one_line():
    import io

    stream = io.StringIO()
    p = Progress(True, stream, tty=True)
    p.phase("survey", 10, "instructions")
    p.last -= 1
    p.update(5)
    p.note("a note")
    p.end()
    text = stream.getvalue()
    assert "\x1b[" in text, "drawn with terminal control sequences"
    assert "5/10" in text and "a note" in text
    import re

    last = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text.rstrip("\n").splitlines()[-1].split("\r")[-1])
    assert last.startswith("survey: 10 instructions in "), "the bar is cleared and one line stays"


def test_a_worker_crashing_on_jump_probes_refuses_that_function_and_the_run_goes_on(small, tmp_path, monkeypatch):
    """Fault injection for the jump-probe phase: answering for the function holding cpuid kills the
    worker; its instructions are refused as error:crashed, every other function is answered."""
    from relocverify.engine import jumps

    real = jumps.JumpProver.packed

    def crash_on_cpuid(self, fid, fn, data, *rest):
        if b"\x0f\xa2" in data:
            os._exit(1)
        return real(self, fid, fn, data, *rest)

    monkeypatch.setattr(jumps.JumpProver, "packed", crash_on_cpuid)
    summary = run(small, str(tmp_path / "j.sqlite"), RunOptions(TRAMP, 2, 10.0, None, True, None, jump_probes=True))
    jump = summary["jump_probe"]
    assert jump["totals_add_up"] and jump["instructions"] == summary["instructions"] == 19
    assert 0 < jump["refused"].get("error:crashed", 0) < 19
    assert sum(n for k, n in jump["refused"].items() if k != "error:crashed") + jump["eligible"] > 0


def test_a_warm_cache_answers_jump_probes_from_the_pieces_it_kept(cloud, tmp_path):
    """The jump-probe phase keeps its pieces' answers in the proof cache (``engine.jumps.JumpMemory``):
    a second run into a new store, two workers each loading them, proves no piece again and stores
    the same bucket for every instruction."""
    cache, image = tmp_path / "cache", load_image(cloud.vmlinux)

    def jump_run(db):
        summary = run(image, str(tmp_path / db), RunOptions(TRAMP, 2, 10.0, 120, True, str(cache), jump_probes=True))
        store = Results(str(tmp_path / db))
        try:
            rows = [(start, off, bucket) for start, _, off, bucket in store.jump_rows(store.find_image())]
        finally:
            store.close()
        return summary["jump_probe"], rows

    first, rows1 = jump_run("a.sqlite")
    second, rows2 = jump_run("b.sqlite")
    assert first["totals_add_up"] and first["eligible"] > 1000 and rows1 == rows2
    # what is proved again: the blocks no fast path proves (here each one's answer is unknown)
    assert second["block_proofs"] == sum(n for bucket, n in first["refused"].items() if bucket.startswith("proof:"))
    # most of the first run's proofs are not made again (336 against 40 on this slice; 10 times as many before an
    # operand blind to its alignment was keyed without it, when each alignment of a piece was proved on its own)
    assert first["block_proofs"] > 5 * max(1, second["block_proofs"])
