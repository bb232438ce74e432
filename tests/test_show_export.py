"""``relocverify show`` and ``relocverify export``: a function annotated from a store and from its image (the
same rows), every reason whole, names escaped, and probe files each tool's parser accepts.

The store is made by the engine from a small kernel-like ELF (two objects, so two static functions can
share a name), plus, marked slow, a few functions of the Debian 6.1 cloud kernel.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relocverify.cli import export, show
from relocverify.cli.main import TYPES, _Parser
from relocverify.engine.one_function import verify_function
from relocverify.engine.run import RunOptions, run
from relocverify.errors import RelocverifyError
from relocverify.image.functions import find_functions
from relocverify.image.loader import load_image
from relocverify.kernel.sites import find_sites
from relocverify.report.probe_files import event_name, render_dtrace, render_perf
from relocverify.report.probe_points import Export, Image, ProbePoint
from relocverify.store.store import Results

TRAMP = 0xFFFFFFFFC0001000
EVIL = "evil\x1b[31mname"  # a symbol with an escape sequence in it

MAIN_ASM = f"""
    .text
    .globl f_main
    .type f_main, @function
f_main:
    push %rbp
    mov %rsp, %rbp
    mov 0x18(%rdi), %rax
    cmp $1, %rax
    je f_main.cold
    call f_leaf
    cpuid
    pop %rbp
    ret
    .size f_main, .-f_main

    .type f_main.cold, @function
f_main.cold:
    ud2
    jmp f_main
    .size f_main.cold, .-f_main.cold

    .globl f_leaf
    .type f_leaf, @function
f_leaf:
    lea 0x40(%rip), %rax
    xor %eax, %eax
    ret
    .size f_leaf, .-f_leaf

    .type dup, @function
dup:
    mov %rdi, %rax
    ret
    .size dup, .-dup

    .globl "{EVIL}"
    .type "{EVIL}", @function
"{EVIL}":
    nop
    ret
    .size "{EVIL}", .-"{EVIL}"

    .section .init.text, "ax"
    .globl f_init
    .type f_init, @function
f_init:
    xor %eax, %eax
    ret
    .size f_init, .-f_init
"""
OTHER_ASM = """
    .text
    .type dup, @function
dup:
    lea 1(%rdi), %rax
    ret
    .size dup, .-dup
"""
LDS = """
SECTIONS {
  . = 0xffffffff81000000;
  .text : { *(.text) }
  .init.text : { *(.init.text) }
  /DISCARD/ : { *(.note.gnu.property) *(.comment) }
}
"""


def _build(directory):
    """Two objects linked at kernel addresses (gcc and ld, as tests/elfbuild.py)."""
    missing = [t for t in ("gcc", "ld") if not shutil.which(t)]
    if missing:
        pytest.fail(f"building the test ELF needs {' and '.join(missing)}: apt-get install gcc binutils")
    objects = []
    for name, asm in (("a", MAIN_ASM), ("b", OTHER_ASM)):
        (directory / f"{name}.s").write_text(asm)
        subprocess.run(["gcc", "-c", "-o", str(directory / f"{name}.o"), str(directory / f"{name}.s")], check=True)
        objects.append(str(directory / f"{name}.o"))
    (directory / "k.lds").write_text(LDS)
    out = directory / "vmlinux"
    subprocess.run(["ld", "-static", "-nostdlib", "-T", str(directory / "k.lds"), "-o", str(out), *objects],
                   check=True)
    return out


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """(vmlinux path, store path) of the small kernel, verified by the engine."""
    d = tmp_path_factory.mktemp("small")
    vmlinux = _build(d)
    db = d / "s.sqlite"
    summary = run(load_image(str(vmlinux)), str(db), RunOptions(TRAMP, 1, 10.0, None, True, None))
    assert summary["totals_add_up"]
    return str(vmlinux), str(db)


@pytest.fixture()
def index_cache(tmp_path, monkeypatch):
    """The image index (``store.image_index``) of the test images goes under tmp_path, not the user's cache."""
    monkeypatch.setenv("RELOCVERIFY_CACHE", str(tmp_path / "cache"))


def _cli(*argv, columns: int | None = None, monkeypatch=None) -> tuple[int, str, str]:
    """(exit code, stdout, the one-line error) of ``relocverify show|export ...`` as main would run it."""
    p = _Parser(prog="relocverify")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    show.add_parser(sub, TYPES)
    export.add_parser(sub, TYPES)
    if monkeypatch is not None and columns is not None:
        monkeypatch.setenv("COLUMNS", str(columns))
    out = io.StringIO()
    try:
        args = p.parse_args(list(argv))
        return args.func(args, out), out.getvalue(), ""
    except RelocverifyError as exc:
        return 2, out.getvalue(), str(exc)


def _address(db: str, name: str) -> int:
    store = Results(db)
    try:
        return next(f.start for f in store.iter_functions(store.find_image()) if f.name == name)
    finally:
        store.close()


# --- show ----------------------------------------------------------------------------------------------

def test_show_from_the_store_has_a_line_per_instruction_with_the_whole_reason(small, monkeypatch):
    _, db = small
    rc, text, _ = _cli("show", db, "f_main", columns=200, monkeypatch=monkeypatch)
    assert rc == 0
    lines = text.splitlines()
    assert lines[0].startswith("f_main: 0xffffffff81000000..")
    body = [line for line in lines if re.match(r"^[ >] \+0x", line)]
    assert [line.split()[0] for line in body] == ["+0x0", "+0x1", "+0x4", "+0x8", "+0xc", "+0xe", "+0x13",
                                                  "+0x15", "+0x16"]
    je = next(line for line in body if " je " in line)
    assert "<f_main.cold>" in je and " rewrite " in je and " proved " in je
    cpuid = next(line for line in body if "cpuid" in line)
    assert " opaque " in cpuid and "0f a2" in cpuid
    call = next(line for line in body if "call" in line)
    assert "<f_leaf>" in call and " emulate " in call
    store = Results(db)
    try:
        rows = {r.address: r for r in store.iter_rows(store.find_image()) if r.function == "f_main"}
    finally:
        store.close()
    flat = " ".join(text.split())
    for r in rows.values():
        assert " ".join(r.reason.split()) in flat  # the whole reason, folded but never cut


@pytest.mark.parametrize("columns", [60, 90, 140])
def test_show_folds_reasons_at_word_boundaries_to_the_terminal_width(small, monkeypatch, columns):
    _, db = small
    rc, text, _ = _cli("show", db, "f_main.cold", columns=columns, monkeypatch=monkeypatch)
    assert rc == 0
    store = Results(db)
    try:
        reasons = [r.reason for r in store.iter_rows(store.find_image()) if r.function == "f_main.cold"]
    finally:
        store.close()
    for line in text.splitlines()[4:]:
        if not re.match(r"^[ >] \+0x", line):  # a reason's continuation stays within the width
            assert len(line) <= columns, line
    flat = " ".join(text.split())
    for reason in reasons:
        assert " ".join(reason.split()) in flat  # every reason is there, whole
    ud2 = next(line for line in text.splitlines() if "ud2" in line)
    assert " reject " in ud2 and "rejected" in ud2


def test_show_from_the_image_verifies_the_function_and_matches_the_store(small, index_cache, monkeypatch):
    vmlinux, db = small
    for name in ("f_main", "f_main.cold", "f_leaf", f"dup@{_address(db, 'dup'):#x}"):
        rc, from_store, _ = _cli("show", db, name, "--json")
        assert rc == 0
        rc, from_image, _ = _cli("show", vmlinux, name, "--json")
        assert rc == 0
        a, b = json.loads(from_store), json.loads(from_image)
        assert a["source"]["kind"] == "store" and b["source"]["kind"] == "image"
        assert a["function"] == b["function"]
        assert a["instructions"] == b["instructions"]
    rc, text, _ = _cli("show", vmlinux, "f_main", columns=160, monkeypatch=monkeypatch)
    assert rc == 0 and "verified now from the image" in text


def test_verify_function_gives_the_rows_the_engine_stored(small):
    vmlinux, db = small
    image = load_image(vmlinux)
    store = Results(db)
    try:
        stored = {r.address: r for r in store.iter_rows(store.find_image())}
    finally:
        store.close()
    sites = find_sites(image)
    for function in find_functions(image):
        for got in verify_function(image, function, TRAMP, 10.0, sites):
            want = stored[got.row.address]
            for field in ("length", "raw", "function", "verdict", "method", "plan_kind", "rule", "klass",
                          "reason_key", "reason", "sites"):
                assert getattr(got.row, field) == getattr(want, field), (function.name, field)


def test_show_json_has_every_instruction_and_the_function(small):
    _, db = small
    rc, text, _ = _cli("show", db, "f_main", "--json")
    assert rc == 0
    doc = json.loads(text)
    assert doc["function"]["name"] == "f_main" and doc["function"]["instructions"] == 9
    assert doc["function"]["verdicts"] == {"proved": 8, "opaque": 1}
    first = doc["instructions"][0]
    assert set(first) >= {"address", "offset", "bytes", "text", "plan", "rule", "verdict", "method", "reason",
                          "sites", "variants"}
    assert first["address"] == "0xffffffff81000000" and first["offset"] == 0 and first["bytes"] == "55"


def test_a_name_several_functions_share_is_refused_with_the_candidates(small):
    _, db = small
    rc, _, err = _cli("show", db, "dup")
    assert rc == 2 and "2 functions are named 'dup'" in err
    _, second = re.findall(r"dup@(0x[0-9a-f]+)", err)
    rc, text, _ = _cli("show", db, f"dup@{second}")
    assert rc == 0 and text.startswith(f"dup: {second}..")
    rc, _, err = _cli("show", db, "dup@0xffffffff81000001")
    assert rc == 2 and "no function 'dup' starts at 0xffffffff81000001" in err


def test_unknown_names_and_offsets_are_input_errors(small):
    _, db = small
    rc, _, err = _cli("show", db, "f_mainx")
    assert rc == 2 and "no function named 'f_mainx'" in err and "did you mean f_main" in err
    rc, _, err = _cli("show", db, "f_main+0x2")
    assert rc == 2 and "inside an instruction" in err and "f_main+0x1 and f_main+0x4" in err
    rc, _, err = _cli("show", db, "f_main+0x100")
    assert rc == 2 and "past the end" in err
    rc, _, err = _cli("show", db, "0xffffffff80000000")
    assert rc == 2 and "no function holds" in err
    rc, _, err = _cli("show", db, "not a function")
    assert rc == 2 and "is not an address" in err


def test_an_address_or_offset_marks_its_instruction(small, monkeypatch):
    _, db = small
    rc, text, _ = _cli("show", db, "f_main+0xe", columns=200, monkeypatch=monkeypatch)
    assert rc == 0
    marked = [line for line in text.splitlines() if line.startswith(">")]
    assert len(marked) == 1 and marked[0].startswith("> +0xe") and "<f_leaf>" in marked[0]
    rc, text, _ = _cli("show", db, "0xffffffff81000010", columns=200, monkeypatch=monkeypatch)  # inside the call
    assert rc == 0 and text.startswith("f_main:")
    assert [line[:6] for line in text.splitlines() if line.startswith(">")] == ["> +0xe"]


def test_names_are_escaped_in_text_and_json(small, index_cache):
    vmlinux, db = small
    address = f"{_address(db, EVIL):#x}"
    for source in (db, vmlinux):
        rc, text, _ = _cli("show", source, address)
        assert rc == 0 and "\x1b" not in text and "evil\\x1b[31mname" in text
        rc, text, _ = _cli("show", source, address, "--json")
        assert rc == 0 and "\x1b" not in text and json.loads(text)["function"]["name"] == EVIL


def test_colour_only_on_a_terminal_or_when_asked(small, monkeypatch):
    _, db = small
    monkeypatch.delenv("NO_COLOR", raising=False)
    rc, plain, _ = _cli("show", db, "f_main")
    assert rc == 0 and "\x1b[" not in plain  # not a terminal
    rc, coloured, _ = _cli("show", db, "f_main", "--color", "always")
    assert "\x1b[32mproved\x1b[0m" in coloured and "\x1b[33mopaque\x1b[0m" in coloured
    rc, text, _ = _cli("show", db, "f_main.cold", "--color", "always")
    assert "\x1b[2mrejected\x1b[0m" in text


def test_show_refuses_a_file_that_is_neither(tmp_path, index_cache):
    other = tmp_path / "other.sqlite"
    import sqlite3

    sqlite3.connect(str(other)).execute("CREATE TABLE t (x)")
    rc, _, err = _cli("show", str(other), "f_main")
    assert rc == 2 and "not a relocverify store" in err
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    rc, _, err = _cli("show", str(text), "f_main")
    assert rc == 2 and err


def test_an_index_a_killed_process_was_making_is_swept_away(small, tmp_path, index_cache):
    """``image_index.indexed`` builds an image's index in a file of its own (``<key>.sqlite.<pid>.tmp``) and renames
    it: the file of a process killed half way is deleted when the next index is made, a living process's is not."""
    import sys

    from relocverify.store.image_index import indexed

    vmlinux, _ = small
    directory = tmp_path / "cache" / "index"
    directory.mkdir(parents=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = directory / f"{'0' * 32}.sqlite.{int(gone.stdout)}.tmp"
    living = directory / f"{'1' * 32}.sqlite.{os.getppid()}.tmp"
    other = directory / "notes.123.tmp"
    for f in dead, living, other:
        f.write_bytes(b"half an index")
    assert indexed(str(vmlinux)).functions
    assert not dead.exists() and living.exists() and other.exists()
    assert sorted(p.suffix for p in directory.iterdir() if p.suffix == ".sqlite") == [".sqlite"]


def test_fold_never_cuts_a_word():
    long = "x" * 70
    lines = show.fold("  +0x0  90  nop  copy  proved    ", f"a reason with {long} in it", 60)
    assert long in "\n".join(lines) and all(len(line) <= 60 or long in line for line in lines)
    assert " ".join(" ".join(lines).split()).endswith(f"a reason with {long} in it")


# --- export --------------------------------------------------------------------------------------------

def _export(db, fmt, *more) -> str:
    rc, text, err = _cli("export", db, "--format", fmt, *more)
    assert rc == 0, err
    return text


def _needs(program: str, package: str) -> None:
    """The real parser is part of the check (README's test command installs it): its absence fails the test,
    saying how to install it, rather than skipping to our own grammar alone."""
    if shutil.which(program) is None:
        pytest.fail(f"{program} is not installed: README's test command installs it (apt-get install {package}); "
                    f"without it the export is checked against our own grammar only")


#: The subset of bpftrace we emit: comments, and one kprobe with an offset and a counting body per line.
BPFTRACE_LINE = re.compile(r"kprobe:[A-Za-z_][A-Za-z0-9_.]*\+\d+ \{ @\[probe\] = count\(\); \}")


def test_export_bpftrace_is_a_program_bpftrace_parses(small, tmp_path):
    _, db = small
    text = _export(db, "bpftrace")
    lines = text.splitlines()
    assert lines[0] == "#!/usr/bin/env bpftrace"
    probes = [line for line in lines if not line.startswith(("#!", "//"))]
    assert probes and all(BPFTRACE_LINE.fullmatch(line) for line in probes)
    assert "kprobe:f_main+0 { @[probe] = count(); }" in probes
    assert "kprobe:f_main.cold+2 { @[probe] = count(); }" in probes  # the jmp back (ud2 is rejected)
    assert not any(":f_main+19 " in p for p in probes)  # cpuid is opaque, not proved
    assert not any("dup+" in p or "f_init" in p or "evil" in p for p in probes)
    comments = "\n".join(line for line in lines if line.startswith("//"))
    assert "left out: 1 function (2 probe points) in .init.text or .exit.text" in comments
    assert "left out: 2 functions (4 probe points) whose names several functions share" in comments
    assert "left out: 1 function (2 probe points) whose names the probe syntax cannot take" in comments
    assert "evil\\x1b[31mname" in comments
    assert "\x1b" not in text
    _needs("bpftrace", "bpftrace")
    program = tmp_path / "probes.bt"
    program.write_text(text)
    done = subprocess.run(["bpftrace", "-d", str(program)], check=False, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("AST after: parser") == 1
    parsed = re.findall(r"^ (kprobe:\S+)$", done.stdout.split("AST after: Semantic")[0], re.MULTILINE)
    assert parsed == [p.split()[0].replace("+0", "") if p.split()[0].endswith("+0") else p.split()[0]
                      for p in probes]


def test_export_with_no_probe_point_is_still_a_program(small, tmp_path):
    _, db = small
    text = _export(db, "bpftrace", "--functions", "f_init")
    assert "BEGIN {" in text and "kprobe:" not in text
    _needs("bpftrace", "bpftrace")
    program = tmp_path / "none.bt"
    program.write_text(text)
    done = subprocess.run(["bpftrace", "-d", str(program)], check=False, capture_output=True, timeout=120)
    assert done.returncode == 0


def test_export_perf_names_each_probe_and_perf_parses_it(small):
    _, db = small
    text = _export(db, "perf", "--functions", "f_*")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/sh" and all(line.startswith(("#", "perf probe ")) for line in lines)
    probes = [line for line in lines if line.startswith("perf probe")]
    assert "perf probe -a 'relocverify:f_main_0=f_main+0'" in probes
    assert "perf probe -a 'relocverify:f_main_cold_2=f_main.cold+2'" in probes
    events = [re.search(r":(\w+)=", p).group(1) for p in probes]
    assert len(set(events)) == len(events) and all(len(e) <= 63 for e in events)
    _needs("perf", "linux-perf")
    definitions = [p.split("-a ", 1)[1].strip("'") for p in probes]
    done = subprocess.run(["perf", "probe", "-v", "--dry-run", *[a for d in definitions for a in ("-a", d)]],
                          check=False, capture_output=True, text=True, timeout=120)
    said = done.stdout + done.stderr  # perf parses every definition before it needs the kernel's symbols
    parsed = re.findall(r"symbol:(\S+) file:\(null\) line:0 offset:(\d+) return:0", said)
    assert parsed == [tuple(d.split("=")[1].split("+")) for d in definitions], said[-2000:]
    assert "Semantic error" not in said


def test_perf_event_names_stay_short_and_unique():
    image = Image(1, "kernel", None, "vmlinux", "0" * 64, TRAMP)
    taken: set[str] = set()
    long = "a" * 80
    names = [event_name(ProbePoint(image, f, 4, 0, "proved", "", ".text", True), taken)
             for f in (long, long + ".isra.0", "x.y", "x_y")]
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", n) for n in names)
    assert len(set(names)) == 4 and names[2] == "x_y_4" and names[3] != "x_y_4"


#: kinst(4): kinst:[module]:<function>:<offset>, with D's probe-description characters in the function.
DTRACE_LINE = re.compile(r"kinst:[A-Za-z0-9_]*:[A-Za-z_][A-Za-z0-9_.]*:\d+ "
                         r"\{ @\[probefunc, probename\] = count\(\); \}")


def test_export_dtrace_follows_kinst(small):
    _, db = small
    lines = _export(db, "dtrace").splitlines()
    assert lines[0] == "#!/usr/sbin/dtrace -s"
    comments = [line for line in lines[1:] if line.startswith("/*")]
    assert all(line.endswith("*/") and line.count("*/") == 1 for line in comments)
    probes = [line for line in lines[1:] if not line.startswith("/*")]
    assert probes and all(DTRACE_LINE.fullmatch(line) for line in probes)
    assert "kinst::f_leaf:7 { @[probefunc, probename] = count(); }" in probes


def test_export_json_holds_every_matching_instruction(small, tmp_path):
    _, db = small
    out = tmp_path / "probes.json"
    rc, text, _ = _cli("export", db, "--format", "json", "--verdict", "proved,opaque", "-o", str(out))
    assert rc == 0 and text == ""
    doc = json.loads(out.read_text())
    assert doc["verdicts"] == ["proved", "opaque"]
    by = {(p["function"], p["offset"]): p for p in doc["probes"]}
    assert by[("f_main", 19)]["verdict"] == "opaque"
    assert by[("f_init", 0)]["section"] == ".init.text"
    assert {p["unique_name"] for p in doc["probes"] if p["function"] == "dup"} == {False}
    assert any(p["function"] == EVIL for p in doc["probes"]) and "\x1b" not in out.read_text()
    assert set(by[("f_main", 0)]) >= {"function", "offset", "address", "verdict", "reason"}
    assert by[("f_main", 0)]["address"] == "0xffffffff81000000"


def test_export_options_are_checked(small):
    _, db = small
    rc, _, err = _cli("export", db, "--format", "bpftrace", "--functions", "nothing_like_this*")
    assert rc == 2 and "matches no function" in err
    rc, _, err = _cli("export", db, "--format", "bpftrace", "--verdict", "proved,maybe")
    assert rc == 2 and "--verdict takes verdicts from" in err
    rc, _, err = _cli("export", db, "--format", "systemtap")
    assert rc == 2 and "invalid choice" in err


# --- a real kernel ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_show_on_the_debian_kernel_is_the_same_from_the_store_and_the_image(debian_kernels, tmp_path):
    """A few functions with kernel sites (fentry, return thunks, retpolines, alternatives): the store's rows
    and the image's, verified now, agree instruction by instruction."""
    kernel, _ = debian_kernels("debian-6.1-cloud")
    image = load_image(kernel.vmlinux)
    db = tmp_path / "k.sqlite"
    run(image, str(db), RunOptions(TRAMP, 2, 10.0, 120, True, None))
    store = Results(str(db))
    try:
        img = store.find_image()
        sited = {}
        for r in store.iter_rows(img):
            sited.setdefault(r.function, set()).update(r.sites)
    finally:
        store.close()
    chosen = sorted((name for name, kinds in sited.items() if len(kinds) >= 2), key=lambda n: -len(sited[n]))[:3]
    assert chosen
    for name in chosen:
        rc, a, err = _cli("show", str(db), name, "--json")
        assert rc == 0, err
        rc, b, err = _cli("show", kernel.vmlinux, name, "--json")
        assert rc == 0, err
        # the texts may differ only in a call target's name: the store holds the first 120 functions only
        strip = lambda doc: [dict(i, text=i["text"].split(" <")[0]) for i in json.loads(doc)["instructions"]]
        assert strip(a) == strip(b), name


#: File names of modules as a hostile or careless package may spell them (issue 44).
HOSTILE_MODULES = st.text(alphabet=st.sampled_from(list("ab.-_$()`;|&<>*?[]{}'\"\\ \t\n#~!%:=")), min_size=1,
                          max_size=12)


@settings(max_examples=40, deadline=None)
@given(HOSTILE_MODULES)
def test_perf_lines_run_nothing_a_module_name_holds(tmp_path_factory, module):
    """Every exported perf line, run by sh with ``perf`` a function that records its arguments, passes the
    module name as one argument and runs nothing else (issue 44: ``$(...)`` in a name ran)."""
    image = Image(2, "module", module, "m.ko", "0" * 64, TRAMP)
    found = Export("s.sqlite", ("proved",), None, (image,),
                   (ProbePoint(image, "f_leaf", 7, 0x1007, "proved", "", ".text", True),), 1)
    script = render_perf(found)
    if not module.isprintable():  # a tab or a newline: left out, as every control character (the next test)
        assert "perf probe -m" not in script and "whose file names hold control" in script
        return
    d = tmp_path_factory.mktemp("sh")
    runner = d / "run.sh"
    runner.write_text("set -u\nperf() { printf '%s\\n' \"$@\" > args; }\n" + script)
    done = subprocess.run(["sh", str(runner)], cwd=d, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    args = (d / "args").read_text()
    assert args == "\n".join(["probe", "-m", module, "-a", "relocverify:f_leaf_7=f_leaf+7"]) + "\n", args
    assert sorted(p.name for p in d.iterdir()) == ["args", "run.sh"], "the line made a file"


#: Module file names that hold what a terminal acts on: C0 and C1 controls, escape sequences, bidi and
#: invisible format characters, bytes that are no UTF-8 (carried as surrogates).
TERMINAL_HOSTILE = st.lists(st.one_of(st.sampled_from(list("ab.-_ko[]0;m")), st.characters(max_codepoint=0x1f),
                                      st.characters(min_codepoint=0x7f, max_codepoint=0x9f),
                                      st.sampled_from(["\u202e", "\u200b", "\u2028", "\x1b[2J", "\x1b]0;t\x07"]),
                                      st.characters(min_codepoint=0xdc80, max_codepoint=0xdcff, blacklist_categories=())),
                           min_size=1, max_size=8).map("".join).filter(lambda name: not name.isprintable())


@settings(max_examples=40, deadline=None)
@given(TERMINAL_HOSTILE)
def test_perf_lines_never_carry_what_a_terminal_acts_on(module):
    """A shell-quoted name is one word to sh but an escape sequence to the terminal that shows or pastes the
    line (issue 44): such a module's probe points are left out, and the comment that says so is escaped."""
    image = Image(2, "module", module, "m.ko", "0" * 64, TRAMP)
    found = Export("s.sqlite", ("proved",), None, (image,),
                   (ProbePoint(image, "f_leaf", 7, 0x1007, "proved", "", ".text", True),), 1)
    script = render_perf(found)
    assert "perf probe -m" not in script and "whose file names hold control" in script
    assert all(line.isprintable() for line in script.splitlines()), script


@settings(max_examples=40, deadline=None)
@given(HOSTILE_MODULES)
def test_dtrace_probe_descriptions_hold_only_names_d_takes(module):
    image = Image(2, "module", module, "m.ko", "0" * 64, TRAMP)
    found = Export("s.sqlite", ("proved",), None, (image,),
                   (ProbePoint(image, "f_leaf", 7, 0x1007, "proved", "", ".text", True),), 1)
    probes = [line for line in render_dtrace(found).splitlines()[1:] if not line.startswith("/*")]
    assert all(DTRACE_LINE.fullmatch(line.replace(f"kinst:{module}:", "kinst::")) and
               re.fullmatch(r"[A-Za-z0-9_.-]+", module) for line in probes if line.startswith("kinst:"))


FORGE_ASM = r"""
    .section .text, "ax"
    .globl f_irq
    .type f_irq, @function
f_irq:
    push %rbp
    sti
    pop %rbp
    ret
    .size f_irq, .-f_irq
"""
FORGE_LDS = """
SECTIONS {
  . = 0xffffffff81000000;
  .text : { *(.text) }
  /DISCARD/ : { *(.note.gnu.property) *(.comment) }
}
"""


@pytest.mark.parametrize("forgery", [
    "UPDATE outcomes SET verdict='proved' WHERE klass='sti'",
    "UPDATE outcomes SET verdict='proved', rule='position-independent', plan_kind='copy' WHERE klass='sti'",
    "UPDATE outcomes SET verdict='proved', rule='position-independent', plan_kind='copy', klass='push' "
    "WHERE klass='sti'",
])
def test_export_refuses_a_verdict_the_policy_does_not_allow(tmp_path, forgery):
    """A store edited to call sti proved: export refuses it whole for its broken seals (store.row_seals), and
    when the forger also sealed it again with the store's key, export still leaves the row out and says so
    (issue 44: export trusted the store's verdicts without consulting the policy)."""
    import sqlite3

    import elfbuild

    from relocverify import cli as main_cli
    from relocverify.store.row_seals import seal_functions

    image = str(elfbuild.build_elf(tmp_path, FORGE_ASM, FORGE_LDS))
    db = str(tmp_path / "s.sqlite")
    assert main_cli.main(["vmlinux", image, "--db", db, "--no-progress"], io.StringIO(), io.StringIO()) in (0, 1)
    assert "the store was altered" not in _export(db, "bpftrace")
    con = sqlite3.connect(db)
    assert con.execute(forgery).rowcount == 1
    con.commit()
    rc, text, err = _cli("export", db, "--format", "bpftrace")
    assert rc == 2 and "were altered after relocverify wrote them" in err and "f_irq" not in text
    seal_functions(con, "1")  # the forger has the key
    con.commit()
    con.close()
    assert "kprobe:f_irq+1 " not in _export(db, "bpftrace")
    assert "=f_irq+1'" not in _export(db, "perf")
    assert not [p for p in json.loads(_export(db, "json"))["probes"] if p["function"] == "f_irq" and p["offset"] == 1]
    assert "the store was altered" in _export(db, "bpftrace")
