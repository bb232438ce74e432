"""The command line: ``check`` (its --json contract and exit codes), bad input, and ``corpus``."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from relocverify import cli
from relocverify.corpus import runner as corpus

ROOT = Path(__file__).resolve().parent.parent


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def run_process(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "relocverify", *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def assert_one_line_error(code: int, out: str, err: str) -> None:
    assert code == cli.EXIT_USAGE, (code, out, err)
    assert err.count("\n") == 1 and err.startswith("relocverify: error: "), err
    assert "Traceback" not in err and out == ""


# ---------------------------------------------------------------------------
# check --json: the contract
# ---------------------------------------------------------------------------


def check_json(hex_: str, *extra: str) -> tuple[int, dict]:
    code, out, err = run("check", hex_, "--json", *extra)
    assert err == ""
    return code, json.loads(out)


def test_check_json_contract_rewrite():
    code, doc = check_json("48 8b 05 10 00 00 00")
    assert {"length", "mnemonic", "decoders", "plan", "verdict"} <= set(doc)
    assert doc["length"] == 7 and doc["mnemonic"].startswith("movq")
    assert doc["decoders"] == {"capstone": 7, "iced": 7}
    plan = doc["plan"]
    assert {"kind", "reason", "trampoline", "effects"} <= set(plan)
    assert plan["kind"] == "rewrite" and plan["effects"] == []
    assert bytes.fromhex(plan["trampoline"])[:3] == bytes.fromhex("488b05")
    assert doc["verdict"] == "proved" and code == cli.EXIT_CLEAN


def test_check_json_contract_emulate():
    code, doc = check_json("41 ff d3")
    plan = doc["plan"]
    assert plan["kind"] == "emulate" and plan["trampoline"] == ""
    assert [e["op"] for e in plan["effects"]] == ["let", "push", "jump"]
    assert plan["effects"][1]["value"] == hex(cli.DEFAULT_AT + 3), "call *%r11 pushes A+3"
    assert code == cli.EXIT_CLEAN


def test_check_json_capstone_bug_reports_both_decoders():
    code, doc = check_json("0f b9 c0")
    assert doc["decoders"] == {"capstone": 2, "iced": 3} and doc["length"] == 3
    assert doc["plan"]["kind"] == "reject"
    assert code == cli.EXIT_FINDINGS


@pytest.mark.parametrize("hex_, kind, code", [
    ("f0 ff 05 00 00 00 00", "rewrite", cli.EXIT_CLEAN),
    ("74 10", "rewrite", cli.EXIT_CLEAN),
    ("c2 08 00", "emulate", cli.EXIT_CLEAN),
    ("fb", "reject", cli.EXIT_FINDINGS),
    ("0f 05", "reject", cli.EXIT_FINDINGS),
    ("0f a2", "copy", cli.EXIT_UNKNOWN),
])
def test_check_exit_codes(hex_, kind, code):
    got, doc = check_json(hex_)
    assert doc["plan"]["kind"] == kind
    assert got == code


def test_check_far_tramp_uses_scratch():
    code, doc = check_json("48 8b 05 10 00 00 00", "--at", "0x401000", "--tramp", "0x00007f0000000000")
    assert doc["plan"]["rule"] == "rip-scratch" and code == cli.EXIT_CLEAN
    assert any("IBT" in a for a in doc["assumes"]), "user space: no IBT, said with the verdict"


def test_check_far_tramp_at_a_kernel_address_is_not_proved_under_ibt():
    code, doc = check_json("48 8b 05 10 00 00 00", "--tramp", "0xffffc90000001000")  # vmalloc: out of reach
    assert doc["plan"]["rule"] == "rip-scratch" and doc["verdict"] == "unknown" and "IBT" in doc["reason"]


def test_check_text_output():
    code, out, err = run("check", "f0 ff 05 00 00 00 00")
    assert code == cli.EXIT_CLEAN and err == ""
    assert "plan: rewrite" in out and "verdict: proved" in out and "lock incl" in out


def test_check_subprocess_ok():
    p = run_process("check", "--json", "c3")
    assert p.returncode == 0 and p.stderr == ""
    assert json.loads(p.stdout)["plan"]["kind"] == "emulate"


# ---------------------------------------------------------------------------
# Bad input: exit 2, one line on stderr, no traceback
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["check", "zz"],  # not hex
    ["check", ""],  # empty
    ["check", "   "],  # only spaces
    ["check", "f"],  # odd digits
    ["check", "0f 0"],  # odd digits
    ["check", "90" * 16],  # more than 15 bytes
    ["check", "90 90"],  # two instructions
    ["check", "48 8b 05 10 00 00 00 90"],  # an instruction and one more byte
    ["check", "ff"],  # undecodable
    ["check", "ff ff"],  # undecodable, more than one byte
    ["check", "f0"],  # a lone prefix
    ["check", "c3", "--at", "1234"],  # address without 0x
    ["check", "c3", "--tramp", "0x1" + "0" * 16],  # address over 64 bits
    ["check"],  # no HEX
    ["nonsense"],  # no such command
], ids=lambda argv: " ".join(argv) or "(none)")
def test_bad_input(argv):
    assert_one_line_error(*run(*argv))


@pytest.mark.parametrize("argv", [["check", "zz"], ["check", "ff"]], ids=["not-hex", "undecodable"])
def test_bad_input_subprocess(argv):
    p = run_process(*argv)
    assert_one_line_error(p.returncode, p.stdout, p.stderr)


# ---------------------------------------------------------------------------
# corpus run / fetch
# ---------------------------------------------------------------------------


def write_corpus(tmp_path: Path, body: str, name: str = "tiny.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


GOOD = """
    [[entry]]
    id = "t-ret"
    hex = "c3"
    plan = "emulate"
    rule = "ret"
    why = "ret is emulated: pop and jump"

    [[entry]]
    hex = "48 8b 05 10 00 00 00"
    plan = "rewrite"
    random_placements = 5
    why = "a RIP-relative load is rewritten"
"""


def test_corpus_run_ok(tmp_path):
    path = write_corpus(tmp_path, GOOD)
    code, out, err = run("corpus", "run", str(path))
    assert code == cli.EXIT_CLEAN and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("ok") and "t-ret" in lines[0]
    assert lines[1].startswith("ok") and "tiny:1" in lines[1], "an entry without id is named file:index"
    assert lines[-1].startswith("2 entries: 2 ok, 0 missed")
    for v in ("proved", "opaque", "unknown", "rejected", "refuted"):
        assert v in lines[-1]


def test_corpus_run_miss(tmp_path):
    path = write_corpus(tmp_path, """
        [[entry]]
        id = "wrong"
        hex = "fb"
        plan = "copy"
        why = "deliberately wrong: sti is rejected"
    """)
    code, out, _ = run("corpus", "run", str(path))
    assert code == cli.EXIT_FINDINGS
    assert out.startswith("MISS wrong") and "expected copy, got reject" in out


def test_corpus_run_json(tmp_path):
    path = write_corpus(tmp_path, GOOD)
    code, out, _ = run("corpus", "run", "--json", str(path))
    doc = json.loads(out)
    assert code == 0 and doc["summary"]["entries"] == 2 and doc["summary"]["missed"] == 0
    assert [e["id"] for e in doc["entries"]] == ["t-ret", "tiny:1"]
    assert all(c["ok"] for e in doc["entries"] for c in e["checks"])


def test_corpus_run_verdicts(tmp_path):
    path = write_corpus(tmp_path, """
        [[entry]]
        id = "v"
        hex = "74 f0"
        effects = [{op = "branch", cond = "e", taken = "0xffffffff81234652", fallthrough = "0xffffffff81234562"}]
        verdict = "refuted"
        own_verdict = "proved"
        why = "the kprobes rel8 bug, and the project's own plan"
    """)
    code, out, _ = run("corpus", "run", str(path))
    assert code == cli.EXIT_CLEAN, out
    assert "refuted 1" in out and "proved 1" in out


BAD_ENTRIES = [
    ('hex = "zz"\nwhy = "not hex at all here"', "hex"),
    ('hex = "c3"', "missing required key(s) why"),
    ('hex = "c3"\nwhy = "a typo in a key name"\nplann = "copy"', "unknown key(s) plann"),
    ('hex = "c3"\nwhy = "an unknown plan kind"\nplan = "teleport"', "plan"),
    ('hex = "c3"\nwhy = "an unknown verdict name"\nverdict = "maybe"', "verdict"),
    ('hex = "c3"\nwhy = "an unknown rule name"\nrule = "no-such-rule"', "rule"),
    ('hex = "c3"\nwhy = "an address without 0x"\nat = "1234"', "at"),
    ('hex = "c3"\nwhy = "both kinds of foreign relocation"\nreloc = "c3"\neffects = [{op = "jump", to = "0x1"}]',
     "not both"),
    ('hex = "c3"\nwhy = "effects without a jump at the end"\neffects = [{op = "add_rsp", delta = 8}]', "effects"),
    ('hex = "c3"\nwhy = "own verdict without a foreign relocation"\nown_verdict = "proved"', "own_verdict"),
]


@pytest.mark.parametrize("body, says", BAD_ENTRIES, ids=[s for _, s in BAD_ENTRIES])
def test_corpus_bad_entry(tmp_path, body, says):
    path = write_corpus(tmp_path, GOOD + "\n[[entry]]\n" + body + "\n")
    code, out, err = run("corpus", "run", str(path))
    assert_one_line_error(code, out, err)
    assert str(path) in err and "entry 2" in err and says in err


def test_corpus_bad_files(tmp_path):
    for body in ("[[entry]\n", "title = 'no entries'\n", "[[entrie]]\nhex = 'c3'\n"):
        path = write_corpus(tmp_path, body)
        code, out, err = run("corpus", "run", str(path))
        assert_one_line_error(code, out, err)
        assert str(path) in err
    assert_one_line_error(*run("corpus", "run", str(tmp_path / "missing.toml")))


def test_corpus_duplicate_ids(tmp_path):
    a = write_corpus(tmp_path, GOOD, "a.toml")
    b = write_corpus(tmp_path, GOOD, "b.toml")
    code, out, err = run("corpus", "run", str(a), str(b))
    assert_one_line_error(code, out, err)
    assert "t-ret" in err


def test_bundled_corpora_load():
    entries = corpus.load()
    assert {Path(e.path).name for e in entries} >= {"instructions.toml", "known_bugs.toml", "decoder_facts.toml"}
    assert len({e.id for e in entries}) == len(entries)


def test_bundled_corpora_all_met():
    """Every bundled corpus entry meets its expectation, verdicts included (what CI's corpus run checks)."""
    code, out, err = run("corpus", "run")
    assert code == cli.EXIT_CLEAN, "\n".join(line for line in out.splitlines() if not line.startswith("ok"))


def test_corpus_fetch_prints_the_extracted_files(tmp_path):
    """The real fetch (the Debian 6.1 cloud packages are in the download cache after the first
    session), as text and as JSON."""
    code, out, err = run("corpus", "fetch", "debian-6.1-cloud", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["release"] == "6.1.0-53-cloud-amd64"
    for what in ("vmlinux", "vmlinuz", "system_map"):
        assert Path(doc[what]).is_file()
    assert all(len(h) == 64 for h in doc["sha256"].values())
    code, out, err = run("corpus", "fetch", "debian-6.1-cloud")
    assert code == 0 and out.startswith("debian-6.1-cloud (6.1.0-53-cloud-amd64)")



def test_corpus_fetch_unknown_name(tmp_path):
    assert_one_line_error(*run("corpus", "fetch", "no-such-kernel", "--cache", str(tmp_path)))


def test_a_location_without_an_image_or_a_cached_kernel_says_how_to_give_one(tmp_path, monkeypatch):
    """Without --image a location is read in the default kernel only when the cache holds it already: a
    typo does not start a download (issue 43: this said 'HEX is not hex')."""
    monkeypatch.setenv("RELOCVERIFY_CACHE", str(tmp_path))
    code, out, err = run("check", "vfs_read+0x3")
    assert_one_line_error(code, out, err)
    assert "--image" in err and "corpus fetch" in err
