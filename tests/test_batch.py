"""The batch over a real Debian kernel: totals add up, kill -9 resumes to the
same results, bad inputs are one-line errors that leave the store intact."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from relocverify import batch
from relocverify.cli import main
from relocverify.fetch import fetch, stripped_copy
from relocverify.functions import count_instructions, find_functions
from relocverify.image import load_image
from relocverify.store import Store

TRAMP = 0xFFFFFFFFC0001000


@pytest.fixture(scope="module")
def cloud():
    return fetch("debian-6.1-cloud")


def _rows(db: str):
    con = sqlite3.connect(db)
    rows = con.execute("SELECT address, verdict, reason_key, plan_kind, rule, bytes FROM instructions "
                       "ORDER BY address").fetchall()
    con.close()
    return rows


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
    store = Store(str(tmp_path / "s.sqlite"))
    summary = batch.run(image, store, TRAMP, jobs=2, timeout_s=10, limit=len(functions), progress=False)
    store.close()
    assert summary["instructions"] == expected == sum(summary["by_verdict"].values())
    assert summary["totals_add_up"]
    assert set(summary["by_verdict"]) == {"proved", "opaque", "unknown", "rejected", "refuted"}
    assert summary["by_verdict"]["refuted"] == 0
    assert sum(n for d in summary["by_section"].values() for n in d.values()) == expected
    assert summary["by_verdict"]["proved"] > 0.9 * expected


@pytest.mark.slow
def test_kill_9_then_rerun_equals_an_uninterrupted_run(cloud, tmp_path):
    limit = "8000"
    base = [sys.executable, "-m", "relocverify", "vmlinux", cloud.vmlinux, "--limit", limit, "--jobs", "2",
            "--no-progress"]
    killed_db, clean_db = str(tmp_path / "killed.sqlite"), str(tmp_path / "clean.sqlite")
    proc = subprocess.Popen(base + ["--db", killed_db], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        time.sleep(0.1)
        if os.path.exists(killed_db):
            try:
                con = sqlite3.connect(killed_db)
                n = con.execute("SELECT count(*) FROM functions_done").fetchone()[0]
                con.close()
            except sqlite3.OperationalError:
                n = 0
            if n > 0:
                break  # the first functions are stored: kill now
    assert proc.poll() is None, "the run finished before it could be killed: raise the limit"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = len(_rows(killed_db))
    assert 0 < partial
    assert subprocess.run(base + ["--db", killed_db], capture_output=True).returncode == 0
    assert subprocess.run(base + ["--db", clean_db], capture_output=True).returncode == 0
    killed, clean = _rows(killed_db), _rows(clean_db)
    assert len(killed) > partial
    assert killed == clean


def test_bad_image_is_a_one_line_error(tmp_path, capsys):
    bad = tmp_path / "garbage"
    bad.write_bytes(b"\x7fELF" + b"\xff" * 100)
    assert main(["vmlinux", str(bad), "--db", str(tmp_path / "s.sqlite"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("relocverify: error:")


def test_a_file_that_is_not_a_store_is_left_alone(tmp_path, capsys, cloud):
    db = tmp_path / "notes.txt"
    db.write_bytes(b"my notes, not a database\n" * 10)
    before = db.read_bytes()
    assert main(["vmlinux", cloud.vmlinux, "--db", str(db), "--limit", "1", "--no-progress"]) == 2
    assert db.read_bytes() == before
    assert capsys.readouterr().err.count("\n") == 1


def test_missing_file(tmp_path, capsys):
    assert main(["vmlinux", str(tmp_path / "nope"), "--no-progress"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# --- faults inside the batch, on a small real ELF built here --------------------

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


def _run_small(image, tmp_path, jobs=2, timeout_s=10.0):
    store = Store(str(tmp_path / "s.sqlite"))
    summary = batch.run(image, store, TRAMP, jobs=jobs, timeout_s=timeout_s, progress=False)
    rows = {r.address: r for r in store.iter_rows(image.identity)}
    store.close()
    return summary, rows


def test_small_image_all_verdicts_add_up(small, tmp_path):
    summary, rows = _run_small(small, tmp_path)
    assert summary["totals_add_up"] and summary["instructions"] == len(rows) == 14
    assert {r.verdict for r in rows.values()} <= {"proved", "opaque"}
    assert next(r for r in rows.values() if r.klass == "cpuid").verdict == "opaque"


def test_a_crashing_worker_marks_its_function_unknown_and_the_run_goes_on(small, tmp_path, monkeypatch):
    """Fault injection: verifying cpuid kills the worker process (os._exit)."""
    real = batch.verify_instruction

    def crash_on_cpuid(raw, *args, **kw):
        if raw == b"\x0f\xa2":
            os._exit(1)
        return real(raw, *args, **kw)

    monkeypatch.setattr(batch, "verify_instruction", crash_on_cpuid)
    summary, rows = _run_small(small, tmp_path)
    assert summary["totals_add_up"] and len(rows) == 14
    crashed = [r for r in rows.values() if r.function == "f_cpuid"]
    assert crashed and all(r.verdict == "unknown" and "crashed" in r.reason for r in crashed)
    assert all(r.verdict in ("proved",) for r in rows.values() if r.function != "f_cpuid")


def test_a_hanging_proof_is_unknown_after_the_timeout(small, tmp_path, monkeypatch):
    """Fault injection: proving the loop hangs; the watchdog ends it and the run goes on."""
    real = batch.prove_plan

    def hang_on_loop(decoded, plan, **kw):
        if decoded.opname == "loop":
            time.sleep(60)
        return real(decoded, plan, **kw)

    monkeypatch.setattr(batch, "prove_plan", hang_on_loop)
    t0 = time.time()
    summary, rows = _run_small(small, tmp_path, timeout_s=0.5)
    assert time.time() - t0 < 30
    loop = next(r for r in rows.values() if r.klass == "loop")
    assert loop.verdict == "unknown" and loop.reason.startswith("timeout")
    assert summary["totals_add_up"]
