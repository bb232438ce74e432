"""Hardening II, by class: every command that reads a path, given every kind of hostile input at that
path, exits 2 with one line on stderr naming the file, never hangs, never prints a traceback, and
leaves its inputs as they were.  Outputs that are inputs, damaged stores, full and read-only
filesystems, and two processes on one store are here too.

The table is the point: a new command that reads a path gets a row, and every kind of input is tried
on it (a FIFO, a device that never ends, a directory, an empty file, a truncated or garbage file, a
symlink to a FIFO).  The runs are in-process under an alarm, so a hang fails the test instead of the
session."""

from __future__ import annotations

import io
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relocverify.cli import main

ROOT = Path(__file__).resolve().parent.parent
CORPUS = str(ROOT / "corpora" / "decoder_facts.toml")
BOUND_S = 20  # far above any refusal (each is a stat and an open), far below a hang


class _Hung(Exception):
    pass


def _alarm(signum, frame):
    raise _Hung()


def run(argv: list[str]) -> tuple[int, str, str, float]:
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(BOUND_S)
    t0 = time.monotonic()
    try:
        code = main(argv, out, err)
    except _Hung:
        pytest.fail(f"hung for {BOUND_S} s: relocverify {' '.join(argv)}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return code, out.getvalue(), err.getvalue(), time.monotonic() - t0


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    import elfbuild
    import test_engine

    d = tmp_path_factory.mktemp("small")
    return str(elfbuild.build_elf(d, test_engine.SMALL_ASM, test_engine.SMALL_LDS))


@pytest.fixture(scope="module")
def store(small, tmp_path_factory):
    db = str(tmp_path_factory.mktemp("store") / "small.sqlite")
    code, _, err, _ = run(["vmlinux", small, "--db", db, "--no-progress", "--no-cache"])
    assert code == 0, err
    return db


# Each row: a command reading the path {X}; {SMALL} is a good ELF, {STORE} a good store, {OUT} a fresh
# output path in the test's directory.  The kinds of input that the command may accept (package takes a
# directory) are named in the last column.
COMMANDS = [
    ("vmlinux", ["vmlinux", "{X}", "--db", "{OUT}.sqlite", "--no-progress", "--no-cache"], ()),
    ("vmlinux --system-map", ["vmlinux", "{SMALL}", "--system-map", "{X}", "--db", "{OUT}.sqlite",
                              "--no-progress", "--no-cache"], ()),
    ("elf", ["elf", "{X}", "--db", "{OUT}.sqlite", "--no-progress", "--no-cache"], ()),
    ("module", ["module", "{X}", "--kernel", "{SMALL}", "--db", "{OUT}.sqlite", "--no-progress"], ()),
    ("module --kernel", ["module", "{SMALL}", "--kernel", "{X}", "--db", "{OUT}.sqlite", "--no-progress"], ()),
    ("package", ["package", "{X}", "--db", "{OUT}.sqlite", "--no-progress"], ("directory",)),
    ("check --image", ["check", "--image", "{X}", "f_plain"], ()),
    ("show", ["show", "{X}", "f_plain"], ()),
    ("show --system-map", ["show", "{SMALL}", "f_plain", "--system-map", "{X}"], ()),
    ("export", ["export", "{X}", "--format", "json", "-o", "{OUT}.json"], ()),
    ("report", ["report", "{X}", "-o", "{OUT}"], ()),
    ("report --baseline", ["report", "{STORE}", "--baseline", "{X}", "-o", "{OUT}"], ()),
    ("run --image", ["run", "--image", "{X}", "--function", "f_plain"], ()),
    ("run --db", ["run", "--image", "{SMALL}", "--function", "f_plain", "--db", "{X}"], ()),
    ("corpus run", ["corpus", "run", "{X}"], ()),
    ("gate --corpus", ["gate", "--decoder", "iced", "--corpus", "{X}", "--baseline", "{OUT}.json",
                       "--update-baseline"], ()),
    ("gate --baseline", ["gate", "--decoder", "iced", "--corpus", CORPUS, "--baseline", "{X}"], ()),
    ("audit", ["audit", "{X}", "--tracer", "kinst", "--db", "{OUT}.sqlite", "--no-progress", "--no-cache"], ()),
    ("audit --system-map", ["audit", "{SMALL}", "--tracer", "kinst", "--system-map", "{X}", "--db",
                            "{OUT}.sqlite", "--no-progress", "--no-cache"], ()),
    ("gate --image", ["gate", "--decoder", "iced", "--image", "{X}", "--baseline", "{OUT}.json",
                      "--update-baseline"], ()),
]


def _fifo(d: Path) -> str:
    p = d / "fifo"
    os.mkfifo(p)
    return str(p)


def _symlink_to_fifo(d: Path) -> str:
    link = d / "link"
    link.symlink_to(_fifo(d))
    return str(link)


def _directory(d: Path) -> str:
    p = d / "dir"
    p.mkdir()
    return str(p)


def _empty(d: Path) -> str:
    p = d / "empty"
    p.write_bytes(b"")
    return str(p)


def _truncated_elf(d: Path, small: str) -> str:
    p = d / "truncated"
    p.write_bytes(Path(small).read_bytes()[:200])
    return str(p)


def _truncated_store(d: Path, store: str) -> str:
    p = d / "truncated.sqlite"
    p.write_bytes(Path(store).read_bytes()[:3000])
    return str(p)


def _garbage(d: Path) -> str:
    p = d / "garbage"
    p.write_bytes(bytes((i * 37 + 11) % 256 for i in range(8192)))
    return str(p)


KINDS = {
    "fifo": lambda d, small, store: _fifo(d),
    "symlink-to-fifo": lambda d, small, store: _symlink_to_fifo(d),
    "dev-zero": lambda d, small, store: "/dev/zero",
    "directory": lambda d, small, store: _directory(d),
    "empty": lambda d, small, store: _empty(d),
    "truncated-elf": lambda d, small, store: _truncated_elf(d, small),
    "truncated-store": lambda d, small, store: _truncated_store(d, store),
    "garbage": lambda d, small, store: _garbage(d),
}


def _fingerprint(path: str):
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not os.path.isfile(path) or os.path.islink(path):
        return (st.st_mode, st.st_size)
    return (st.st_mode, st.st_size, st.st_mtime_ns, Path(path).read_bytes())


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("name,argv,accepts", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_command_refuses_every_hostile_input(name, argv, accepts, kind, small, store, tmp_path):
    if kind in accepts:
        return  # a kind this command reads by design: its own tests cover it (package DIR)
    x = KINDS[kind](tmp_path, small, store)
    out = str(tmp_path / "out")
    args = [a.format(X=x, SMALL=small, STORE=store, OUT=out) for a in argv]
    before = {p: _fingerprint(p) for p in (x, small, store)}
    code, stdout, err, took = run(args)
    assert code == 2, (args, code, stdout[-300:], err)
    assert err.count("\n") == 1 and err.startswith("relocverify: error: "), err
    assert "Traceback" not in err and "internal error" not in err, err
    shown = x if kind != "symlink-to-fifo" else os.path.dirname(x)
    assert shown in err or os.path.basename(x) in err, f"the error does not name the file: {err}"
    assert {p: _fingerprint(p) for p in (x, small, store)} == before, "an input changed"
    assert took < BOUND_S


# --- outputs that are inputs -----------------------------------------------------------------------

def test_an_output_that_is_an_input_is_refused_and_the_input_kept(small, store, tmp_path):
    copy = tmp_path / "copy.elf"
    shutil.copy(small, copy)
    link = tmp_path / "link.json"
    link.symlink_to(copy)
    hard = tmp_path / "hard.json"
    os.link(copy, hard)
    db = tmp_path / "db.sqlite"
    shutil.copy(store, db)
    cases = [
        ["vmlinux", str(copy), "--db", str(db), "--summary-json", str(copy), "--no-progress"],
        ["vmlinux", str(copy), "--db", str(db), "--summary-json", str(link), "--no-progress"],
        ["vmlinux", str(copy), "--db", str(db), "--summary-json", str(hard), "--no-progress"],
        ["vmlinux", str(copy), "--db", str(db), "--summary-json", str(db), "--no-progress"],
        ["vmlinux", str(copy), "--db", str(tmp_path / "." / "copy.elf"), "--no-progress"],
        ["report", str(db), "-o", str(tmp_path)],
        ["export", str(db), "--format", "json", "-o", str(db)],
    ]
    before = (copy.read_bytes(), db.read_bytes())
    for argv in cases:
        code, _, err, _ = run(argv)
        assert code == 2 and err.count("\n") == 1, (argv, code, err)
    assert (copy.read_bytes(), db.read_bytes()) == before


def test_a_report_never_overwrites_someone_elses_index_html(store, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<html>my home page</html>")
    code, _, err, _ = run(["report", store, "-o", str(site)])
    assert code == 2 and "index.html" in err, err
    assert (site / "index.html").read_text() == "<html>my home page</html>"


# --- damaged stores and hostile environments --------------------------------------------------------

def _damaged(store: str, tmp: Path, how: str) -> str:
    p = tmp / f"{how}.sqlite"
    shutil.copy(store, p)
    con = sqlite3.connect(p)
    if how == "missing-table":
        con.execute("DROP TABLE runs")
    con.commit()
    con.close()
    if how == "corrupt-page":  # the cells of the packed rows' root page scrambled
        con = sqlite3.connect(p)
        root, = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'packed'").fetchone()
        page, = con.execute("PRAGMA page_size").fetchone()
        con.close()
        data = bytearray(p.read_bytes())
        for i in range((root - 1) * page + 8, root * page):
            data[i] ^= 0x5A
        p.write_bytes(bytes(data))
    return str(p)


@pytest.mark.parametrize("how", ["missing-table", "corrupt-page"])
@pytest.mark.parametrize("command", ["report", "export", "show", "vmlinux"])
def test_a_damaged_store_is_an_input_error_and_nothing_is_written(store, small, tmp_path, how, command):
    db = _damaged(store, tmp_path, how)
    before = Path(db).read_bytes()
    out = tmp_path / "out"
    argv = {"report": ["report", db, "-o", str(out)],
            "export": ["export", db, "--format", "json", "-o", str(out)],
            "show": ["show", db, "f_plain"],
            "vmlinux": ["vmlinux", small, "--db", db, "--no-progress", "--no-cache"]}[command]
    code, _, err, _ = run(argv)
    assert code == 2, (argv, code, err)
    assert err.count("\n") == 1 and db in err and "internal error" not in err, err
    assert not out.exists(), "something half-written was left behind"
    assert Path(db).read_bytes() == before


def test_dev_full_as_an_output_is_refused(store):
    code, _, err, _ = run(["export", store, "--format", "json", "-o", "/dev/full"])
    assert code == 2 and "/dev/full" in err, err


def test_a_limit_beyond_64_bits_is_a_usage_error(small, tmp_path):
    code, _, err, _ = run(["vmlinux", small, "--db", str(tmp_path / "x.sqlite"), "--limit", str(1 << 70)])
    assert code == 2 and err.count("\n") == 1, err


def _can_mount_tmpfs() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.fixture()
def small_fs(tmp_path):
    """A 2 MB tmpfs (root only): a filesystem that fills up, and can be remounted read-only."""
    if not _can_mount_tmpfs():
        pytest.skip("mounting a small tmpfs needs root")
    where = tmp_path / "fs"
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_filesystem_is_an_environment_error_with_nothing_half_written(store, small_fs):
    fd = os.open(small_fs / "filler", os.O_WRONLY | os.O_CREAT)  # every block taken
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    for argv in (["report", store, "-o", str(small_fs / "report")],
                 ["export", store, "--format", "json", "-o", str(small_fs / "points.json")]):
        code, _, err, _ = run(argv)
        assert code == 2 and err.count("\n") == 1, (argv, code, err)
        assert "internal error" not in err and str(small_fs) in err, err
    left = sorted(str(p.relative_to(small_fs)) for p in small_fs.rglob("*") if p.name != "filler")
    assert all(p == "report" or p.startswith("report/") for p in left), left  # nothing but what report made
    assert not [p for p in left if "tmp" in p], left  # no temporary file left


def test_a_read_only_filesystem_is_an_environment_error(store, small, small_fs):
    db = small_fs / "ro.sqlite"
    shutil.copy(store, db)
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    before = db.read_bytes()
    code, _, err, _ = run(["vmlinux", small, "--db", str(db), "--no-progress", "--no-cache"])
    assert code == 2 and err.count("\n") == 1 and "internal error" not in err, err
    assert db.read_bytes() == before
    code, _, err, _ = run(["export", str(db), "--format", "json", "-o", str(small_fs / "e.json")])
    assert code == 2 and err.count("\n") == 1 and "internal error" not in err, err


# --- two processes on one store --------------------------------------------------------------------

def test_two_runs_on_one_store_then_a_third_always_works(small, tmp_path):
    db = str(tmp_path / "shared.sqlite")
    argv = [sys.executable, "-m", "relocverify", "vmlinux", small, "--db", db, "--no-progress", "--no-cache"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    for code, err in results:
        assert code in (0, 2), results  # stored, or "store busy" (one line, exit 2)
        assert "Traceback" not in err and "internal error" not in err, err
        if code == 2:
            assert "busy" in err and err.count("\n") == 1, err
    assert any(code == 0 for code, _ in results), results
    third = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert third.returncode == 0, third.stderr
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    statuses = [r[0] for r in con.execute("SELECT status FROM runs ORDER BY id")]
    con.close()
    assert statuses.count("complete") == 1 + sum(code == 0 for code, _ in results), statuses
