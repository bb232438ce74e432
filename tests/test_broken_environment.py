"""The exit-code contract under a broken environment (issue 44): a fork or thread the system refuses (EAGAIN),
a read-only home with --no-cache, a read-only store opened for reading, a cache path that is a file or a
link, a C locale with a non-ASCII name, a file name that is no UTF-8.  Each is run through the real CLI in
a process of its own (the locale and the limits are the process's) and gets either the answer or one line
and exit 2, never an internal error (exit 4).  The hostile members are generated."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def cli(*argv, env: dict | None = None, cwd=None, prefix: tuple = ()) -> tuple[int, str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RELOCVERIFY_")}
    environ.update(env or {})
    proc = subprocess.run([*prefix, sys.executable, "-m", "relocverify", *map(os.fsencode, argv)],
                          capture_output=True, env=environ, cwd=cwd or ROOT, timeout=120)
    return proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")


def one_line(code: int, err: str, *needles: str) -> None:
    assert code == 2 and err.count("\n") == 1 and "internal error" not in err and "Traceback" not in err, (code, err)
    for needle in needles:
        assert needle in err, err


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    import elfbuild
    import test_engine

    return str(elfbuild.build_elf(tmp_path_factory.mktemp("small"), test_engine.SMALL_ASM, test_engine.SMALL_LDS))


@pytest.fixture(scope="module")
def store(small, tmp_path_factory):
    db = str(tmp_path_factory.mktemp("store") / "s.sqlite")
    code, _, err = cli("vmlinux", small, "--db", db, "--no-progress", "--no-cache")
    assert code == 0, err
    return db


# --- a fork refused ---------------------------------------------------------------------------------

PIDS = Path("/sys/fs/cgroup/pids")


@pytest.fixture()
def pids_cgroup():
    """A cgroup of the pids controller (v1), limited by the test: fork and clone past it fail with EAGAIN, for
    root too (RLIMIT_NPROC does not bind root)."""
    where = PIDS / f"relocverify-test-{uuid.uuid4().hex[:8]}"
    try:
        where.mkdir()
    except OSError as exc:
        pytest.skip(f"no pids cgroup to make here: {exc}")
    yield where
    for _ in range(50):
        try:
            where.rmdir()
            return
        except OSError:
            import time

            time.sleep(0.1)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limit=st.integers(1, 10), jobs=st.sampled_from(["1", "2"]), command=st.sampled_from(["vmlinux", "selftest"]))
def test_a_fork_refused_is_one_line_and_exit_2(small, tmp_path_factory, pids_cgroup, limit, jobs, command):
    """Refused in the parent, in a worker (its watch thread, its CPU judge's child) or in a native library
    within a worker (z3 aborts when refused a thread): the answer, or the one line that names the limit, and
    no process left in the cgroup either way (``multiprocessing.Pool`` lost the aborted worker's answer and
    waited for ever, its replacement workers left running)."""
    (pids_cgroup / "pids.max").write_text(str(limit))
    db = tmp_path_factory.mktemp("fork") / "s.sqlite"
    argv = (("vmlinux", small, "--db", str(db), "--no-cache") if command == "vmlinux"
            else ("selftest", "--pairs", "24", "--seed", str(limit)))
    shell = f"echo $$ > {pids_cgroup}/cgroup.procs && exec \"$@\""
    code, out, err = cli(*argv, "--no-progress", "--jobs", jobs, prefix=("sh", "-c", shell, "sh"))
    left = (pids_cgroup / "cgroup.procs").read_text().split()
    assert not left, f"processes {left} left running"
    if code == 0:
        assert err == "", err  # the limit left room enough for this run
        return
    one_line(code, err, "cannot start another process or thread", "--jobs 1")


# --- read-only places --------------------------------------------------------------------------------

@pytest.fixture()
def read_only(tmp_path):
    """A tmpfs remounted read-only by the test (root only: as root, chmod alone does not stop a write)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / "ro"
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(where)], capture_output=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")

    def seal():
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)

    yield where, seal
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_read_only_home_with_no_cache_works_and_without_says_how_out(small, read_only, tmp_path):
    home, seal = read_only
    seal()
    env = {"HOME": str(home)}
    assert cli("vmlinux", small, "--db", str(tmp_path / "a.sqlite"), "--no-progress", "--no-cache", env=env)[0] == 0
    assert cli("check", "90", "--no-cache", env=env)[0] == 0
    code, out, err = cli("show", small, "f_plain", "--no-cache", env=env)  # its image index is kept in memory
    assert code == 0 and "f_plain" in out, err
    code, _, err = cli("check", "90", env=env)
    one_line(code, err, "Read-only file system", "--no-cache")


def test_a_read_only_store_is_read_by_every_reader(store, small, read_only, tmp_path):
    where, seal = read_only
    (where / "dir").mkdir()
    db = where / "dir" / "s.sqlite"
    shutil.copy(store, db)
    db.chmod(0o444)
    seal()
    code, out, err = cli("show", str(db), "f_plain")
    assert code == 0 and "f_plain" in out, err
    assert cli("export", str(db), "--format", "json")[0] == 0
    assert cli("report", str(db), "-o", str(tmp_path / "report"))[0] == 0
    assert cli("run", "--image", small, "--function", "f_plain", "--db", str(db))[0] == 0
    code, _, err = cli("vmlinux", small, "--db", str(db), "--no-progress", "--no-cache")
    one_line(code, err, str(db))
    assert sorted(p.name for p in (where / "dir").iterdir()) == ["s.sqlite"]  # nothing made beside it


# --- a cache path that is no directory -----------------------------------------------------------------

CACHE_KINDS = ["file", "dangling link", "link to a file", "below a file", "link loop"]


def _cache_path(kind: str, d: Path) -> Path:
    target = d / "file"
    target.write_text("not a directory")
    if kind == "file":
        return target
    if kind == "below a file":
        return target / "cache"
    link = d / "link"
    if kind == "dangling link":
        link.symlink_to(d / "nowhere" / "at all")
    elif kind == "link to a file":
        link.symlink_to(target)
    else:
        link.symlink_to(d / "loop2")
        (d / "loop2").symlink_to(link)
    return link


@SETTINGS
@given(kind=st.sampled_from(CACHE_KINDS), variable=st.sampled_from(["RELOCVERIFY_CACHE", "RELOCVERIFY_PROOF_CACHE"]),
       command=st.sampled_from(["check", "show", "vmlinux"]))
def test_a_cache_path_that_is_no_directory_is_one_line_and_no_cache_works(small, tmp_path_factory, kind, variable,
                                                                          command):
    d = tmp_path_factory.mktemp("cache")
    env = {variable: str(_cache_path(kind, d))}
    argv = {"check": ["check", "90"], "show": ["show", small, "f_plain"],
            "vmlinux": ["vmlinux", small, "--db", str(d / "s.sqlite"), "--no-progress"]}[command]
    code, _, err = cli(*argv, env=env)
    one_line(code, err, variable, "--no-cache")
    code, _, err = cli(*argv, "--no-cache", env=env)
    assert code == 0, err


def test_the_default_kernel_under_a_cache_path_that_is_a_link_to_nowhere(tmp_path):
    link = tmp_path / "cache"
    link.symlink_to(tmp_path / "gone")
    code, _, err = cli("vmlinux", "--db", str(tmp_path / "s.sqlite"), "--no-progress", "--no-cache",
                       env={"RELOCVERIFY_CACHE": str(link)})
    one_line(code, err, "link to nowhere", "RELOCVERIFY_CACHE")


# --- names under a C locale, names that are no UTF-8 --------------------------------------------------

LOCALES = [{"LANG": "C"}, {"LC_ALL": "C", "PYTHONUTF8": "0"}, {"LC_ALL": "C", "PYTHONIOENCODING": "ascii"}]
#: File names as bytes: Latin-1 and other non-UTF-8 bytes, and UTF-8 text beyond ASCII.
NAMES = st.one_of(
    st.binary(min_size=1, max_size=8).filter(lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..")),
    st.text(st.characters(min_codepoint=0xa0, max_codepoint=0x2fff, blacklist_categories=("Cs",)), min_size=1,
            max_size=6).map(str.encode))


@SETTINGS
@given(name=NAMES, locale=st.sampled_from(LOCALES))
def test_any_file_name_under_any_locale_is_verified_shown_reported_and_exported(small, tmp_path_factory, name,
                                                                                locale):
    d = tmp_path_factory.mktemp("names")
    image = os.path.join(os.fsencode(d), b"k-" + name)
    shutil.copy(small, image)
    db = os.path.join(os.fsencode(d), name + b".sqlite")
    for argv in (["vmlinux", image, "--db", db, "--no-progress", "--no-cache"], ["show", db, "f_plain"],
                 ["show", image, "f_plain", "--no-cache"], ["report", db, "-o", os.path.join(os.fsencode(d), b"r")],
                 ["export", db, "--format", "perf"], ["check", "--image", image, "f_plain", "--no-cache"]):
        code, out, err = cli(*argv, env=locale)
        assert code == 0, (argv, locale, err)
