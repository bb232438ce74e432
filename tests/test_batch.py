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
