"""What a user can get wrong, one test each: every mistake gets one line on stderr that
says what to do, and exit code 2, before any long work; nothing prints a traceback."""

from __future__ import annotations

import io
import os
import json
import sqlite3
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relocverify.cli import main

A, T = "0xffffffff81234560", "0xffffffffc0001000"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def one_line_error(code: int, err: str, *words: str) -> None:
    assert code == 2, (code, err)
    assert err.count("\n") == 1 and err.startswith("relocverify: error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in err, err


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    import elfbuild
    import test_engine

    d = tmp_path_factory.mktemp("small")
    return str(elfbuild.build_elf(d, test_engine.SMALL_ASM, test_engine.SMALL_LDS))


# --- numbers -------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "ten"])
def test_a_timeout_is_a_finite_number_above_zero(value):
    one_line_error(*run("check", "90", "--timeout", value)[::2], "--timeout")
    one_line_error(*run("vmlinux", "/bin/ls", "--timeout", value)[::2], "--timeout")


@pytest.mark.parametrize("option,value", [("--limit", "-5"), ("--limit", "0"), ("--jobs", "0"), ("--jobs", "x")])
def test_counts_are_at_least_one(option, value):
    one_line_error(*run("vmlinux", "/bin/ls", option, value)[::2], option)


# --- addresses and ranges ---------------------------------------------------------------------------

@pytest.mark.parametrize("address", ["0x0000800000000000", "0x00ff000000000000", "0xfffe7fffffffffff"])
def test_a_non_canonical_address_is_refused(address):
    one_line_error(*run("check", "90", "--at", address)[::2], "not canonical")
    one_line_error(*run("check", "90", "--tramp", address)[::2], "not canonical")


def test_an_instruction_or_trampoline_that_wraps_past_2_64_is_refused():
    one_line_error(*run("check", "90", "--at", "0xfffffffffffffff8")[::2], "wrap")
    one_line_error(*run("check", "90", "--tramp", "0xffffffffffffffe0")[::2], "trampoline")


@pytest.mark.parametrize("rng", ["0xffffffffc0002000:0", "0xffffffffffffff00:0x200",
                                 "0xffffffffc0002000:18446744073709551616", "0xffffffffc0002000"])
def test_tracer_memory_is_a_range_inside_2_64(rng):
    one_line_error(*run("prove", "--orig", "90", "--at", A, "--reloc", "90", "--tramp", T,
                        "--tracer-memory", rng)[::2], "--tracer-memory")


# --- replay states ----------------------------------------------------------------------------------

def test_a_deeply_nested_state_is_refused():
    state = "[" * 100_000 + "]" * 100_000
    one_line_error(*run("replay", "--orig", "90", "--at", A, "--tramp", T, "--reloc", "90", "--state", state)[::2],
                   "--state")


@pytest.mark.parametrize("state,word", [('{"registers": {"rzx": "0x1"}}', "register name"),
                                        ('{"registers": {"rax": "0x10000000000000000"}}', "64 bits"),
                                        ('{"registers": {"rax": "-1"}}', "64 bits"),
                                        ('{"memory": {"0x10": "xyz"}}', "hex bytes")])
def test_a_state_naming_an_unknown_register_or_too_big_a_value_is_refused(state, word):
    one_line_error(*run("replay", "--orig", "90", "--at", A, "--tramp", T, "--reloc", "90", "--state", state)[::2],
                   word)


# --- files ----------------------------------------------------------------------------------------------

def test_a_special_file_is_not_an_image():
    one_line_error(*run("vmlinux", "/proc/self/mem", "--no-progress")[::2], "/proc/self/mem")


def test_a_user_program_is_not_a_kernel(tmp_path):
    one_line_error(*run("vmlinux", "/bin/ls", "--db", str(tmp_path / "s.sqlite"), "--no-progress")[::2],
                   "not a kernel")
    assert not (tmp_path / "s.sqlite").exists()


def test_an_image_without_function_symbols_is_refused(tmp_path):
    import elfbuild

    asm = """
    .section .text, "ax"
    .globl label_only
label_only:
    nop
    ret
"""
    lds = "SECTIONS { . = 0xffffffff81000000; .text : { *(.text) } /DISCARD/ : { *(.note.gnu.property) } }"
    image = elfbuild.build_elf(tmp_path, asm, lds)
    one_line_error(*run("vmlinux", str(image), "--db", str(tmp_path / "s.sqlite"), "--no-progress",
                        "--no-cache")[::2], "no functions")


@pytest.mark.parametrize("where", ["missing-dir/summary.json", "."])
def test_summary_json_where_it_cannot_be_written_is_refused_before_the_run(small, tmp_path, where):
    t0 = time.monotonic()
    target = str(tmp_path / where) if where != "." else str(tmp_path)
    one_line_error(*run("vmlinux", small, "--db", str(tmp_path / "s.sqlite"), "--summary-json", target,
                        "--no-progress")[::2], "summary" if where == "." else "does not exist")
    assert time.monotonic() - t0 < 5 and not (tmp_path / "s.sqlite").exists()


def test_a_binary_file_is_not_a_corpus(tmp_path):
    bad = tmp_path / "corpus.toml"
    bad.write_bytes(bytes(range(256)) * 4)
    one_line_error(*run("corpus", "run", str(bad))[::2], "UTF-8 TOML")


def test_another_programs_sqlite_file_is_left_untouched(small, tmp_path):
    db = tmp_path / "mail.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE messages (body TEXT)")
    con.commit()
    con.close()
    before = db.read_bytes()
    one_line_error(*run("vmlinux", small, "--db", str(db), "--no-progress", "--no-cache")[::2], "another program")
    assert db.read_bytes() == before


def test_a_killed_run_is_marked_so_by_the_next_run(small, tmp_path):
    db = str(tmp_path / "s.sqlite")
    assert run("vmlinux", small, "--db", db, "--no-progress", "--no-cache")[0] == 0
    con = sqlite3.connect(db)
    con.execute("INSERT INTO runs (image, started, status, pid, host) SELECT image, 0, 'running', 2147483646, host "
                "FROM runs LIMIT 1")
    con.commit()
    con.close()
    assert run("vmlinux", small, "--db", db, "--no-progress", "--no-cache")[0] == 0
    con = sqlite3.connect(db)
    assert [r[0] for r in con.execute("SELECT status FROM runs ORDER BY id")] == ["complete", "killed", "complete"]
    con.close()


# --- output --------------------------------------------------------------------------------------

def test_names_from_the_input_are_escaped_on_a_terminal(tmp_path):
    """A symbol name holding an escape sequence and a tab is printed as text, not interpreted."""
    import elfbuild

    evil = "evil\x1b[31m\tname"
    asm = f"""
    .section .text, "ax"
    .globl "{evil}"
    .type "{evil}", @function
"{evil}":
    sti
    ret
    .size "{evil}", .-"{evil}"
"""
    lds = "SECTIONS { . = 0xffffffff81000000; .text : { *(.text) } /DISCARD/ : { *(.note.gnu.property) } }"
    image = elfbuild.build_elf(tmp_path, asm, lds)
    code, out, err = run("vmlinux", str(image), "--db", str(tmp_path / "s.sqlite"), "--no-progress", "--no-cache")
    assert code == 0
    assert "\x1b" not in out and "evil\\x1b[31m\\x09name" in out


# --- exit codes -----------------------------------------------------------------------------------

def test_vmlinux_exits_1_only_for_the_verdicts_named_by_fail_on(small, tmp_path):
    """The small image has an opaque cpuid: clean by default, a finding with --fail-on opaque."""
    db = str(tmp_path / "s.sqlite")
    assert run("vmlinux", small, "--db", db, "--no-progress", "--no-cache")[0] == 0
    code, out, _ = run("vmlinux", small, "--db", db, "--no-progress", "--no-cache", "--fail-on", "opaque,refuted")
    assert code == 1 and "fails on: 1 opaque" in out
    one_line_error(*run("vmlinux", small, "--fail-on", "bogus")[::2], "--fail-on")


# --- the command line itself ----------------------------------------------------------------------

def test_no_arguments_prints_the_usage():
    code, out, err = run()
    assert code == 2 and "usage: relocverify" in err and "vmlinux" in err


def test_version_names_every_tool():
    code, out, err = run("--version")
    assert code == 0
    for tool in ("capstone", "iced-x86", "pyvex", "z3", "unicorn"):
        assert tool in out or tool in err


def test_an_argparse_error_has_one_prefix_and_a_way_on():
    code, out, err = run("chekc", "90")
    one_line_error(code, err, "see: relocverify --help")
    assert err.count("relocverify:") == 1


def test_every_option_has_help_text():
    from relocverify.cli.main import build_parser

    def walk(parser):
        for action in parser._actions:
            if hasattr(action, "choices") and isinstance(action.choices, dict):
                for sub in action.choices.values():
                    yield from walk(sub)
            elif action.option_strings or action.dest not in ("help",):
                yield parser.prog, action
    missing = [f"{prog} {a.option_strings or a.dest}" for prog, a in walk(build_parser())
               if not a.help and a.dest != "command" and a.dest != "corpus_command"]
    assert missing == []


def test_a_typo_is_refused_before_angr_is_imported():
    code = ("import sys, io; from relocverify.cli import main; "
            "rc = main(['check', 'zz'], io.StringIO(), io.StringIO()); "
            "print(rc, 'angr' in sys.modules, 'z3' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split()
    assert out == ["2", "False", "False"]


def test_every_command_that_prints_results_has_json(small, tmp_path):
    assert json.loads(run("policy", "--json")[1])[0]["rule"] == "sti"
    doc = json.loads(run("replay", "--orig", "4801d8", "--at", A, "--tramp", T, "--reloc", "4801d8e9" + "00" * 4,
                         "--state", '{"registers": {"rax": "0x1", "rbx": "0x2"}}', "--json")[1])
    assert "differences" in doc and doc["replayable"] in (True, False)
    assert "verdict" in json.loads(run("check", "90", "--json")[1])
    assert "verdict" in json.loads(run("prove", "--orig", "90", "--at", A, "--reloc", "90e9" + "00" * 4,
                                       "--tramp", T, "--json")[1])


# --- fuzzing the command line ------------------------------------------------------------------------

WORDS = ["check", "prove", "replay", "policy", "corpus", "run", "fetch", "vmlinux", "--json", "--at", "--tramp",
         "--orig", "--reloc", "--effects", "--state", "--timeout", "--limit", "--jobs", "--tracer-memory", "--db",
         "--summary-json", "--fail-on", "--image", "--system-map", "--cache-dir", "--no-cache", "--no-progress",
         "--trampoline-base", "90", "f0", "zz", "0x", "0xffffffff81234560", "0x10", "-1", "nan", "1e999", "{}",
         "[]", '{"registers": {"rax": 1}}', "/nonexistent", "/dev/null", "/proc/self/mem", "refuted", "x:y",
         "0x1000:16", "", " ", "\x1b[31m", "--", "-", "--help-not", "90 90 90"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(WORDS) | st.text(max_size=8), max_size=7))
def test_no_argument_vector_gives_a_traceback(argv):
    """Random argument vectors over every subcommand: an exit code from the fixed set, and either
    no error or one line of it; never a traceback."""
    if "--timeout" not in argv:
        argv = argv + ["--timeout", "2"] if argv[:1] in (["check"], ["prove"]) else argv
    if argv[:1] == ["vmlinux"]:
        argv = argv + ["--no-progress", "--no-cache"]
        if not any(a in ("/dev/null", "/proc/self/mem", "/nonexistent") for a in argv):
            argv.insert(1, "/nonexistent")  # never start a real run, or the default kernel's download
    if argv[:2] == ["corpus", "fetch"]:
        argv = ["corpus", "fetch", "no-such-kernel"]
    code, out, err = run(*argv)
    assert code in (0, 1, 2, 3), (argv, code, err)
    assert "Traceback" not in err and "Traceback" not in out
    if code == 2 and not err.startswith("usage:"):
        assert err.count("\n") == 1, (argv, err)


@pytest.mark.parametrize("command", [["vmlinux", "--db", "s.sqlite"], ["selftest"], ["gate", "--decoder", "iced", "--baseline", "b"]])
@pytest.mark.parametrize("n", ["0", "-1", "10000", str((os.cpu_count() or 1) + 1), "1e3", "many"])
def test_jobs_past_the_cpus_is_one_line_and_exit_2(command, n):
    """--jobs is 1 to this machine's CPUs in every command (issue 44: 10,000 forked ~4,000 workers)."""
    code, out, err = run(*command, "--jobs", n)
    assert code == 2 and err.count("\n") == 1 and "--jobs" in err, (command, n, err)


def _exit_with_stdout_closed(*argv: str, close_stderr: bool = False) -> tuple[int, str]:
    """Run relocverify with its stdout a pipe whose reader is gone before it writes (and stderr closed)."""
    import os as _os

    read, write = _os.pipe()
    _os.close(read)  # the reader went away (``| head -0``, a crashed consumer)
    stderr = subprocess.DEVNULL if close_stderr else subprocess.PIPE
    p = subprocess.run([sys.executable, "-m", "relocverify", *argv], stdout=write, stderr=stderr, text=True,
                       timeout=300, **({"pass_fds": ()} if not close_stderr else {}))
    _os.close(write)
    return p.returncode, p.stderr or ""


@pytest.mark.parametrize("argv,code", [(("check", "cc"), 1), (("check", "90"), 0), (("policy",), 0)])
def test_the_exit_code_survives_a_closed_stdout(argv, code):
    """A finding stays exit 1 and a clean run exit 0 when the reader of stdout is gone (issue 44: a
    broken pipe turned a refuted or --fail-on exit 1 into 0 under pipefail)."""
    got, err = _exit_with_stdout_closed(*argv)
    assert got == code, (argv, got, err)
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_a_closed_stderr_changes_nothing():
    p = subprocess.run([sys.executable, "-c", "import os, sys; os.close(2); from relocverify.cli import main; "
                        "sys.exit(main(['check', '90']))"], capture_output=False, stdout=subprocess.PIPE, text=True,
                       timeout=300)
    assert p.returncode == 0 and "verdict: proved" in p.stdout


@pytest.mark.parametrize("flag", ["--junit", "--sarif"])
def test_an_unwritable_gate_report_is_refused_before_the_run(flag, tmp_path):
    """One line and exit 2 at once, before any instruction is decoded (issue 44)."""
    t0 = time.monotonic()
    code, out, err = run("gate", "--decoder", "iced", "--fuzz", "100000", "--baseline", str(tmp_path / "b.json"),
                         flag, str(tmp_path / "no-such-dir" / "r.xml"))
    assert code == 2 and err.count("\n") == 1 and flag in err and time.monotonic() - t0 < 10, err


@pytest.mark.parametrize("timeout", ["1e300", "1e10", "86401", "1e308"])
def test_a_timeout_past_a_day_is_one_line(timeout):
    """Issue 44: --timeout 1e300 overflowed a time_t (an internal error, exit 4)."""
    code, out, err = run("check", "90", "--timeout", timeout)
    assert code == 2 and err.count("\n") == 1 and "timeout" in err, err


@pytest.mark.parametrize("kind", ["file", "dangling link"])
def test_a_proof_cache_path_that_is_no_directory_says_what_it_is_and_how_out(kind, tmp_path, monkeypatch):
    """Issue 44: the advice named --cache-dir, which check does not have."""
    import os as _os

    path = tmp_path / "cache"
    if kind == "file":
        path.write_text("")
    else:
        _os.symlink(tmp_path / "nowhere", path)
    monkeypatch.setenv("RELOCVERIFY_PROOF_CACHE", str(path))
    code, out, err = run("check", "90")
    assert code == 2 and err.count("\n") == 1, err
    assert ("a file" if kind == "file" else "nowhere") in err and "--no-cache" in err
    assert run("check", "90", "--no-cache")[0] == 0


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=1, max_size=6).filter(lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..")))
def test_a_file_name_of_any_bytes_is_verified_and_printed(tmp_path, name):
    """Issue 44: a Latin-1 file name reached SQLite as surrogates (an internal error, exit 4)."""
    import os as _os
    import shutil

    path = _os.path.join(_os.fsencode(str(tmp_path)), b"p-" + name)
    shutil.copy("/bin/true", path)
    db = tmp_path / f"s{abs(hash(name))}.sqlite"
    p = subprocess.run([sys.executable, "-m", "relocverify", "elf", path, "--db", str(db), "--no-progress"],
                       capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode("utf-8")  # what reaches the terminal is UTF-8, whatever the name's bytes
    assert "image: " in out


@pytest.mark.parametrize("e_type", [0, 4, 0xFE00, 0xFF00])
@pytest.mark.parametrize("command", ["vmlinux", "elf"])
def test_an_elf_that_is_no_program_is_refused_in_one_line(tmp_path, e_type, command):
    """Issue 44: an ET_CORE file was accepted as a program (and by vmlinux refused only for its addresses)."""
    data = bytearray(open("/bin/true", "rb").read())
    data[16:18] = e_type.to_bytes(2, "little")
    path = tmp_path / "x.elf"
    path.write_bytes(data)
    code, out, err = run(command, str(path), "--db", str(tmp_path / "s.sqlite"), "--no-progress")
    assert code == 2 and err.count("\n") == 1 and "not a program or a kernel" in err, err


@pytest.mark.parametrize("base", ["0xffffffff90000000", "0xffff888000000000", "0xffffffffff000000"])
def test_a_module_base_outside_module_space_is_refused_not_replaced(tmp_path, base):
    """Issue 44: a --base outside module space was replaced in silence by module space's start."""
    import elfbuild
    import test_engine

    kernel = elfbuild.build_elf(tmp_path, test_engine.SMALL_ASM, test_engine.SMALL_LDS)
    ko = tmp_path / "m.ko"
    ko.write_bytes(b"\x7fELF")
    code, out, err = run("module", str(ko), "--kernel", str(kernel), "--db", str(tmp_path / "s.sqlite"),
                         "--base", base, "--no-progress")
    assert code == 2 and err.count("\n") == 1 and "outside module space" in err, err


def test_a_symbol_past_its_section_is_said_not_clamped_in_silence(tmp_path):
    """Issue 44: a function symbol whose size runs past its section was cut at the section's end in
    silence; the summary says so."""
    import elfbuild
    import test_engine

    asm = test_engine.SMALL_ASM.replace("    .size f_plain, .-f_plain", "    .size f_plain, 0x100000")
    assert asm != test_engine.SMALL_ASM
    image = elfbuild.build_elf(tmp_path, asm, test_engine.SMALL_LDS)
    code, out, err = run("vmlinux", str(image), "--db", str(tmp_path / "s.sqlite"), "--no-progress")
    assert code == 0, err
    assert "note: 1 function symbol(s) run past the end of their section" in out
